"""A preemption told by the job itself: Slurm 24.11 and 26.05 requeue a
preempted task under its own id, and without accounting (no ``sacct -D``) only the
worker, asking ``scontrol show job`` at the TERM, can say that the run was preempted.

The ``scontrol show job -o`` lines below are what Slurm printed on the dev clusters
(22.05, 24.11, 26.05) for a job step's TERM at preemption and for a running job."""

from __future__ import annotations

import os
import signal
from datetime import datetime
from pathlib import Path

import pytest

from dlhpc.orchestrator.recovery import judge, split_reason, superseded_cause
from dlhpc.protocol import REQUEUE_REQUEST_FILE, EventWriter, read_event_batches
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.scheduler.slurm.environment import SlurmJobEnvironment, preempt_time_set
from dlhpc.store import Attempt, Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._db import exp_and_trial
from tests.unit.test_worker import STOPPABLE, _start_and_signal, _trial

PREEMPTING = (  # 26.05, during the grace time (22.05 and 24.11 print the same fields)
    "JobId=800000 JobName=victim2.sh UserId=root(0) GroupId=root(0) JobState=RUNNING "
    "Reason=None Requeue=1 Restarts=0 BatchFlag=1 RunTime=00:00:06 "
    "PreemptEligibleTime=2026-11-26T02:27:40 PreemptTime=2026-11-26T02:27:46 "
    "SuspendTime=None SecsPreSuspend=0 Partition=debug"
)
RUNNING = (
    "JobId=800002 JobName=wrap JobState=RUNNING Reason=None Requeue=1 Restarts=0 "
    "PreemptEligibleTime=2026-11-26T02:28:22 PreemptTime=None SuspendTime=None"
)
NO_FIELD = "JobId=7 JobName=wrap JobState=RUNNING Reason=None Requeue=1 SuspendTime=None"


def test_preempt_time_tells_a_preemption_from_a_plain_term() -> None:
    assert preempt_time_set(PREEMPTING) is True
    assert preempt_time_set(RUNNING) is False
    assert preempt_time_set(NO_FIELD) is None  # not preemptable: cannot tell
    assert preempt_time_set(PREEMPTING.replace(" ", "\n   ")) is True  # without -o


def _fake_scontrol(tmp_path: Path, out: str, code: int = 0) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(
        f"#!/bin/sh\necho \"$@\" >> {tmp_path}/scontrol.args\ncat <<'EOF'\n{out}\nEOF\n"
        f"exit {code}\n"
    )
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_job_asks_scontrol_once_for_its_own_job_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _fake_scontrol(tmp_path, PREEMPTING)
    monkeypatch.setenv("PATH", env["PATH"])
    job = SlurmJobEnvironment(
        {"SLURM_JOB_ID": "80", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"}
    )
    assert job.preempted() is True
    assert (tmp_path / "scontrol.args").read_text().split() == ["show", "job", "-o", "80"]
    _fake_scontrol(tmp_path, "slurm_load_jobs error: Invalid job id specified", code=1)
    assert job.preempted() is None
    assert SlurmJobEnvironment({}).preempted() is None


def test_the_worker_records_a_preemption_in_its_exit_record(tmp_path: Path) -> None:
    slurm = {"SLURM_JOB_ID": "80", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"}
    tdir = _trial(tmp_path, STOPPABLE, {})
    env = {**slurm, **_fake_scontrol(tmp_path, PREEMPTING)}
    assert _start_and_signal(tdir, signal.SIGTERM, env) == 75
    records = [r for b in read_event_batches(tdir / "attempts" / "77_3.r0") for r in b.records]
    exit_rec = next(r for r in records if r["type"] == "exit")
    assert (exit_rec["signal"], exit_rec["preempted"]) == ("TERM", True)
    assert (tmp_path / "scontrol.args").read_text().split() == ["show", "job", "-o", "80"]


def test_a_term_that_is_no_preemption_says_so_and_usr2_asks_nothing(tmp_path: Path) -> None:
    slurm = {"SLURM_JOB_ID": "81", "SLURM_ARRAY_JOB_ID": "78", "SLURM_ARRAY_TASK_ID": "0"}
    tdir = _trial(tmp_path, STOPPABLE, {})
    env = {**slurm, **_fake_scontrol(tmp_path, RUNNING)}
    assert _start_and_signal(tdir, signal.SIGTERM, env) == 75
    records = [r for b in read_event_batches(tdir / "attempts" / "78_0.r0") for r in b.records]
    assert next(r for r in records if r["type"] == "exit")["preempted"] is False
    (tmp_path / "scontrol.args").unlink()
    tdir = _trial(tmp_path / "usr2", STOPPABLE, {})
    assert _start_and_signal(tdir, signal.SIGUSR2, env) == 75
    assert not (tmp_path / "scontrol.args").exists()  # the requeue is the job script's
    assert (tdir / "attempts" / "78_0.r0" / REQUEUE_REQUEST_FILE).is_file()
    records = [r for b in read_event_batches(tdir / "attempts" / "78_0.r0") for r in b.records]
    assert "preempted" not in next(r for r in records if r["type"] == "exit")


def _ingested(tmp_path: Path, exits: list[dict[str, object]]) -> Attempt:
    """The attempt ``5_0.r0`` after ingesting one exit record per rank."""
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    adir = tmp_path / "t" / "attempts" / "5_0.r0"
    for rank, fields in enumerate(exits):
        writer = EventWriter(adir, f"worker-r{rank}")
        writer.add("exit", code=75, reason="requeue", signal="TERM", **fields)
        writer.flush()
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        ingest_attempt(s, t, adir, utcnow())
        (a,) = t.attempts
        s.expunge(a)
    return a


def test_ingest_keeps_any_ranks_word_and_reads_older_records(tmp_path: Path) -> None:
    # rank 0 alone asks; rank 1's record (ingested after it) does not undo it
    a = _ingested(tmp_path / "a", [{"preempted": True}, {}])
    assert a.exit_reason == "requeue/TERM/preempted" and split_reason(a.exit_reason)[1] == "TERM"
    assert superseded_cause(a) == "preempted"
    assert superseded_cause(a, ["PREEMPTED", "RUNNING"]) == "preempted"
    # a record from before the field (or a worker that could not tell)
    old = _ingested(tmp_path / "b", [{}])
    assert old.exit_reason == "requeue/TERM" and superseded_cause(old) == "requeued"
    no = _ingested(tmp_path / "c", [{"preempted": False}])
    assert no.exit_reason == "requeue/TERM" and superseded_cause(no) == "requeued"
    # sacct's word wins where there is one; USR2 stays a timeout
    assert superseded_cause(old, ["PREEMPTED", "RUNNING"]) == "preempted"
    assert superseded_cause(old, ["NODE_FAIL", "RUNNING"]) == "node_fail"


def test_judge_reads_the_marked_reason_as_its_signal() -> None:
    a = Attempt(job_id="5_0", attempt_key="5_0.r0", state="FAILED", exit_code=75)
    a.exit_reason, a.created_at = "requeue/TERM/preempted", datetime(2026, 1, 1)
    v = judge(a, JobStatus("5_0", JobState.FAILED), None, datetime(2026, 1, 1))
    assert v.cause == "preempted" and v.resubmit and not v.counted
    a.exit_reason = "requeue/USR2"
    assert superseded_cause(a) == "timeout"
