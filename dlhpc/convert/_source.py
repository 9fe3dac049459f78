"""Reading the input file: YAML data, the line of a key, typed getters that collect
``file:line: field: message`` issues instead of raising one at a time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dlhpc.config.lines import key_line
from dlhpc.errors import ConfigError, ConfigIssue

__all__ = ["Source", "read_source"]

T = TypeVar("T")
MAX_BYTES = 4 * 1024 * 1024


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    names = {int: "an integer", float: "a number", str: "a string", list: "a list"}
    names[dict] = "a mapping"
    return names.get(type(value), "null" if value is None else type(value).__name__)


class Source:
    """A parsed Determined config: ``data`` and where each key is."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self.issues: list[ConfigIssue] = []
        self.notes: list[str] = []  # what was not translated, one line each

    def line(self, keys: tuple[str, ...]) -> int | None:
        for n in range(len(keys), 0, -1):  # the key, else its nearest parent
            line = key_line(self.path, keys[:n])
            if line is not None:
                return line
        return None

    def error(self, keys: tuple[str, ...], message: str) -> None:
        self.issues.append(ConfigIssue(str(self.path), self.line(keys), ".".join(keys), message))

    def note(self, keys: tuple[str, ...], message: str) -> None:
        line = self.line(keys)
        where = f"line {line}: " if line is not None else ""
        self.notes.append(f"{where}{'.'.join(keys)}: {message}")

    def typed(
        self, keys: tuple[str, ...], value: Any, check: Callable[[Any], bool], want: str
    ) -> Any:
        """``value`` if ``check(value)``, else None and an issue ``must be <want>``."""
        if value is None or check(value):
            return value
        shown = repr(value) if isinstance(value, (int, float)) else f"{_kind(value)} ({value!r})"
        self.error(keys, f"must be {want}, got {shown}")
        return None

    def int_at(self, keys: tuple[str, ...], value: Any, min_value: int = 0) -> int | None:
        ok = self.typed(
            keys,
            value,
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= min_value,
            f"an integer >= {min_value}",
        )
        return ok if isinstance(ok, int) else None

    def mapping(self, keys: tuple[str, ...], value: Any) -> dict[str, Any]:
        ok = self.typed(keys, value, lambda v: isinstance(v, dict), "a mapping")
        return ok if isinstance(ok, dict) else {}

    def raise_issues(self) -> None:
        if self.issues:
            raise ConfigError(sorted(self.issues, key=lambda i: i.line or 0))


def read_source(path: Path) -> Source:
    """Parse ``path`` (a Determined experiment config). Raises ConfigError (exit 2) for
    an unreadable file, a YAML syntax error (with its line) or a top level that is not a
    mapping."""
    label = str(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError([ConfigIssue(label, None, "", f"cannot read: {err.strerror}")]) from None
    if len(raw) > MAX_BYTES:
        raise ConfigError([ConfigIssue(label, None, "", f"larger than {MAX_BYTES} bytes")])
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError([ConfigIssue(label, None, "", f"not UTF-8 text: {err}")]) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        why = f"not valid YAML: {err.problem}"
        if err.context and err.context_mark is not None:
            why += f" ({err.context} (line {err.context_mark.line + 1}))"
        raise ConfigError([ConfigIssue(label, line, "", why)]) from None
    except yaml.YAMLError as err:
        raise ConfigError([ConfigIssue(label, None, "", f"not valid YAML: {err}")]) from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        why = f"must be a mapping of Determined config fields, got {_kind(data)}"
        raise ConfigError([ConfigIssue(label, 1, "", why)])
    return Source(path, data)
