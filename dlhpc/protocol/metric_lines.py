"""``metrics`` lines: many ``metric`` records in one line of an event file.

``ctx.report`` every step makes one ``metric`` record per step; encoding each as
its own JSON object (two float reprs, a dict with sorted keys) cost the publishing
thread 7-8 µs of CPU per record on a loaded machine (issue 16). The harness instead
buffers rows (:data:`MetricRow`) and writes each run of consecutive rows with the
same metric names as one line, its columns packed as little-endian binary arrays
in base64 (a C loop each, no float formatting)::

    {"type": "metrics", "n": N, "step": B64(int64 x N), "time_ns": B64(int64 x N),
     "values": {name: B64(float64 x N), ...}}

``time_ns`` is nanoseconds since the epoch; values keep their exact bits (NaN and
infinities included). :func:`expand` turns such a line back into the ``metric``
records it stands for (``time`` in seconds, as :func:`time.time` gives), so a reader
sees the same records whichever way they were written. Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

__all__ = ["MAX_ROWS_PER_LINE", "MetricRow", "encode_rows", "expand"]

MetricRow = tuple[int, int, dict[str, float]]
"""A ``metric`` record as the harness buffers it: ``(step, time_ns, metrics)``, with
``time_ns`` from :func:`time.time_ns` and float values (a tuple, so that a buffer can
hold rows and record dicts side by side)."""

MAX_ROWS_PER_LINE = 128  # a line is encoded in tens of µs, the GIL let go between lines
_SWAP = sys.byteorder != "little"
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


def _pack(typecode: str, values: list[Any]) -> str:
    packed = array(typecode, values)
    if _SWAP:
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def _unpack(typecode: str, text: object, n: int, where: str) -> list[Any]:
    if not isinstance(text, str):
        raise ValueError(f"{where}: not a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as err:
        raise ValueError(f"{where}: {err}") from None
    unpacked = array(typecode)
    if len(raw) != n * unpacked.itemsize:
        raise ValueError(f"{where}: {len(raw)} bytes for {n} values")
    unpacked.frombytes(raw)
    if _SWAP:
        unpacked.byteswap()
    return unpacked.tolist()


def encode_rows(rows: list[MetricRow]) -> Iterator[dict[str, Any]]:
    """The ``metrics`` records for ``rows``, in order: one per run of consecutive
    rows with the same metric names, at most :data:`MAX_ROWS_PER_LINE` rows each. A
    run whose step or time does not fit in an int64 is given as ``metric`` records."""
    start = 0
    while start < len(rows):
        chunk = rows[start : start + MAX_ROWS_PER_LINE]
        metrics = list(map(_third, chunk))
        names = metrics[0].keys()
        same = list(map(names.__eq__, map(dict.keys, metrics)))  # C loops, not bytecode
        end = same.index(False) if False in same else len(chunk)
        run, metrics = chunk[:end], metrics[:end]
        try:
            yield {
                "type": "metrics",
                "n": end,
                "step": _pack("q", list(map(_first, run))),
                "time_ns": _pack("q", list(map(_second, run))),
                "values": {k: _pack("d", list(map(itemgetter(k), metrics))) for k in names},
            }
        except OverflowError:  # a step past int64: the plain records
            for step, time_ns, values in run:
                yield {"type": "metric", "time": time_ns / 1e9, "step": step, "metrics": values}
        start += end


def expand(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The ``metric`` records a ``metrics`` record stands for, in order; raises
    ``ValueError`` naming ``where`` (the file) if it is malformed."""
    n, values = record.get("n"), record.get("values")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(values, dict):
        raise ValueError(f"{where}: a 'metrics' record needs 'n' (a count) and 'values'")
    steps = _unpack("q", record.get("step"), n, f"{where}: metrics 'step'")
    times = _unpack("q", record.get("time_ns"), n, f"{where}: metrics 'time_ns'")
    columns = {str(k): _unpack("d", v, n, f"{where}: metrics {k!r}") for k, v in values.items()}
    return [
        {
            "type": "metric",
            "time": times[i] / 1e9,
            "step": steps[i],
            "metrics": {k: column[i] for k, column in columns.items()},
        }
        for i in range(n)
    ]
