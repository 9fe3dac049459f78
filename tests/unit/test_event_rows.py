"""Metric rows: the harness writes consecutive ``metric`` records as
``metrics`` lines of packed columns; the reader gives back the same records as the
old per-record lines, and files in either format ingest to the same metric rows."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from dlhpc.protocol import EventWriter, read_event_batches
from dlhpc.protocol.events import MetricRow, encode_records
from dlhpc.protocol.metric_lines import MAX_ROWS_PER_LINE
from dlhpc.store import Metric, Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._db import exp_and_trial

_T0 = 1_764_139_000_123_456_789  # ns since the epoch
_RUN = MAX_ROWS_PER_LINE + 5  # one name: two lines
_N_METRICS = _RUN + 3 + 3 + 1  # values in _mixed()
_HOSTILE = {'a"}, {"rows": ': float("nan"), "é\\\n": float("-inf"), "b": 1e300}


def _mixed() -> list[dict[str, Any] | MetricRow]:
    """A start record, rows (more than one line's worth), a log, rows whose metric
    names change from one to the next, a checkpoint."""
    rows: list[dict[str, Any] | MetricRow] = [{"type": "start", "time": 1.5, "host": "n1"}]
    rows += [(s, _T0 + s * 1000, {"m": s / 3}) for s in range(_RUN)]
    rows.append({"type": "log", "time": 2.0, "level": "info", "message": "half"})
    rows += [(7, _T0, _HOSTILE), (7, _T0, {**_HOSTILE}), (8, _T0 + 1, {}), (2**40, -1, {"m": 0.0})]
    rows.append({"type": "checkpoint", "time": 3.0, "step": 8, "path": "p", "size": 1})
    return rows


def _as_records(mixed: list[dict[str, Any] | MetricRow]) -> list[dict[str, Any]]:
    """What the old code buffered for the same reports: one dict per record."""
    return [
        r
        if isinstance(r, dict)
        else {"type": "metric", "time": r[1] / 1e9, "step": r[0], "metrics": r[2]}
        for r in mixed
    ]


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Equal records, NaN equal to NaN (json text of both, sorted)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_rows_are_written_as_metrics_lines_and_read_back_as_metric_records(
    tmp_path: Path,
) -> None:
    mixed = _mixed()
    path = EventWriter(tmp_path, "user-r0").publish(mixed)
    assert path is not None
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    # start, a full line of rows, the rest of the run, log, a line per run of the same
    # names (the two hostile rows, {}, "m"), checkpoint
    types = ["start", "metrics", "metrics", "log", "metrics", "metrics", "metrics", "checkpoint"]
    assert [x["type"] for x in lines] == types
    assert [x["n"] for x in lines if x["type"] == "metrics"] == [MAX_ROWS_PER_LINE, 5, 2, 1, 1]
    assert "1e+300" not in path.read_text(encoding="utf-8")  # values packed, not formatted
    (batch,) = read_event_batches(tmp_path)
    assert _same(batch.records, _as_records(mixed))
    hostile = batch.records[-5]["metrics"]
    assert math.isnan(hostile['a"}, {"rows": ']) and hostile["é\\\n"] == float("-inf")
    assert batch.records[-5]["time"] == _T0 / 1e9  # ns -> s, as the old records
    assert batch.records[-2]["step"] == 2**40 and batch.records[-2]["time"] == -1e-9


def test_an_old_per_record_file_reads_as_before(tmp_path: Path) -> None:
    """A file of one line per record (as the code before rows wrote it, by hand here,
    not through encode_records) reads to the same records as the rows' file."""
    mixed = _mixed()
    old = _as_records(mixed)
    body = "".join(json.dumps(r, sort_keys=True, allow_nan=True) + "\n" for r in old)
    (tmp_path / "user-r0-00000000.jsonl").write_text(body, encoding="utf-8")
    EventWriter(tmp_path, "user-r0").publish(mixed)  # the next file: rows
    old_batch, new_batch = read_event_batches(tmp_path)
    assert old_batch.name == "user-r0-00000000.jsonl"
    assert "metrics" not in {json.loads(x)["type"] for x in body.splitlines()}
    assert _same(old_batch.records, old) and _same(new_batch.records, old)


def test_encode_records_of_dicts_only_is_one_line_each(tmp_path: Path) -> None:
    old = _as_records(_mixed())
    lines = list(encode_records(old))
    assert lines == [json.dumps(r, sort_keys=True, allow_nan=True) + "\n" for r in old]


_ONE = "AQAAAAAAAAA="  # int64 1, little-endian, base64
_TWO = "AQAAAAAAAAACAAAAAAAAAA=="  # int64 1, 2


def test_a_step_past_int64_is_written_as_plain_records(tmp_path: Path) -> None:
    mixed: list[dict[str, Any] | MetricRow] = [(2**63, 5, {"m": 1.0}), (1, 6, {"m": 2.0})]
    lines = [json.loads(x) for x in encode_records(mixed)]
    assert [x["type"] for x in lines] == ["metric", "metric"]
    assert _same(lines, _as_records(mixed))
    EventWriter(tmp_path, "user-r0").publish(mixed)
    # no stored step is past MAX_STEP (SQLite's INTEGER is 64-bit): the reader refuses it
    (batch,) = read_event_batches(tmp_path)
    assert batch.records == []
    assert batch.problem.startswith("line 1: metric record: 'step' 9223372036854775808 is not")


def _line(**fields: Any) -> str:
    return json.dumps({"type": "metrics", **fields})


@pytest.mark.parametrize(
    "line",
    [
        _line(),
        _line(n=1, values={}),
        _line(n=True, step=_ONE, time_ns=_ONE, values={}),
        _line(n=2, step=_ONE, time_ns=_TWO, values={}),
        _line(n=1, step=_ONE, time_ns=_ONE, values={"m": "x"}),
        _line(n=1, step=_ONE, time_ns=_ONE, values={"m": 1.0}),
    ],
)
def test_a_malformed_metrics_line_is_refused_naming_the_file(tmp_path: Path, line: str) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "user-r0-00000000.jsonl").write_text(
        _line(n=1, step=_ONE, time_ns=_ONE, values={"m": _ONE}) + "\n", encoding="utf-8"
    )
    (batch,) = read_event_batches(good)  # the well-formed line, for contrast
    assert batch.records == [{"type": "metric", "time": 1e-9, "step": 1, "metrics": {"m": 5e-324}}]
    (tmp_path / "user-r0-00000000.jsonl").write_text(line + "\n", encoding="utf-8")
    (batch,) = read_event_batches(tmp_path)  # refused, not raised: ingest quarantines it
    assert batch.name == "user-r0-00000000.jsonl"
    assert batch.records == []
    assert batch.problem.startswith("line 1: user-r0-00000000.jsonl: ")
    assert not batch.retry


