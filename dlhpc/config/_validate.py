"""Declarative field checks that collect every problem of a file.

A *check* is a callable ``value -> converted value`` that raises
:class:`Invalid` with a "must be ..., got ..." message. A :class:`Field` adds
a default and whether it is required or may be ``null`` (``null`` then means
"not given"). :func:`read_section` validates one mapping against a table of
fields, reports unknown keys with a "did you mean" and the valid keys, and
always returns a complete :class:`Section` (defaults stand in for bad values),
so callers can go on and report later problems too. :class:`Issues` holds the
problems with their lines; ``Issues.ok(path)`` tells whether a value is
trustworthy before a cross-field check uses it.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dlhpc.config._yaml import KeyPath
from dlhpc.errors import ConfigIssue

__all__ = [
    "Check",
    "Field",
    "Invalid",
    "Issues",
    "Section",
    "boolean",
    "choice",
    "describe",
    "did_you_mean",
    "fmt_path",
    "integer",
    "number",
    "read_section",
    "string",
    "string_list",
    "unknown_key",
]

Check = Callable[[Any], Any]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")


class Invalid(Exception):
    """A value failed a check. ``problems``: (sub-path below the field, message)."""

    def __init__(self, message: str, sub: KeyPath = ()) -> None:
        super().__init__(message)
        self.problems: list[tuple[KeyPath, str]] = [(sub, message)]

    @classmethod
    def merge(cls, errors: list[Invalid]) -> Invalid:
        out = cls(errors[0].problems[0][1], errors[0].problems[0][0])
        out.problems = [p for e in errors for p in e.problems]
        return out


def describe(value: Any) -> str:
    """A short, safe rendering of a user value for messages (never huge)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else "a huge integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:60] + "...")
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def fmt_path(path: KeyPath) -> str:
    """``("a", "b", 0, "c")`` -> ``"a.b[0].c"``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


class Issues:
    """Problems found in one file (``file``: its name as given; ``lines``: key lines)."""

    def __init__(self, file: str, lines: Mapping[KeyPath, int]) -> None:
        self.file = file
        self.lines = lines
        self.issues: list[ConfigIssue] = []
        self._bad: set[KeyPath] = set()

    def line(self, path: KeyPath) -> int | None:
        """Line of ``path``, or of its nearest ancestor that is in the file."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.lines:
                return self.lines[path[:n]]
        return None

    def add(self, path: KeyPath, message: str) -> None:
        self._bad.add(path)
        self.issues.append(ConfigIssue(self.file, self.line(path), fmt_path(path), message))

    def ok(self, *paths: KeyPath) -> bool:
        """True when no problem was reported at, above or below any of ``paths``."""
        return not any(
            bad[: len(p)] == p or p[: len(bad)] == bad for p in paths for bad in self._bad
        )


@dataclass(frozen=True)
class Field:
    """One key of a section. ``nullable``: ``null`` means "not given"."""

    check: Check
    default: Any = None
    required: bool = False
    nullable: bool = False


class Section(dict[str, Any]):
    """Validated values of a section, defaults filled in; ``given``: keys in the file."""

    given: set[str]


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the closest of ``options``, or ``""``."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.7)
    return f"did you mean {close[0]!r}? " if close else ""


def unknown_key(key: str, valid: Iterable[str]) -> str:
    """Message for an unknown key, with a "did you mean" when one is close."""
    names = sorted(valid)
    return f"unknown key; {did_you_mean(key, names)}(valid: {', '.join(names)})"


def read_section(issues: Issues, value: Any, path: KeyPath, fields: Mapping[str, Field]) -> Section:
    """Validate the mapping ``value`` at ``path``; ``null`` counts as an empty mapping."""
    section = Section()
    section.given = set()
    if value is None:
        value = {}
    if not isinstance(value, dict):
        issues.add(path, f"must be a mapping of 'key: value' settings, got {describe(value)}")
        value = {}
    for key in value:
        if key not in fields:
            issues.add((*path, key), unknown_key(key, fields))
    for name, spec in fields.items():
        here = (*path, name)
        raw = value.get(name)
        if name not in value or (raw is None and spec.nullable):
            if spec.required:
                issues.add(here, "required field missing")
            section[name] = copy.deepcopy(spec.default)  # never share a mutable default
            continue
        section.given.add(name)
        try:
            section[name] = spec.check(raw)
        except Invalid as exc:
            for sub, message in exc.problems:
                issues.add((*here, *sub), message)
            section[name] = copy.deepcopy(spec.default)
    return section


