"""Ingest reads a job's event files a line at a time, with a bound per line, and
writes their rows every so many: what a long file costs in memory does not grow with
its length. Peak memory (tracemalloc) of ingesting 12,000 metric lines with rows
written every 1,000 (read whole, such a file took about 1 KB a line: 12 MB;
tracemalloc makes each row slow, hence not more lines), and of a file whose one
line is 40 MB (refused after the line bound, never read whole)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dlhpc.protocol import attempt_dir
from dlhpc.protocol.events import LINE_LIMIT
from dlhpc.store import IngestedFile, Metric, Store, Trial, ingest, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._db import exp_and_trial

MiB = 2**20


def _peak(run: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _ingest(store: Store, tid: int, adir: Path) -> None:
    with store.write() as s:
        trial = s.get(Trial, tid)
        assert trial is not None
        ingest_attempt(s, trial, adir, utcnow())


def test_metric_lines_are_ingested_in_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest, "_SPILL_ROWS", 1_000)
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    adir = attempt_dir(tmp_path / "t", "1_0.r0")
    adir.mkdir(parents=True)
    lines = 12_000
    with open(adir / "user-r0-00000000.jsonl", "w") as f:
        for step in range(lines):
            f.write(f'{{"type": "metric", "time": 1.5, "step": {step}, "metrics": {{"x": 0.5}}}}\n')
    size = (adir / "user-r0-00000000.jsonl").stat().st_size
    peak = _peak(lambda: _ingest(store, tid, adir))
    with store.read() as s:
        assert s.scalar(select(func.count()).select_from(Metric)) == lines
        assert s.scalar(select(IngestedFile.records)) == lines
    # held whole, the records and their rows took about 12 MB (14 times the file)
    assert peak < 4 * MiB, (peak, size)
    store.close()


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    adir = attempt_dir(tmp_path / "t", "1_0.r0")
    adir.mkdir(parents=True)
    with open(adir / "user-r0-00000000.jsonl", "w") as f:
        f.write('{"type": "log", "message": "' + "a" * (40 * MiB) + '"}\n')
    peak = _peak(lambda: _ingest(store, tid, adir))
    with store.read() as s:
        assert s.scalar(select(IngestedFile.records)) == 0  # quarantined
        trial = s.get(Trial, tid)
        assert trial is not None and f"over {LINE_LIMIT} bytes" in trial.error
    assert peak < 4 * LINE_LIMIT, peak
    store.close()
