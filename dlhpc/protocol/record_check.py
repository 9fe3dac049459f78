"""What makes an event record acceptable to ingest: the types and ranges of the
fields the login node stores (:mod:`dlhpc.protocol.events` lists the records).

:func:`check_record` raises ``ValueError`` (one line: the field and why) for a
record whose stored fields would not convert, would overflow SQLite's 64-bit
integers or Python's dates, or nest deeper than
:data:`~dlhpc.protocol.safe_read.MAX_DEPTH`; a record of a type ingest does not
store is not looked at. :func:`check_columns` is the same for the columns of a
``metrics`` line (:mod:`dlhpc.protocol.metric_lines`), checked as a whole.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlhpc.protocol.safe_read import MAX_DEPTH, check_depth

__all__ = ["MAX_BYTES", "MAX_STEP", "MAX_TIME", "check_columns", "check_record"]

MAX_STEP = 2**53  # steps are counts a float still tells apart
MAX_TIME = 32503680000.0  # 3000-01-01 in seconds since the epoch: datetime's range
MAX_BYTES = 2**50  # a checkpoint's size in bytes (a PiB): sums of many stay in int64
_MAX_CODE = 2**31  # an exit code
_FLOAT_MAX = 2**1023  # an int past this does not convert to a float


def _is_number(v: Any) -> bool:
    return type(v) is float or (type(v) is int and -_FLOAT_MAX < v < _FLOAT_MAX)


def _count(rec: dict[str, Any], key: str, top: int, required: bool = False) -> None:
    """``rec[key]``: an int in ``0..top``; absent or null unless ``required``."""
    v = rec.get(key)
    if v is None and not required:
        return
    if type(v) is not int or not 0 <= v <= top:
        raise ValueError(f"{key!r} {_show(v)} is not a count in 0..{top}")


def _time(rec: dict[str, Any]) -> None:
    """``rec["time"]``: seconds since the epoch within :data:`MAX_TIME`, or absent."""
    v = rec.get("time")
    if v is not None and not (_is_number(v) and 0 <= v <= MAX_TIME):
        raise ValueError(f"'time' {_show(v)} is not seconds since the epoch")


def _show(v: Any) -> str:
    text = repr(v) if isinstance(v, int | float | str | None) else type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _nested(rec: dict[str, Any]) -> None:
    if not check_depth(rec):
        raise ValueError(f"nested more than {MAX_DEPTH} deep")


def _metric(rec: dict[str, Any]) -> None:
    _count(rec, "step", MAX_STEP, required=True)
    at = rec.get("time")
    if at is not None and not _is_number(at):  # stored as a float, not as a date
        raise ValueError(f"'time' {_show(at)} is not a number")
    metrics = rec.get("metrics", {})
    if not isinstance(metrics, dict):
        raise ValueError(f"'metrics' is a {type(metrics).__name__}, not an object")
    for name, v in metrics.items():
        if v is not None and not _is_number(v):
            raise ValueError(f"metric {_show(name)}: {_show(v)} is not a number")


def _exit(rec: dict[str, Any]) -> None:
    code = rec.get("code", 1)
    if type(code) is not int or not -_MAX_CODE < code < _MAX_CODE:
        raise ValueError(f"'code' {_show(code)} is not an exit code")
    _time(rec)
    for key in ("step", "checkpoint_step"):  # from the progress file: only their difference
        v = rec.get(key)  # is stored, and a value not an int is not used (apply_exit)
        if type(v) is int and abs(v) > MAX_STEP:
            raise ValueError(f"{key!r} {_show(v)} is not within {MAX_STEP} of 0")
    _nested(rec)


def _checkpoint(rec: dict[str, Any]) -> None:
    _count(rec, "step", MAX_STEP)
    _count(rec, "size", MAX_BYTES)
    _time(rec)
    _nested(rec)


def _timed(rec: dict[str, Any]) -> None:
    """``start`` and ``log``: a time; the rest is stored as text."""
    _time(rec)
    _nested(rec)


_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "metric": _metric,
    "start": _timed,
    "log": _timed,
    "exit": _exit,
    "checkpoint": _checkpoint,
    "env": _nested,
    "gpu": _nested,  # telemetry: a bad value is dropped (dlhpc.store._records.gpu_rows)
}


def check_record(rec: Any) -> None:
    """Raise ``ValueError`` (why, in one line) unless ``rec`` is an object whose
    stored fields have usable types and ranges (see the module docstring)."""
    if not isinstance(rec, dict):
        raise ValueError(f"a record is a JSON {type(rec).__name__}, not an object")
    kind = rec.get("type")
    check = _CHECKS.get(kind) if isinstance(kind, str) else None
    if check is not None:
        try:
            check(rec)
        except ValueError as err:
            raise ValueError(f"{kind} record: {err}") from None


def check_columns(steps: list[int]) -> None:
    """Raise ``ValueError`` unless a ``metrics`` line's steps are counts within
    :data:`MAX_STEP` (C loops: min and max; its times and values, int64 and float64
    columns, are stored as floats whatever they are)."""
    if steps and (min(steps) < 0 or max(steps) > MAX_STEP):
        raise ValueError(f"metrics 'step' outside 0..{MAX_STEP}")
