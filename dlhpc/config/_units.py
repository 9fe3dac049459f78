"""Slurm time limits and short durations.

Both parsers are pure, take a ``str`` or a non-negative ``int`` (YAML gives
``time: 90`` as an int) and raise :class:`ValueError` whose message is a
complete "must be ..., got ..." phrase, ready to follow a field name.
"""

from __future__ import annotations

import re
from typing import Any, Literal, overload

__all__ = ["SLURM_TIME_FORMATS", "format_minutes", "parse_duration_s", "parse_slurm_time"]

SLURM_TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_NUM = re.compile(r"[0-9]{1,9}")  # ASCII digits only (int() would take any Unicode digit)
_DURATION = re.compile(r"([0-9]{1,9})([smh]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600}
_MAX_INT = 10**9


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**18 else "a huge integer"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def _field(text: str, what: str, limit: int | None) -> int:
    if not _NUM.fullmatch(text):
        raise ValueError(what)
    n = int(text)
    if limit is not None and n >= limit:
        raise ValueError(what)
    return n


def _whole(value: object, what: str) -> int:
    """``value``, a number given as an int (not a bool), in ``[0, _MAX_INT)``; else
    ``ValueError(what)``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_INT:
        raise ValueError(what)
    return value


@overload
def parse_slurm_time(value: str | int, *, allow_unlimited: Literal[False] = False) -> int: ...
@overload
def parse_slurm_time(value: str | int, *, allow_unlimited: Literal[True]) -> int | None: ...
def parse_slurm_time(value: str | int, *, allow_unlimited: bool = False) -> int | None:
    """Minutes in a Slurm time limit, seconds rounded up (as Slurm does).

    Accepts ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS`` and a bare int (minutes). ``UNLIMITED``/``INFINITE``
    give ``None``, only when ``allow_unlimited`` (site ``max_time``).
    Seconds and minutes after a larger unit must be < 60, hours after days < 24.
    """
    what = f"must be a Slurm time ({SLURM_TIME_FORMATS}), got {_show(value)}"
    if not isinstance(value, str):
        return _whole(value, what)
    text = value.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        if allow_unlimited:
            return None
        raise ValueError(f"must be a finite Slurm time ({SLURM_TIME_FORMATS}), got {_show(value)}")
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = _field(day_text, what, None)
        parts = text.split(":")
        if len(parts) > 3:
            raise ValueError(what)
        hours = _field(parts[0], what, 24)
        minutes = _field(parts[1], what, 60) if len(parts) > 1 else 0
        seconds = _field(parts[2], what, 60) if len(parts) > 2 else 0
    else:
        parts = text.split(":")
        if len(parts) == 1:
            hours, minutes, seconds = 0, _field(parts[0], what, None), 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, _field(parts[0], what, None), _field(parts[1], what, 60)
        elif len(parts) == 3:
            hours = _field(parts[0], what, None)
            minutes, seconds = _field(parts[1], what, 60), _field(parts[2], what, 60)
        else:
            raise ValueError(what)
    total = days * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if total >= _MAX_INT:
        raise ValueError(what)
    return total


def parse_duration_s(value: str | int) -> int:
    """Seconds in a short duration: ``"120s"``, ``"2m"``, ``"1h"``, ``"90"`` or an int."""
    what = f"must be a duration like '120s', '2m', '1h' or a number of seconds, got {_show(value)}"
    if not isinstance(value, str):
        return _whole(value, what)
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        raise ValueError(what)
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def format_minutes(minutes: int) -> str:
    """``minutes`` as Slurm's ``D-HH:MM:SS`` (``HH:MM:SS`` under a day)."""
    days, rest = divmod(minutes, 1440)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text