def test_both_formats_ingest_to_the_same_metric_rows(tmp_path: Path) -> None:
    mixed = _mixed()
    got = []
    for fmt in ("old", "rows"):
        store = Store(tmp_path / fmt / "home")
        tid = exp_and_trial(store, tmp_path / fmt)
        adir = tmp_path / fmt / "t" / "attempts" / "5.r0"
        writer = EventWriter(adir, "user-r0")
        writer.publish(_as_records(mixed) if fmt == "old" else mixed)
        with store.write() as s:
            t = s.get(Trial, tid)
            assert t is not None
            assert ingest_attempt(s, t, adir, utcnow()).metrics == _N_METRICS
        with store.read() as s:
            got.append(
                s.execute(
                    select(Metric.step, Metric.name, Metric.value, Metric.time).order_by(
                        Metric.step, Metric.name
                    )
                ).all()
            )
        store.close()
    # the second hostile row re-reports step 7's names: one row each is kept
    assert got[0] == got[1] and len(got[0]) == _N_METRICS - len(_HOSTILE)


def test_rows_are_encoded_a_line_at_a_time() -> None:
    """The publishing thread lets go of the GIL after each line: a line must not wait
    for the rows after it (a batch of 10,000 rows would hold the GIL for all of them)."""

    def rows() -> Iterator[MetricRow]:
        for i in range(MAX_ROWS_PER_LINE):
            yield (i, i, {"m": 1.0})
        raise AssertionError("read past the first line before yielding it")

    first = json.loads(next(encode_records(rows())))
    assert first["type"] == "metrics" and first["n"] == MAX_ROWS_PER_LINE


def test_a_metrics_line_is_the_text_json_dumps_gives_its_record() -> None:
    """The ``metrics`` line is written out by hand (cheaper than the JSON
    encoder): it must be the very text of ``json.dumps(record, sort_keys=True)``,
    hostile metric names and non-finite values included, so that nothing reading the
    files can tell the two ways apart."""
    rows: list[dict[str, Any] | MetricRow] = [
        (s, _T0 + s, {**_HOSTILE, "z": s / 7, "\u2603": -0.0}) for s in range(5)
    ]
    lines = list(encode_records(rows))
    assert len(lines) == 1 and lines[0].endswith("}\n")
    record = json.loads(lines[0])
    assert record["type"] == "metrics" and record["n"] == 5
    assert lines[0] == json.dumps(record, sort_keys=True, allow_nan=True) + "\n"


def test_rows_with_other_names_end_a_run_wherever_they_are() -> None:
    """The run of one set of names ends at the first row with a name more, a name
    less or other names (the fast check counts names; the slow one finds the row)."""
    base = {"a": 1.0, "b": 2.0}
    for odd in ({"a": 1.0}, {"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, "c": 2.0}):
        for at in (1, 64, MAX_ROWS_PER_LINE - 1):
            rows: list[dict[str, Any] | MetricRow] = [(s, s, dict(base)) for s in range(at)]
            rows += [(at, at, odd), (at + 1, at + 1, dict(base))]
            got = [json.loads(line)["n"] for line in encode_records(rows)]
            assert got == [at, 1, 1], (odd, at, got)
    same_names_other_order = [(0, 0, {"a": 1.0, "b": 2.0}), (1, 1, {"b": 3.0, "a": 4.0})]
    (line,) = list(encode_records(same_names_other_order))
    assert json.loads(line)["n"] == 2
