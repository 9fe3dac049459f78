"""An event file is applied whole or not at all, even when its job rewrites it while
ingest reads it: the file is read once, through one descriptor, and the first line
that fails undoes what the lines before it implied (rows held or already written in a
savepoint, the attempt's facts) and quarantines the file. The files before it stay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from dlhpc.protocol import attempt_dir, events, safe_read
from dlhpc.store import Attempt, IngestedFile, Metric, Store, Trial, ingest, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._db import exp_and_trial

_BAD_LINE = 2_000  # of the rewritten file: far past what a read buffer holds ahead


def _lines(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


@pytest.mark.parametrize("spill", [1_000_000, 300], ids=["held", "written-in-savepoint"])
def test_a_file_rewritten_while_read_is_undone_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill: int
) -> None:
    monkeypatch.setattr(ingest, "_SPILL_ROWS", spill)
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    adir = attempt_dir(tmp_path / "t", "1_0.r0")
    adir.mkdir(parents=True)
    first = [{"type": "start", "time": 1.0, "host": "n1"}]
    first += [{"type": "metric", "time": 1.0, "step": s, "metrics": {"x": 0.5}} for s in range(50)]
    (adir / "user-r0-00000000.jsonl").write_bytes(_lines(first))
    second = [{"type": "exit", "time": 2.0, "code": 0, "reason": "completed"}]
    second += [
        {"type": "metric", "time": 2.0, "step": 100 + s, "metrics": {"x": 9.0}}
        for s in range(3_000)
    ]
    later = adir / "user-r0-00000001.jsonl"
    body = _lines(second)
    later.write_bytes(body)
    bad_at = sum(len(line) + 1 for line in body.split(b"\n")[: _BAD_LINE - 1])
    bad_len = body.index(b"\n", bad_at) - bad_at

    apply = ingest._apply
    rewritten: list[bool] = []

    def rewriting_apply(*args: Any) -> None:
        rec = args[3]
        if rec.get("type") == "exit" and not rewritten:  # the job rewrites it in place
            with open(later, "r+b") as f:
                f.seek(bad_at)
                f.write(b"{" * bad_len)
            rewritten.append(True)
        apply(*args)

    monkeypatch.setattr(ingest, "_apply", rewriting_apply)
    with store.write() as s:
        trial = s.get(Trial, tid)
        assert trial is not None
        result = ingest_attempt(s, trial, adir, utcnow())
    assert rewritten and result.files == 2 and result.metrics == 50 and not result.exited
    with store.read() as s:
        assert s.scalar(select(func.count()).select_from(Metric)) == 50
        assert s.scalar(select(func.max(Metric.step))) == 49
        marks = {n: r for n, r in s.execute(select(IngestedFile.name, IngestedFile.records))}
        assert marks == {"user-r0-00000000.jsonl": 51, "user-r0-00000001.jsonl": 0}
        attempt = s.scalars(select(Attempt)).one()
        assert (attempt.host, attempt.exit_code, attempt.ended_at) == ("n1", None, None)
        trial = s.get(Trial, tid)
        assert trial is not None
        assert f"quarantined {later}: line {_BAD_LINE}:" in trial.error
    store.close()


def test_each_file_is_opened_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One descriptor per file: no second open that a swap could redirect."""
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    adir = attempt_dir(tmp_path / "t", "1_0.r0")
    adir.mkdir(parents=True)
    for n in range(3):
        rec = {"type": "metric", "time": 1.0, "step": n, "metrics": {"x": 1.0}}
        (adir / f"user-r0-{n:08d}.jsonl").write_bytes(_lines([rec]))
    opened: list[Path] = []
    real = safe_read.open_regular

    def counting(path: Path) -> tuple[int, int]:
        opened.append(path)
        return real(path)

    monkeypatch.setattr(events, "open_regular", counting)  # as events.py calls it
    with store.write() as s:
        trial = s.get(Trial, tid)
        assert trial is not None
        assert ingest_attempt(s, trial, adir, utcnow()).metrics == 3
    assert sorted(p.name for p in opened) == [f"user-r0-{n:08d}.jsonl" for n in range(3)]
    store.close()
