"""Strict sites: limits, no accounting, no requeue permission, 24.11 preemption.

Slurm's side is faked: scripts first on PATH for the Slurm backend, an in-process
backend for the orchestrator.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import Collection
from pathlib import Path

import pytest
from sqlalchemy import select

from dlhpc.config import load_experiment
from dlhpc.config.schema import Resources
from dlhpc.config.serde import to_jsonable
from dlhpc.errors import ConfigError, SchedulerError
from dlhpc.orchestrator.adopt import match_tasks, recover_submissions
from dlhpc.orchestrator.clock import SYSTEM_CLOCK
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.recovery import judge, superseded_cause
from dlhpc.orchestrator.submit import submit_pending
from dlhpc.orchestrator.trials import TrialPass, reconcile_trial
from dlhpc.scheduler import BaseScheduler, JobRequest, JobState, JobStatus, SubmittedTask
from dlhpc.scheduler.base import SubmitLimitError
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.scheduler.slurm.limits import (
    Limits,
    is_limit_refusal,
    limits_check,
    parse_assocs,
    parse_qos,
)
from dlhpc.scheduler.slurm.parse import parse_sacct_runs
from dlhpc.scheduler.slurm.scheduler import SlurmScheduler
from dlhpc.search import SearcherTable
from dlhpc.states import SUPERSEDED, SubmissionState, TrialState
from dlhpc.store import Attempt, Event, Store, Submission, Trial, utcnow
from tests.unit._db import add_experiment, add_trial
from tests.unit.test_recovery import LONG_AGO, NOW, _attempt, _st
from tests.unit.test_scheduler_slurm import FakeSlurm, fake, make_request, stand_in
from tests.unit.test_worker import STOPPABLE, _start_and_signal, _trial

__all__ = ["fake"]  # the fixture, imported for its name

# --- the site's limits, parsed ------------------------------------------------

ASSOCS = (
    "dlhpc-lab||dlhpc-qos,normal|dlhpc-qos|||1-00:00:00|\n"
    "other||normal||20|10||cpu=64\n"
    "garbage line\n"
)
QOS = "normal||||\ndlhpc-qos|8|4|02:00:00|gres/gpu=4\n"


def _limits() -> Limits:
    return Limits(tuple(parse_assocs(ASSOCS)), parse_qos(QOS))


def test_limits_parse_and_the_smallest_that_may_bind_wins() -> None:
    limits = _limits()
    assert [a.account for a in limits.associations] == ["dlhpc-lab", "other"]
    assert limits.qos["dlhpc-qos"].max_submit_per_user == 8
    assert limits.max_submit("dlhpc-lab", None) == 8  # the association's default QOS
    assert limits.max_jobs("DLHPC-LAB", "dlhpc-qos") == 4  # names compare in lower case
    assert limits.max_wall_minutes("dlhpc-lab", None) == 120
    assert limits.max_submit("other", None) == 20  # normal sets nothing
    assert limits.max_submit(None, None) == 8  # not knowing the default: the smallest
    assert limits.max_submit("other", "normal") == 20
    assert limits.max_submit("nobody", "normal") is None
    line = limits.describe("dlhpc-lab", None)
    assert "MaxSubmitJobs 8" in line and "MaxWall 02:00:00" in line and "gres/gpu=4" in line
    assert limits.wall_problem("dlhpc-lab", None, 120) is None
    problem = limits.wall_problem("dlhpc-lab", None, 180)
    assert problem is not None and "03:00:00 exceeds the site's MaxWall 02:00:00" in problem


@pytest.mark.parametrize(
    ("text", "limited"),
    [
        ("sbatch: error: QOSMaxSubmitJobPerUserLimit", True),
        ("sbatch: error: AssocMaxSubmitJobLimit", True),
        (
            "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy"
            " (job submit limit, user's size and/or time limits)",
            True,
        ),
        ("sbatch: error: Batch job submission failed: Invalid partition name specified", False),
        ("sbatch: error: Invalid account or account/partition combination specified", False),
    ],
)
def test_limit_refusals_are_told_from_errors(text: str, limited: bool) -> None:
    assert is_limit_refusal(text) is limited


def test_doctor_shows_the_limits_or_why_not() -> None:
    from dlhpc.config.schema import SiteConfig

    site = SiteConfig("s", None, account="dlhpc-lab")

    def answers(cmd: list[str]) -> tuple[int, str]:
        return 0, ASSOCS if "assoc" in cmd else QOS

    ok = limits_check(site, answers)
    assert ok.status == "ok" and "MaxSubmitJobs 8" in ok.detail
    down = limits_check(site, lambda cmd: (1, "sacctmgr: error: Connection refused"))
    assert down.status == "warn" and "Connection refused" in down.detail


# --- the Slurm backend under limits (fake commands) ----------------------------


def _script(fake: FakeSlurm, name: str, body: str) -> None:
    path = fake.dir.parent / "fakebin" / name
    path.write_text("#!/bin/bash\n" + body, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _sacctmgr(fake: FakeSlurm) -> None:
    fake.put("assocs.out", ASSOCS)
    fake.put("qos.out", QOS)
    _script(
        fake,
        "sacctmgr",
        'echo "sacctmgr $*" >> "$FAKE/calls.log"\n'
        '[ -f "$FAKE/sacctmgr_fail" ] && { echo "sacctmgr: error: no dbd" >&2; exit 1; }\n'
        'case "$*" in *assoc*) cat "$FAKE/assocs.out";; *) cat "$FAKE/qos.out";; esac\n',
    )


def test_submit_slots_count_the_users_tasks_from_the_poll(fake: FakeSlurm) -> None:
    _sacctmgr(fake)
    fake.put(
        "squeue.out",
        "5_0|RUNNING|None|n1|2024-05-01T10:00:00|N/A\n"
        "5_1|PENDING|QOSMaxJobsPerUserLimit||N/A|N/A\n"
        "5_2|COMPLETED|None|n1|2024-05-01T10:00:00|2024-05-01T10:01:00\n"
        "9|PENDING|Priority||N/A|N/A\n",
    )
    sched = SlurmScheduler(fn=stand_in)
    sched.poll(["5_0"])
    res = Resources(account="dlhpc-lab")
    assert sched.submit_slots(res) == 8 - 3  # 5_0, 5_1 and job 9; the completed one is gone
    assert sched.submit_slots(Resources(account="other", qos="normal")) == 20 - 3
    assert len(fake.calls("sacctmgr")) == 2  # once per instance
    assert len(fake.calls("squeue")) == 1  # the poll's
    assert sched.limit_problem(Resources(account="dlhpc-lab", time_minutes=121)) is not None


def test_submit_slots_without_a_poll_ask_squeue_once_and_count_submissions(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    _sacctmgr(fake)
    sched = SlurmScheduler(fn=stand_in)
    res = Resources(account="dlhpc-lab", partition="gpu")
    assert sched.submit_slots(res) == 8
    sched.submit(make_request(tmp_path, 3))
    assert sched.submit_slots(res) == 5
    assert len(fake.calls("squeue")) == 1


def test_no_sacctmgr_means_no_limits_with_one_warning(
    fake: FakeSlurm, caplog: pytest.LogCaptureFixture
) -> None:
    _sacctmgr(fake)
    fake.put("sacctmgr_fail", "")
    sched = SlurmScheduler(fn=stand_in)
    assert sched.submit_slots(Resources()) is None
    assert sched.submit_slots(Resources()) is None
    assert len(fake.calls("sacctmgr")) == 1
    assert sum("cannot read the site's limits" in r.getMessage() for r in caplog.records) == 1


def test_sbatch_refused_for_a_limit_raises_submit_limit_error(
    fake: FakeSlurm, tmp_path: Path
) -> None:
    _script(
        fake,
        "sbatch",
        'echo "sbatch $*" >> "$FAKE/calls.log"\n'
        'n=$(cat "$FAKE/next_id" 2>/dev/null || echo 100)\n'
        'if [ "$n" = 101 ]; then\n'
        '  echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2\n'
        '  echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS'
        " policy (job submit limit, user's size and/or time limits)\" >&2\n"
        "  exit 1\n"
        "fi\n"
        'echo $((n + 1)) > "$FAKE/next_id"\n'
        'echo "Submitted batch job $n"\n',
    )
    with pytest.raises(SubmitLimitError) as info:
        SlurmScheduler(fn=stand_in).submit(make_request(tmp_path, 5, site_max=2))
    assert [t.job_id for t in info.value.submitted] == ["100_0", "100_1"]  # the first chunk


# --- no accounting --------------------------------------------------------------


def test_run_states_and_find_jobs_without_accounting(
    fake: FakeSlurm, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put("sacct_mode", "fail")
    fake.put("squeue.out", "300_2\n300_3\n")
    sched = SlurmScheduler(fn=stand_in)
    assert sched.find_jobs("dlhpc-e1-abc") == ["300_2", "300_3"]  # what squeue still shows
    assert not sched.accounting_available
    assert sched.run_states(["300_2"]) == {}
    assert len(fake.calls("sacct")) == 1  # tried once, then never again
    assert sum("accounting unavailable" in r.getMessage() for r in caplog.records) == 1


def test_a_vanished_job_is_judged_by_its_files() -> None:
    """Without sacct a job that left squeue is UNKNOWN: its exit record decides."""
    gone = LONG_AGO
    unknown = _st(JobState.UNKNOWN)
    assert judge(_attempt(0, "completed", gone), unknown, None, NOW).state is TrialState.COMPLETED
    crash = judge(_attempt(1, "error", gone), unknown, None, NOW)
    assert (crash.resubmit, crash.counted, crash.cause) == (True, True, "crash")
    pre = judge(_attempt(75, "requeue/TERM", gone), unknown, None, NOW)
    assert (pre.resubmit, pre.counted, pre.cause) == (True, False, "preempted")
    lost = judge(_attempt(None, "", gone), unknown, None, NOW)
    assert (lost.resubmit, lost.counted, lost.cause) == (True, False, "lost")


@pytest.mark.parametrize(
    ("found", "owned", "size", "matched", "unmatched"),
    [
        # accounting: every task found
        (["7_0", "7_1", "7_2"], {}, 1001, {1: "7_0", 2: "7_1", 3: "7_2"}, []),
        # no accounting: 7_0 ended and left squeue, its files named it
        (["7_1", "7_2"], {1: "7_0"}, 1001, {1: "7_0", 2: "7_1", 3: "7_2"}, []),
        # ... and 7_1 never started and vanished: trial 2 is submitted again
        (["7_2"], {1: "7_0"}, 1001, {1: "7_0", 3: "7_2"}, []),
        # two arrays of 2: task i of the k-th array is trial 2k+i
        (["8_0"], {1: "7_0", 2: "7_1"}, 2, {1: "7_0", 2: "7_1", 3: "8_0"}, []),
        # the first array vanished unseen: its place is unknown, nothing is guessed
        (["8_0"], {}, 2, {}, ["8_0"]),
    ],
)
def test_orphaned_tasks_are_matched_by_array_index(
    found: list[str],
    owned: dict[int, str],
    size: int,
    matched: dict[int, str],
    unmatched: list[str],
) -> None:
    assert match_tasks([1, 2, 3], found, owned, size) == (matched, unmatched)


# --- the orchestrator under limits (an in-process backend) ------------------------

YAML = """\
name: limits
entrypoint: python train.py
resources: {cpus_per_task: 1, mem: "1G", time: "03:00:00"}
searcher: {name: single, metric: loss, max_length: 1}
"""


class Limited(BaseScheduler):
    """Answers submit_slots with ``slots``; refuses with ``refuse``; finds ``found``."""

    name = "limited"

    def __init__(self) -> None:
        self.slots: int | None = None
        self.refuse = False
        self.submitted: list[list[Path]] = []
        self.found: list[str] = []
        self.cancelled: list[str] = []
        self.wall = ""

    def render(self, request: JobRequest) -> list[str]:
        return ["#"]

    def submit(self, request: JobRequest) -> list[SubmittedTask]:
        if self.refuse:
            raise SubmitLimitError("sbatch: error: QOSMaxSubmitJobPerUserLimit")
        n = len(self.submitted)
        self.submitted.append(list(request.trial_dirs))
        return [
            SubmittedTask(d, f"{40 + n}_{i}", d / "log", None)
            for i, d in enumerate(request.trial_dirs)
        ]

    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        return {j: JobStatus(j, JobState.PENDING) for j in job_ids}

    def cancel(self, job_ids: Collection[str]) -> None:
        self.cancelled += list(job_ids)

    def log_paths(self, folder: Path, job_id: str) -> list[Path]:
        return [folder / f"{job_id}.out"]

    def submit_slots(self, resources: Resources) -> int | None:
        return self.slots

    def find_jobs(self, name: str) -> list[str]:
        return self.found

    def limit_problem(self, resources: Resources) -> str | None:
        return self.wall or None


@pytest.fixture
def site(tmp_path: Path) -> tuple[Store, SchedulerPool, Limited, int]:
    """A store with one experiment of 5 PENDING trials, and the limited backend."""
    yaml = tmp_path / "exp.yaml"
    yaml.write_text(YAML)
    cfg = load_experiment(yaml, site="local", searchers=SearcherTable())
    store = Store(tmp_path / "home")
    backend = Limited()
    pool = SchedulerPool(
        local_root=tmp_path / "local",
        backends=BackendTable([Backend("local", lambda _r: backend)]),
    )
    with store.write() as s:
        exp = add_experiment(
            s, store.runs_root / "exp-000001", config_json=json.dumps(to_jsonable(cfg))
        )
        for i in range(5):
            t = add_trial(s, exp, request_id=i, state="PENDING")
            t.run_dir = str(store.runs_root / "exp-000001" / f"trial-{t.id:06d}")
        exp_id = exp.id
    return store, pool, backend, exp_id


def _events(store: Store, kind: str) -> list[str]:
    with store.read() as s:
        return list(s.scalars(select(Event.message).where(Event.kind == kind)))


def test_only_what_the_limit_leaves_room_for_is_submitted(
    site: tuple[Store, SchedulerPool, Limited, int],
) -> None:
    store, pool, backend, exp_id = site
    backend.slots = 2
    assert len(submit_pending(store, pool, exp_id)) == 2
    backend.slots = 0
    assert submit_pending(store, pool, exp_id) == []
    assert submit_pending(store, pool, exp_id) == []
    # one event when the first 2 went and the rest waited, one when nothing could go;
    # none for the pass after, which changed nothing
    assert len(_events(store, "submit.waiting")) == 2
    backend.slots = 8
    assert len(submit_pending(store, pool, exp_id)) == 3  # the rest, as slots free
    assert [len(d) for d in backend.submitted] == [2, 3]


def test_a_refusal_for_a_limit_leaves_the_trials_pending(
    site: tuple[Store, SchedulerPool, Limited, int],
) -> None:
    store, pool, backend, exp_id = site
    backend.refuse = True
    for _ in range(4):  # more than the tick's failed-submission limit
        assert submit_pending(store, pool, exp_id) == []
    with store.read() as s:
        states = set(s.scalars(select(Submission.state)))
        assert states == {SubmissionState.DEFERRED.value}
        assert set(s.scalars(select(Trial.state))) == {TrialState.PENDING.value}
    assert "QOSMaxSubmitJobPerUserLimit" in _events(store, "submit.deferred")[0]
    backend.refuse = False
    assert len(submit_pending(store, pool, exp_id)) == 5


def test_a_time_above_max_wall_is_a_config_error_and_nothing_is_recorded(
    tmp_path: Path, site: tuple[Store, SchedulerPool, Limited, int]
) -> None:
    store, pool, backend, _ = site
    backend.wall = "03:00:00 exceeds the site's MaxWall 02:00:00"
    cfg = load_experiment(tmp_path / "exp.yaml", site="local", searchers=SearcherTable())
    with pytest.raises(ConfigError) as info:
        launch(cfg, store, pool)
    assert info.value.exit_code == 2
    assert str(info.value).startswith(f"{tmp_path / 'exp.yaml'}:3: resources.time: 03:00:00")
    assert backend.submitted == []


def test_recovery_adopts_started_tasks_by_their_files_without_accounting(
    site: tuple[Store, SchedulerPool, Limited, int],
) -> None:
    """Killed between sbatch and recording; task 70_0 ran and left the queue (no sacct)."""
    store, pool, backend, exp_id = site
    now = utcnow()
    with store.write() as s:
        ids = list(s.scalars(select(Trial.id).order_by(Trial.id)))[:3]
        s.add(
            Submission(
                experiment_id=exp_id,
                name="dlhpc-e1-orphan",
                state=SubmissionState.SUBMITTING.value,
                trial_ids_json=json.dumps(ids),
                folder="/jobs",
                created_at=now,
            )
        )
        # what the tick's ingest recorded from the worker's files of 70_0 (run twice:
        # Slurm requeued it), before its submission was known
        for key in ("70_0.r0", "70_0.r1"):
            s.add(Attempt(trial_id=ids[0], attempt_key=key, job_id="70_0", state="RUNNING",
                          created_at=now))  # fmt: skip
    backend.found = ["70_1", "70_2"]  # what squeue still shows
    assert recover_submissions(store, pool, exp_id) == 2
    with store.read() as s:
        jobs = dict(s.execute(select(Attempt.trial_id, Attempt.job_id)).all())
        assert jobs == {ids[0]: "70_0", ids[1]: "70_1", ids[2]: "70_2"}
        # every run of every adopted job is the submission's, with the job's log
        rows = s.execute(select(Attempt.job_id, Attempt.submission_id, Attempt.log_path)).all()
        assert len(rows) == 4 and all(sub is not None for _, sub, _ in rows), rows
        assert all(log == f"/jobs/{job}.out" for job, _, log in rows), rows
        assert s.scalar(select(Submission.state)) == SubmissionState.SUBMITTED.value
    assert backend.cancelled == []
    backend.slots = 8
    assert len(submit_pending(store, pool, exp_id)) == 2  # only the two never submitted


# --- no requeue permission --------------------------------------------------------


def test_a_refused_self_requeue_ends_the_job_for_the_reconciler_to_resubmit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\necho 'scontrol: error: Access/permission denied for job 77_3' >&2\nexit 1\n"
    )
    (bin_dir / "scontrol").chmod(0o755)
    tdir = _trial(tmp_path, STOPPABLE, {})
    env = {
        "SLURM_JOB_ID": "80",
        "SLURM_ARRAY_JOB_ID": "77",
        "SLURM_ARRAY_TASK_ID": "3",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    assert _start_and_signal(tdir, signal.SIGUSR2, env) == 75
    from dlhpc.protocol import read_event_batches
    from dlhpc.scheduler.slurm.requeue import requeue_after_step

    # the job script, once the step has ended, asks for the requeue the worker requested
    attempt = tdir / "attempts" / "77_3.r0"
    monkeypatch.setenv("PATH", env["PATH"])
    refused = requeue_after_step(attempt, env)
    assert "permission denied" in refused
    records = [r for b in read_event_batches(attempt) for r in b.records]
    exit_rec = next(r for r in records if r["type"] == "exit")
    assert (exit_rec["code"], exit_rec["reason"], exit_rec["signal"]) == (75, "requeue", "USR2")
    warning = next(r for r in records if r["type"] == "log")["message"]
    assert "permission denied" in warning and "submits the trial again" in warning
    # the job ends (its status the step's, COMPLETED or FAILED): the trial is resubmitted
    for state in (JobState.COMPLETED, JobState.FAILED):
        verdict = judge(_attempt(75, "requeue/USR2", NOW), _st(state), None, NOW)
        assert (verdict.resubmit, verdict.counted, verdict.cause) == (True, False, "timeout")


# --- Slurm 24.11/26.05 preemption: requeued whatever the exit -----------------------


def test_sacct_runs_are_ordered_by_start() -> None:
    text = (
        "61_0|RUNNING|2026-01-01T10:05:00\n"
        "61_0|PREEMPTED|2026-01-01T10:00:00\n"
        "61_1|PENDING|Unknown\n"
        "61_1|PREEMPTED|2026-01-01T10:00:00\n"
        "61_2|COMPLETED|2026-01-01T10:00:00\n"
    )
    assert parse_sacct_runs(text) == {
        "61_0": ["PREEMPTED", "RUNNING"],
        "61_1": ["PREEMPTED", "PENDING"],
        "61_2": ["COMPLETED"],
    }


def test_run_states_is_one_sacct_with_duplicates(fake: FakeSlurm) -> None:
    fake.put("sacct.out", "61_0|PREEMPTED|2026-01-01T10:00:00\n61_0|RUNNING|2026-01-01T10:05:00\n")
    assert SlurmScheduler(fn=stand_in).run_states(["61_0", "61_1"]) == {
        "61_0": ["PREEMPTED", "RUNNING"]
    }
    (call,) = fake.calls("sacct")
    assert " -D " in call and "--jobs=61" in call


def test_superseded_cause_reads_slurms_record_of_the_run() -> None:
    term = _attempt(75, "requeue/TERM")
    assert superseded_cause(term) == "requeued"  # nothing known: as before
    assert superseded_cause(term, ["PREEMPTED", "RUNNING"]) == "preempted"
    assert superseded_cause(term, ["REQUEUED", "RUNNING"]) == "requeued"  # scontrol requeue
    assert superseded_cause(_attempt(None), ["NODE_FAIL", "PENDING"]) == "node_fail"
    assert superseded_cause(_attempt(75, "requeue/USR2"), ["REQUEUED"]) == "timeout"


def test_24_11_preemption_sequence_is_preempted_and_resumed_once(tmp_path: Path) -> None:
    """squeue goes RUNNING -> PENDING (BeginTime) under the same id; the worker had
    exited 75 after TERM; then the restart r1 runs. No resubmission, cause preempted."""
    store = Store(tmp_path / "home")
    now = utcnow()
    with store.write() as s:
        exp = add_experiment(s, tmp_path)
        t = add_trial(s, exp, run_dir=str(tmp_path / "t"))
        r0 = Attempt(
            trial_id=t.id,
            attempt_key="61_0.r0",
            job_id="61_0",
            state="RUNNING",
            exit_code=75,
            exit_reason="requeue/TERM",
            started_at=now,
            created_at=now,
        )
        s.add(r0)
        s.flush()
        pending = JobStatus("61_0", JobState.PENDING, raw_state="PENDING", reason="BeginTime")
        p = TrialPass({"61_0": pending}, SYSTEM_CLOCK, 3, 3)
        s.refresh(t)
        reconcile_trial(s, t, p)
        assert not t.needs_job and p.cancels == []  # Slurm brings it back: wait
        s.add(Attempt(trial_id=t.id, attempt_key="61_0.r1", job_id="61_0", state="RUNNING",
                      started_at=now, created_at=now))  # fmt: skip
        s.flush()
        s.refresh(t)
        running = JobStatus("61_0", JobState.RUNNING, raw_state="RUNNING")
        p = TrialPass(
            {"61_0": running}, SYSTEM_CLOCK, 3, 3, runs={"61_0": ["PREEMPTED", "RUNNING"]}
        )
        reconcile_trial(s, t, p)
        first = s.scalar(select(Attempt).where(Attempt.attempt_key == "61_0.r0"))
        assert first is not None and (first.state, first.cause) == (SUPERSEDED, "preempted")
        assert not t.needs_job and p.cancels == [] and t.restarts == 1
        assert t.state == TrialState.RUNNING.value


def test_resubmission_error_is_still_an_error(
    site: tuple[Store, SchedulerPool, Limited, int],
) -> None:
    """Only limit refusals defer: another sbatch error still raises and counts."""
    store, pool, backend, exp_id = site

    def broken(request: JobRequest) -> list[SubmittedTask]:
        raise SchedulerError("sbatch: error: Invalid partition name specified")

    backend.submit = broken  # type: ignore[method-assign]
    with pytest.raises(SchedulerError):
        submit_pending(store, pool, exp_id)
    with store.read() as s:
        assert s.scalar(select(Submission.state)) == SubmissionState.FAILED.value