# ---------------------------------------------------------------- checks ---


def _quote_hint(value: Any) -> str:
    return " (put it in quotes)" if isinstance(value, (int, float, bool)) else ""


def integer(min: int | None = None, max: int | None = None, *, cap: int | None = None) -> Check:
    """An ``int`` (not a bool, not a string) in ``[min, max]``.

    ``cap``: a sanity limit above ``min`` (huge values are mistakes, and must
    not reach SQLite's 64-bit integers or sbatch), reported on its own.
    """
    if min is not None and max is not None:
        what = f"must be an integer between {min} and {max}"
    elif min is not None:
        what = f"must be an integer >= {min}"
    elif max is not None:
        what = f"must be an integer <= {max}"
    else:
        what = "must be an integer"

    def check(value: Any) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or (min is not None and value < min) or (max is not None and value > max):
            raise Invalid(f"{what}, got {describe(value)}")
        if cap is not None and value > cap:
            raise Invalid(f"must be at most {cap:,}, got {describe(value)}")
        return int(value)

    return check


def number(*, positive: bool = False) -> Check:
    """A finite ``int`` or ``float`` (not a bool), as ``float``."""
    what = "must be a positive number" if positive else "must be a finite number"

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(f"{what}, got {describe(value)}")
        try:
            result = float(value)
        except OverflowError:
            raise Invalid(f"{what}, got {describe(value)}") from None
        if not math.isfinite(result) or (positive and result <= 0):
            raise Invalid(f"{what}, got {describe(value)}")
        return result

    return check


def boolean(value: Any) -> bool:
    """A real boolean (``true``/``false``), not a string or a number."""
    if not isinstance(value, bool):
        raise Invalid(f"must be a boolean (true or false), got {describe(value)}")
    return value


def string(
    *,
    nonempty: bool = False,
    token: bool = False,
    single_line: bool = False,
    pattern: re.Pattern[str] | None = None,
    what: str | None = None,
) -> Check:
    """A ``str``; ``token``: no whitespace or control characters; never a NUL."""
    if what is None:
        what = (
            "must be a single word (no spaces)"
            if token
            else ("must be a non-empty string" if nonempty else "must be a string")
        )

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise Invalid(f"{what}, got {describe(value)}{_quote_hint(value)}")
        if "\0" in value:
            raise Invalid("must not contain a NUL character")
        bad = (
            (nonempty and not value.strip())
            or (token and (not value or _SPACE_OR_CONTROL.search(value) is not None))
            or (single_line and _CONTROL.search(value.replace("\t", " ")) is not None)
            or (pattern is not None and not pattern.fullmatch(value))
        )
        if bad:
            raise Invalid(f"{what}, got {describe(value)}")
        return value

    return check


def choice(*values: str, normalize: Callable[[str], str] | None = None, hint: str = "") -> Check:
    """One of ``values`` (after ``normalize``, e.g. upper-casing)."""
    what = f"must be one of {', '.join(values)}{hint}"

    def check(value: Any) -> str:
        if isinstance(value, str):
            candidate = normalize(value) if normalize else value
            if candidate in values:
                return candidate
        raise Invalid(f"{what}, got {describe(value)}")

    return check


def string_list(item: Check) -> Check:
    """A list whose items pass ``item``; problems are reported per item."""

    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise Invalid(f"must be a list, got {describe(value)}")
        out: list[Any] = []
        errors: list[Invalid] = []
        for i, entry in enumerate(value):
            try:
                out.append(item(entry))
            except Invalid as exc:
                exc.problems = [((i, *sub), msg) for sub, msg in exc.problems]
                errors.append(exc)
        if errors:
            raise Invalid.merge(errors)
        return tuple(out)

    return check
