"""The ``deepspeed`` section: an inline mapping or a JSON/YAML file.

Contract of :func:`read_deepspeed`: problems go to ``issues`` (those inside
the named file are appended with that file's name and line), the result is
``None`` when the section is absent or bad; it only reads the named file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlhpc.config import _fields as F
from dlhpc.config._validate import Field, Invalid, Issues, describe, read_section
from dlhpc.config._yaml import parse_yaml_text, read_text
from dlhpc.config.schema import DeepSpeedConfig
from dlhpc.errors import ConfigError, ConfigIssue

__all__ = ["read_deepspeed"]


def _passthrough(value: Any) -> Any:
    return value


def read_deepspeed(
    issues: Issues, value: Any, base: Path, env: Mapping[str, str]
) -> DeepSpeedConfig | None:
    """Validate ``deepspeed`` (``None``: not given); a file path is relative to ``base``."""
    path = ("deepspeed",)
    if value is None:
        return None
    s = read_section(issues, value, path, {"config": Field(_passthrough, required=True)})
    config = s["config"]
    here = (*path, "config")
    if config is None:
        return None  # missing: already reported
    if isinstance(config, dict):
        try:
            return DeepSpeedConfig(config=F.json_value(config))
        except Invalid as exc:
            issues.add(here, str(exc))
            return None
    try:
        file = F.path(base, env)(config)
    except Invalid as exc:
        issues.add(here, f"must be a mapping or a path to a JSON/YAML file: {exc}")
        return None
    try:
        data = _load_mapping(file, str(file))
        return DeepSpeedConfig(config=F.json_value(data), path=file)
    except Invalid as exc:
        issues.add(here, f"{file}: {exc}")
    except ConfigError as exc:
        issues.add(here, f"cannot use {file} (see below)")
        issues.issues.extend(exc.issues)
    return None


def _load_mapping(file: Path, label: str) -> dict[str, Any]:
    """A JSON (``.json``) or YAML file whose top level is a mapping."""
    text = read_text(file, label)
    if file.suffix.lower() != ".json":
        data: Any = parse_yaml_text(text, label).data
        return dict(data)

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, val in pairs:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = val
        return out

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        issue = ConfigIssue(label, exc.lineno, "", f"invalid JSON: {exc.msg}")
        raise ConfigError([issue]) from None
    except (ValueError, RecursionError) as exc:
        message = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise ConfigError([ConfigIssue(label, None, "", f"invalid JSON: {message}")]) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [ConfigIssue(label, 1, "", f"top level must be a mapping, got {describe(data)}")]
        )
    return data
