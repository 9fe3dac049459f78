"""Metrics of a plain script: stdout lines matching a pattern, and a JSON-lines file.

Both sources give ``(step, {name: value})`` pairs; nothing here reports them (the
runner does, on its one thread). Contracts:

* :class:`LinePattern`: ``re.search`` on each stdout line; the ``step`` group is an
  int, every other named group that matched is a float metric. A line whose step
  is not an int, or whose every metric fails to read as a float, gives nothing and
  a note (the first few only).
* :class:`JsonlTail`: reads the lines appended to the file since the last call;
  only complete lines (ending in a newline) are read, a partial last line waits.
  Each line is a JSON object with ``step`` (an int >= 0) and numeric values
  (int or float, not bool); other keys are skipped with a note.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["JsonlTail", "LinePattern", "Metrics"]

Metrics = tuple[int, dict[str, float]]
Note = Callable[[str], None]
_MAX_NOTES = 5  # per source: a broken format would otherwise flood the trial's log


class _Notes:
    def __init__(self, note: Note, source: str) -> None:
        self.note = note
        self.source = source
        self.count = 0

    def __call__(self, message: str) -> None:
        self.count += 1
        if self.count <= _MAX_NOTES:
            more = " (further such notes are not shown)" if self.count == _MAX_NOTES else ""
            self.note(f"{self.source}: {message}{more}")


def _step(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


class LinePattern:
    """Metrics from stdout lines that match ``pattern`` (named groups)."""

    def __init__(self, pattern: str, note: Note) -> None:
        self.regex = re.compile(pattern)
        self.notes = _Notes(note, "metrics pattern")

    def match(self, line: str) -> Metrics | None:
        m = self.regex.search(line)
        if m is None:
            return None
        groups = m.groupdict()
        raw = groups.pop("step", None)
        step = _step(raw)
        if step is None:
            self.notes(f"step {raw!r} is not an int >= 0 in {line.strip()!r}")
            return None
        metrics: dict[str, float] = {}
        for name, text in groups.items():
            if text is None:
                continue  # an optional group that did not take part
            try:
                metrics[name] = float(text)
            except ValueError:
                self.notes(f"{name}={text!r} is not a number in {line.strip()!r}")
        return (step, metrics) if metrics else None


class JsonlTail:
    """The complete lines appended to a JSON-lines metrics file since the last read."""

    def __init__(self, path: Path, note: Note) -> None:
        self.path = path
        self.offset = 0
        self.notes = _Notes(note, str(path))

    def read(self) -> list[Metrics]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            if raw.strip():
                parsed = self._parse(raw)
                if parsed is not None:
                    out.append(parsed)
        return out

    def _parse(self, raw: bytes) -> Metrics | None:
        try:
            obj = json.loads(raw)
        except ValueError:
            self.notes(f"not JSON: {raw[:80]!r}")
            return None
        if not isinstance(obj, dict):
            self.notes(f"not a JSON object: {raw[:80]!r}")
            return None
        step = obj.pop("step", None)
        if _step(step) is None or isinstance(step, str):
            self.notes(f"'step' must be an int >= 0, got {step!r}")
            return None
        metrics: dict[str, float] = {}
        for name, value in obj.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[name] = float(value)  # json reads NaN and Infinity too
            else:
                self.notes(f"{name}={value!r} is not a number; skipped")
        return (int(step), metrics) if metrics else None
