"""ctx.report's records are published off the training thread: same files, same
order, everything published by flush/checkpoint/close/exit, nothing from a fork."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dlhpc.errors import DlhpcError
from dlhpc.harness._publisher import BackgroundPublisher
from dlhpc.harness.context import TrialContext
from dlhpc.protocol import EventWriter, TrialSpec, read_event_batches
from dlhpc.protocol.events import encode_record


def _records(attempt: Path) -> list[dict[str, object]]:
    return [r for b in read_event_batches(attempt) for r in b.records]


def test_encoding_is_json_dumps_sorted() -> None:
    hostile = {'a"}, {"metrics": ': float("nan"), "é\\\n": float("-inf"), "b": 1e300}
    record = {"type": "metric", "time": 1.25, "step": 3, "metrics": hostile}
    assert encode_record(record) == json.dumps(record, sort_keys=True, allow_nan=True) + "\n"


def test_batches_are_published_in_order_one_file_each(tmp_path: Path) -> None:
    pub = BackgroundPublisher(EventWriter(tmp_path, "user-r0"))
    for batch in range(5):
        for i in range(100):
            pub.add("metric", step=batch * 100 + i, metrics={"m": float(i)})
        pub.submit()
    pub.add("log", level="info", message="last")
    pub.flush()  # returns once all is published
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"user-r0-{n:08d}.jsonl" for n in range(6)]
    records = _records(tmp_path)
    assert [r["step"] for r in records[:-1]] == list(range(500))
    assert records[-1]["message"] == "last"
    thread = [t for t in threading.enumerate() if t.name == "dlhpc-events"]
    assert thread and thread[0].daemon


def test_a_failed_write_is_raised_to_the_caller_and_retried_in_order(tmp_path: Path) -> None:
    attempt = tmp_path / "attempt"
    pub = BackgroundPublisher(EventWriter(attempt, "user-r0"))
    attempt.rmdir()
    attempt.write_text("")  # the folder is gone: every write fails (also for root)
    pub.add("metric", step=1, metrics={})
    pub.submit()
    pub.add("metric", step=2, metrics={})
    with pytest.raises(OSError):
        pub.flush()
    attempt.unlink()
    attempt.mkdir()
    pub.add("metric", step=3, metrics={})
    pub.flush()
    assert [r["step"] for r in _records(attempt)] == [1, 2, 3]
    assert len(list(attempt.iterdir())) == 1  # one file: the kept records, then the new one


def test_a_forked_child_publishes_nothing(tmp_path: Path) -> None:
    pub = BackgroundPublisher(EventWriter(tmp_path, "user-r0"))
    pub.add("metric", step=1, metrics={})
    pid = os.fork()
    if pid == 0:  # the child: the parent's buffer is not its to publish
        pub.add("metric", step=99, metrics={})
        pub.flush()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert list(tmp_path.iterdir()) == []
    pub.flush()
    assert [r["step"] for r in _records(tmp_path)] == [1]


@dataclass
class _Ckpt:
    step: int
    path: Path
    size_bytes: int


@dataclass
class _State:
    step: int
    folder: Path

    def save(self) -> Any:  # a Checkpoint's fields, without writing one
        path = self.folder / f"ckpt-{self.step}"
        path.write_text("x")
        return _Ckpt(self.step, path, 1)


def test_a_checkpoint_record_follows_the_metrics_and_is_published_on_return(
    tmp_path: Path,
) -> None:
    spec = TrialSpec(1, 1, {}, 2, 0, str(tmp_path), str(tmp_path), "e.sh", str(tmp_path), "m", True)
    attempt = tmp_path / "attempt"
    ctx = TrialContext(spec, attempt, {}, flush_every=3, poll_grace_s=None)
    for step in range(1, 8):  # two batches handed over on the way, one pending
        ctx.report(step, {"m": float(step)})
    ctx.checkpoint(_State(7, tmp_path))
    records = _records(attempt)  # no flush: checkpoint() returned, so it is all there
    assert [r["type"] for r in records] == ["metric"] * 7 + ["checkpoint"]
    assert records[-1]["metric"] == 7.0 and records[-1]["metric_step"] == 7


def test_metrics_reported_without_close_are_published_at_exit(tmp_path: Path) -> None:
    spec = TrialSpec(1, 1, {}, 2, 0, str(tmp_path), str(tmp_path), "e.sh", str(tmp_path), "m", True)
    tdir = tmp_path / "trial"
    spec.write(tdir / "trial.json")
    attempt = tmp_path / "attempt"
    env = dict(os.environ, DLHPC_TRIAL_DIR=str(tdir), DLHPC_ATTEMPT_DIR=str(attempt))
    script = (
        "import dlhpc\nctx = dlhpc.init(flush_every=10)\n"
        "for i in range(25):\n    ctx.report(i, {'m': 1.0})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
    assert proc.returncode == 0
    assert [r["step"] for r in _records(attempt)] == list(range(25))
    assert len(list(attempt.glob("user-r0-*.jsonl"))) == 3  # 10, 10, then 5 at exit


class _Step(int):
    """An int subclass (not bool): accepted as a step, as before the fast path."""


def test_report_checks_the_step_on_its_fast_path(tmp_path: Path) -> None:
    spec = TrialSpec(1, 1, {}, 2, 0, str(tmp_path), str(tmp_path), "e.sh", str(tmp_path), "m", True)
    ctx = TrialContext(spec, tmp_path / "attempt", {}, poll_grace_s=None)
    for bad in (True, -1, 2.0, "3", None):
        with pytest.raises(DlhpcError, match="non-negative int"):
            ctx.report(bad, {"m": 1.0})  # type: ignore[arg-type]
    ctx.report(_Step(4), {"m": 2})
    ctx.report(0, {"x": 1.5})
    ctx.flush()
    records = _records(tmp_path / "attempt")
    assert [(r["step"], r["metrics"]) for r in records] == [(4, {"m": 2.0}), (0, {"x": 1.5})]
    assert ctx._evaluated == (4, {"m": 2.0})  # the searcher metric "m", at step 4


class _Float(float):
    """A float subclass (as numpy.float64 is): converted to a plain float."""


def test_report_copies_and_converts_the_metrics_on_its_fast_path(tmp_path: Path) -> None:
    spec = TrialSpec(1, 1, {}, 2, 0, str(tmp_path), str(tmp_path), "e.sh", str(tmp_path), "m", True)
    ctx = TrialContext(spec, tmp_path / "attempt", {}, poll_grace_s=None)
    reused: dict[Any, Any] = {"m": 0.5, "loss": 2.0}
    ctx.report(1, reused)  # all floats: the fast path, a copy
    reused["m"] = 0.75  # the caller reuses its dict: what was reported stays
    reused["extra"] = 1.0
    ctx.report(2, {"m": 3, 7: _Float(1.25), "t": True})  # converted: int, key, subclass, bool
    with pytest.raises((TypeError, ValueError)):
        ctx.report(3, {"m": "high"})  # not a number: raised in the caller
    ctx.flush()
    records = _records(tmp_path / "attempt")
    assert [(r["step"], r["metrics"]) for r in records] == [
        (1, {"m": 0.5, "loss": 2.0}),
        (2, {"m": 3.0, "7": 1.25, "t": 1.0}),
    ]
    assert ctx._evaluated is not None and ctx._evaluated[0] == 2 and ctx._evaluated[1]["m"] == 3.0


def test_a_result_waits_at_most_flush_interval_s(tmp_path: Path) -> None:
    spec = TrialSpec(1, 1, {}, 2, 0, str(tmp_path), str(tmp_path), "e.sh", str(tmp_path), "m", True)
    ctx = TrialContext(spec, tmp_path / "attempt", {}, flush_interval_s=0.0, poll_grace_s=None)
    ctx.report(1, {"m": 1.0})  # the interval has passed: handed over though far below 10,000
    deadline = time.monotonic() + 30
    while not _records(tmp_path / "attempt") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [r["step"] for r in _records(tmp_path / "attempt")] == [1]
    ctx.close()


def test_the_publishing_thread_starts_with_the_context_not_in_a_report_call(
    tmp_path: Path,
) -> None:
    spec = TrialSpec(1, 1, {}, 2, 0, str(tmp_path), str(tmp_path), "e.sh", str(tmp_path), "m", True)
    before = {t.ident for t in threading.enumerate() if t.name == "dlhpc-events"}
    ctx = TrialContext(spec, tmp_path / "attempt", {}, poll_grace_s=None)
    started = [t for t in threading.enumerate() if t.name == "dlhpc-events"]
    assert [t for t in started if t.ident not in before and t.is_alive()], "not started at init"
    ctx.report(1, {"m": 1.0})
    ctx.close()
    assert [r["step"] for r in _records(tmp_path / "attempt")] == [1]


def test_a_checkpoint_carries_the_newest_finite_searcher_metric_since_the_last_one(
    tmp_path: Path,
) -> None:
    """report() keeps the newest report holding the searcher metric; the checkpoint
    takes its value out (None when not finite) and starts afresh."""
    spec = TrialSpec(1, 1, {}, 9, 0, str(tmp_path), str(tmp_path), "e.sh", str(tmp_path), "m", True)
    attempt = tmp_path / "attempt"
    ctx = TrialContext(spec, attempt, {}, poll_grace_s=None)
    ctx.report(1, {"m": 1.5})
    ctx.report(2, {"other": 9.0})  # no searcher metric: the step-1 value stays
    ctx.checkpoint(_State(2, tmp_path))
    ctx.report(3, {"m": float("nan"), "other": 1.0})
    ctx.checkpoint(_State(3, tmp_path))
    ctx.checkpoint(_State(4, tmp_path))  # nothing reported since the last one
    got = [(r["metric"], r["metric_step"]) for r in _records(attempt) if r["type"] == "checkpoint"]
    assert got == [(1.5, 1), (None, 3), (None, None)]
