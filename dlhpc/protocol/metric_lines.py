"""``metrics`` lines: many ``metric`` records in one line of an event file.

``ctx.report`` every step makes one ``metric`` record per step; encoding each as
its own JSON object (two float reprs, a dict with sorted keys) would cost the
publishing thread more CPU per record than the step it reports. The harness instead
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
import json
import sys
from array import array
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

from dlhpc.protocol.record_check import check_columns

__all__ = ["MAX_ROWS_PER_LINE", "MetricRow", "encode_rows", "expand"]

MetricRow = tuple[int, int, dict[str, float]]
"""A ``metric`` record as the harness buffers it: ``(step, time_ns, metrics)``, with
``time_ns`` from :func:`time.time_ns` and float values (a tuple, so that a buffer can
hold rows and record dicts side by side)."""

MAX_ROWS_PER_LINE = 128  # a line is encoded in tens of µs, the GIL let go between lines
_SWAP = sys.byteorder != "little"
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)
_name = json.JSONEncoder().encode  # a metric name as JSON text, escaped as json.dumps does


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


def encode_rows(
    rows: list[MetricRow], encode_record: Callable[[dict[str, Any]], str]
) -> Iterator[str]:
    """The lines for ``rows``, in order: one ``metrics`` line per run of consecutive
    rows with the same metric names, at most :data:`MAX_ROWS_PER_LINE` rows each. A
    run whose step or time does not fit in an int64 is given as ``metric`` records,
    one line each by ``encode_record`` (the event file's encoder: sorted keys, which
    the ``metrics`` lines built here follow too)."""
    start = 0
    while start < len(rows):
        chunk = rows[start : start + MAX_ROWS_PER_LINE]
        run, columns = _run_of_same_names(chunk)
        try:
            yield _metrics_line(run, columns)
        except OverflowError:  # a step past int64: the plain records
            for step, time_ns, values in run:
                record = {"type": "metric", "time": time_ns / 1e9, "step": step, "metrics": values}
                yield encode_record(record)
        start += len(run)


def _metrics_line(run: list[MetricRow], columns: dict[str, list[float]]) -> str:
    """The ``metrics`` line of ``run``, written out rather than by a JSON encoder (its
    scan of the base64 text was a third of the publishing thread's CPU): the same text
    as ``json.dumps(record, sort_keys=True)`` and a newline, as base64 needs no escape
    and a name is encoded by :func:`json.dumps`."""
    steps = _pack("q", list(map(_first, run)))
    times = _pack("q", list(map(_second, run)))
    values = ", ".join(f'{_name(k)}: "{_pack("d", columns[k])}"' for k in sorted(columns))
    return (
        f'{{"n": {len(run)}, "step": "{steps}", "time_ns": "{times}", "type": "metrics",'
        f' "values": {{{values}}}}}\n'
    )


def _run_of_same_names(
    chunk: list[MetricRow],
) -> tuple[list[MetricRow], dict[str, list[float]]]:
    """The leading rows of ``chunk`` with the first row's metric names and their
    columns (name -> values, in the first row's name order)."""
    metrics = list(map(_third, chunk))
    names = list(metrics[0])
    try:  # the common case, C loops only: every row has these names and no other
        # (each row has them all, so equal totals mean none has more)
        columns = {k: list(map(itemgetter(k), metrics)) for k in names}
        if sum(map(len, metrics)) == len(names) * len(metrics):
            return chunk, columns
    except KeyError:
        pass
    first = metrics[0].keys()
    end = list(map(first.__eq__, map(dict.keys, metrics))).index(False)
    run, metrics = chunk[:end], metrics[:end]
    return run, {k: list(map(itemgetter(k), metrics)) for k in names}


def expand(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The ``metric`` records a ``metrics`` record stands for, in order; raises
    ``ValueError`` naming ``where`` (the file) if it is malformed or its steps are
    out of range (:func:`~dlhpc.protocol.record_check.check_columns`)."""
    n, values = record.get("n"), record.get("values")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(values, dict):
        raise ValueError(f"{where}: a 'metrics' record needs 'n' (a count) and 'values'")
    steps = _unpack("q", record.get("step"), n, f"{where}: metrics 'step'")
    times = _unpack("q", record.get("time_ns"), n, f"{where}: metrics 'time_ns'")
    check_columns(steps)
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
