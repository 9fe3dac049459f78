"""``dlhpc tick``: one idempotent reconciliation pass over all active experiments.

Poll the schedulers (a constant number of queries: one ``poll`` per backend for
all jobs), ingest new event files, derive attempt and trial states, let each
searcher decide, submit what it asked for, and close finished experiments.
Each step commits on its own; killing the process at any line loses nothing,
because every step is recomputed from Slurm, the files and the DB on the next
pass, and ingest is keyed per file.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from dlhpc._failpoints import failpoint
from dlhpc.errors import LeaseHeldError, SchedulerError
from dlhpc.orchestrator.common import (
    SchedulerPool,
    add_trials,
    config_of,
    log_event,
    recover_submissions,
    searcher_of,
    submit_pending,
)
from dlhpc.orchestrator.recovery import judge, superseded_cause
from dlhpc.orchestrator.states import ExperimentState, TrialState
from dlhpc.protocol import (
    EVENT_FILE_RE,
    HEARTBEAT_FILE,
    PROGRESS_FILE,
    iter_attempt_dirs,
    read_small_json,
)
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.search import Create
from dlhpc.store import Attempt, Experiment, IngestedFile, Store, Submission, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt, refresh_trial_metrics

__all__ = ["TickReport", "tick"]

_LIVE_ATTEMPT_STATES = {"PENDING", "RUNNING", "REQUEUED", "UNKNOWN"}
_MAX_FAILED_SUBMISSIONS = 3
_INGEST_BATCH = 64  # attempt folders per write transaction


@dataclass
class TickReport:
    experiments: int = 0
    polled_jobs: int = 0
    ingested_files: int = 0
    metrics: int = 0
    submitted: int = 0
    finished: list[int] = field(default_factory=list)
    scheduler_calls: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    lease_held_elsewhere: bool = False
    errors: list[str] = field(default_factory=list)


def tick(store: Store, pool: SchedulerPool) -> TickReport:
    """One pass; a concurrent reconciler makes this one return with ``lease_held_elsewhere``."""
    report = TickReport()
    t0 = time.monotonic()
    calls_before = pool.calls()
    try:
        with store.hold_lease():
            _tick(store, pool, report)
    except LeaseHeldError:
        report.lease_held_elsewhere = True
    report.scheduler_calls = dict(pool.calls() - calls_before)
    report.duration_s = time.monotonic() - t0
    return report


def _tick(store: Store, pool: SchedulerPool, report: TickReport) -> None:
    with store.read() as s:
        exps = s.scalars(
            select(Experiment).where(Experiment.state == ExperimentState.ACTIVE.value)
        ).all()
        exp_ids = [e.id for e in exps]
        backend_of = {e.id: e.backend for e in exps}
        live_trials = s.scalars(
            select(Trial).where(
                Trial.experiment_id.in_(exp_ids),
                Trial.state.not_in([st.value for st in TrialState if st.is_terminal]),
            )
        ).all()
        live_attempts = s.scalars(
            select(Attempt).where(
                Attempt.trial_id.in_([t.id for t in live_trials]),
                Attempt.state.in_(_LIVE_ATTEMPT_STATES),
            )
        ).all()
        done_files = _ingested_names(s, [t.id for t in live_trials])
    report.experiments = len(exps)

    exp_of_trial = {t.id: t.experiment_id for t in live_trials}
    by_backend: dict[str, list[str]] = defaultdict(list)
    for a in live_attempts:
        by_backend[backend_of[exp_of_trial[a.trial_id]]].append(a.job_id)
    statuses: dict[str, JobStatus] = {}
    for backend, job_ids in by_backend.items():
        report.polled_jobs += len(job_ids)
        try:
            statuses.update(pool.get(backend).poll(job_ids))
        except SchedulerError as err:
            report.errors.append(f"poll {backend}: {err}")  # no states this pass, retry next

    failpoint("tick.after_poll")
    _ingest(store, _pending_attempt_dirs(list(live_trials), done_files), report)
    failpoint("tick.after_ingest")

    for exp_id in exp_ids:
        try:
            recover_submissions(store, pool, exp_id)
        except SchedulerError as err:
            report.errors.append(f"experiment {exp_id}: recovering a submission: {err}")
            continue  # never resubmit while the orphan's jobs may exist
        _reconcile_experiment(store, pool, exp_id, statuses, report)
        try:
            report.submitted += len(submit_pending(store, pool, exp_id))
        except SchedulerError as err:
            report.errors.append(f"experiment {exp_id}: {err}")


def _ingested_names(s: Session, trial_ids: list[int]) -> dict[tuple[int, str], set[str]]:
    rows = s.execute(
        select(Attempt.trial_id, Attempt.attempt_key, IngestedFile.name)
        .join(IngestedFile, IngestedFile.attempt_id == Attempt.id)
        .where(Attempt.trial_id.in_(trial_ids))
    ).all()
    out: dict[tuple[int, str], set[str]] = defaultdict(set)
    for trial_id, key, name in rows:
        out[(trial_id, key)].add(name)
    return out


def _pending_attempt_dirs(
    trials: list[Trial], done: dict[tuple[int, str], set[str]]
) -> list[tuple[int, Path]]:
    """(trial id, attempt folder) pairs that hold event files not ingested yet."""
    todo = []
    for t in trials:
        if not t.run_dir:
            continue
        for adir in iter_attempt_dirs(Path(t.run_dir)):
            names = {p.name for p in adir.iterdir() if EVENT_FILE_RE.match(p.name)}
            if names - done.get((t.id, adir.name), set()):
                todo.append((t.id, adir))
    return todo


def _ingest(store: Store, todo: list[tuple[int, Path]], report: TickReport) -> None:
    """Ingest in batches: one transaction per batch (a commit costs fsyncs on NFS)."""
    for i in range(0, len(todo), _INGEST_BATCH):
        with store.write() as s:
            touched: dict[int, Trial] = {}
            for trial_id, adir in todo[i : i + _INGEST_BATCH]:
                t = s.get(Trial, trial_id)
                if t is None:
                    continue
                result = ingest_attempt(s, t, adir, utcnow())
                report.ingested_files += result.files
                report.metrics += result.metrics
                touched[t.id] = t
            for t in touched.values():
                refresh_trial_metrics(s, t, t.experiment.metric, t.experiment.smaller_is_better)
        failpoint("tick.after_ingest_batch")


def _apply_status(a: Attempt, st: JobStatus | None, now: datetime) -> None:
    """Record the scheduler's view of the attempt's job (its exit record is kept apart)."""
    if st is None:
        return
    a.raw_state = st.raw_state or st.state.value
    a.node_list = st.node_list or a.node_list
    a.started_at = a.started_at or st.start
    a.state = st.state.value
    if st.state.is_terminal or st.state == JobState.UNKNOWN:
        a.ended_at = a.ended_at or st.end
        a.terminal_seen_at = a.terminal_seen_at or now
    else:
        a.terminal_seen_at = None


def _attempt_file(t: Trial, a: Attempt, name: str) -> dict[str, object] | None:
    return (
        read_small_json(Path(t.run_dir) / "attempts" / a.attempt_key / name) if t.run_dir else None
    )


def _heartbeat_age(t: Trial, a: Attempt | None) -> timedelta | None:
    beat = _attempt_file(t, a, HEARTBEAT_FILE) if a is not None else None
    if beat is None or not isinstance(beat.get("time"), int | float):
        return None
    return timedelta(seconds=max(0.0, time.time() - float(beat["time"])))  # type: ignore[arg-type]


def _lost_steps(t: Trial, a: Attempt) -> int | None:
    if a.lost_steps is not None:
        return a.lost_steps
    progress = _attempt_file(t, a, PROGRESS_FILE) or {}
    step, ckpt = progress.get("step"), progress.get("checkpoint_step")
    if not isinstance(step, int):
        return None
    return max(0, step - (ckpt if isinstance(ckpt, int) else 0))


def _log_tail(a: Attempt, lines: int = 5) -> str:
    if not a.log_path:
        return ""
    out = []
    for path in (Path(a.log_path).with_name(Path(a.log_path).name.replace(".out", ".err")),):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out += [ln for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(out)


def _reconcile_experiment(
    store: Store,
    pool: SchedulerPool,
    exp_id: int,
    statuses: dict[str, JobStatus],
    report: TickReport,
) -> None:
    now = utcnow()
    with store.write() as s:
        exp = s.get(
            Experiment,
            exp_id,
            options=[selectinload(Experiment.trials).selectinload(Trial.attempts)],
        )
        if exp is None or exp.state != ExperimentState.ACTIVE.value:
            return
        cfg = config_of(exp)
        searcher = searcher_of(cfg, exp.searcher_state)
        cancels: dict[str, list[str]] = defaultdict(list)
        for t in exp.trials:
            if not TrialState(t.state).is_terminal:
                _reconcile_trial(s, t, cfg.max_restarts, statuses, now, cancels[exp.backend])
                if TrialState(t.state).is_terminal:
                    if t.latest_metric is not None:
                        searcher.tell(t.request_id, t.steps_completed, t.latest_metric)
                    searcher.tell_exited(t.request_id)

        live = [t for t in exp.trials if not TrialState(t.state).is_terminal]
        capacity = cfg.searcher.max_concurrent_trials or 1_000_000
        ops = searcher.ask(max(0, capacity - len(live)))
        for op in ops:
            if not isinstance(op, Create):
                log_event(s, "searcher.unsupported", f"{op!r} is not supported yet", exp_id)
        creates = [op for op in ops if isinstance(op, Create)]
        add_trials(s, exp_id, creates, cfg, store.runs_root, now)
        exp.searcher_state = json.dumps(searcher.state_dict())

        failed_subs = s.scalars(
            select(Submission.id).where(
                Submission.experiment_id == exp_id, Submission.state == "FAILED"
            )
        ).all()
        all_exited = all(TrialState(t.state).is_terminal for t in exp.trials)
        if len(failed_subs) >= _MAX_FAILED_SUBMISSIONS:
            _finish(s, exp, ExperimentState.FAILED, "submission failed repeatedly", now)
            report.finished.append(exp_id)
        elif all_exited and searcher.done:
            ok = any(t.state == TrialState.COMPLETED.value for t in exp.trials)
            _finish(s, exp, ExperimentState.COMPLETED if ok else ExperimentState.FAILED, "", now)
            report.finished.append(exp_id)
    for backend, job_ids in cancels.items():
        if job_ids:
            pool.get(backend).cancel(job_ids)  # their trials were resubmitted: stop the zombies


def _reconcile_trial(
    s: Session,
    t: Trial,
    max_restarts: int,
    statuses: dict[str, JobStatus],
    now: datetime,
    cancels: list[str],
) -> None:
    """Bring one live trial's state up to date and decide on a restart."""
    for a in t.attempts:
        if a.state in _LIVE_ATTEMPT_STATES:
            _apply_status(a, statuses.get(a.job_id), now)
    for a in t.attempts[:-1]:  # requeued by Slurm or resubmitted: a newer attempt exists
        if a.state in _LIVE_ATTEMPT_STATES:
            a.state = "SUPERSEDED"
        if not a.cause:
            a.cause = superseded_cause(a)
            a.lost_steps = _lost_steps(t, a)
    t.restarts = max(0, len(t.attempts) - 1)
    if t.needs_job:
        return  # already judged; waits for its new job
    current = t.attempts[-1] if t.attempts else None
    status = statuses.get(current.job_id) if current is not None else None
    verdict = judge(current, status, _heartbeat_age(t, current), now)
    if current is not None and verdict.cause and (verdict.resubmit or verdict.state.is_terminal):
        current.cause = verdict.cause
        current.lost_steps = _lost_steps(t, current)
    if verdict.resubmit and current is not None:
        # Cancel the old job whatever Slurm last said of it: if Slurm requeued it
        # meanwhile, two runs of one trial would share its checkpoint folder.
        cancels.append(current.job_id)
        if verdict.cancel_job:
            current.state = "SUPERSEDED"
        if verdict.counted and t.crashes >= max_restarts:
            _end_trial(
                s,
                t,
                TrialState.FAILED,
                now,
                current,
                f"crashed {t.crashes + 1} time(s)"
                f" (max_restarts {max_restarts}); last: exit code {current.exit_code}"
                f" of job {current.job_id}",
            )
            return
        t.crashes += int(verdict.counted)
        t.needs_job = True
        t.state = TrialState.PENDING.value
        log_event(
            s,
            "trial.restart",
            f"attempt {current.attempt_key} ended ({verdict.cause}); submitting again"
            f" (restart {t.restarts + 1}, crashes {t.crashes}/{max_restarts})",
            t.experiment_id,
            t.id,
        )
        return
    if verdict.state.value != t.state:
        if verdict.state.is_terminal:
            _end_trial(s, t, verdict.state, now, current, "")
        else:
            t.state = verdict.state.value
            log_event(
                s,
                f"trial.{verdict.state.value.lower()}",
                verdict.state.value,
                t.experiment_id,
                t.id,
            )


def _end_trial(
    s: Session, t: Trial, state: TrialState, now: datetime, last: Attempt | None, error: str
) -> None:
    t.state = state.value
    t.ended_at = now
    t.needs_job = False
    if error:
        t.error = "\n".join(x for x in (error, _log_tail(last) if last else "") if x)
    log_event(s, f"trial.{state.value.lower()}", error or state.value, t.experiment_id, t.id)


def _finish(s: Session, exp: Experiment, state: ExperimentState, why: str, now: datetime) -> None:
    exp.state = state.value
    exp.ended_at = now
    log_event(s, f"experiment.{state.value.lower()}", why or state.value, exp.id)
