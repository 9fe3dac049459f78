"""Where a key is in a config file, for errors found after loading (file:line).

Checks that need the cluster (its partitions, accounts, limits) run after the file
loaded; they name the line of the key they judge with :func:`key_line`.
"""

from __future__ import annotations

from pathlib import Path

from dlhpc.config._yaml import read_yaml_file
from dlhpc.errors import ConfigError, ConfigIssue

__all__ = ["key_issue", "key_line"]


def key_line(path: Path, keys: tuple[str, ...]) -> int | None:
    """The line of ``keys`` (e.g. ``("resources", "time")``) in the YAML file ``path``;
    None when the file does not set it or no longer parses."""
    try:
        return read_yaml_file(path, str(path)).lines.get(keys)
    except (ConfigError, OSError):
        return None


def key_issue(path: Path, keys: tuple[str, ...], message: str) -> ConfigIssue:
    """A :class:`~dlhpc.errors.ConfigIssue` at the line of ``keys`` in ``path``."""
    return ConfigIssue(str(path), key_line(path, keys), ".".join(keys), message)
