"""``dlhpc tick``: one idempotent reconciliation pass over all active experiments.

The pass (:func:`_tick`) is four steps, as in docs/ARCHITECTURE.md; each commits on
its own and reads only what the steps before it committed or returned:

* **poll** (:func:`_poll`): this user's ACTIVE experiments and their live jobs, and
  one ``poll`` per backend for all those jobs (a constant number of queries);
* **ingest** (:func:`_ingest`): the event files not ingested yet (keyed per file);
* **decide** (:func:`_decide`): per experiment, adopt what a crash left submitting,
  reconcile its trials and let its searcher decide (one commit each);
* **act** (:func:`_act`): the jobs the scheduler holds on its own released or
  cancelled (:mod:`dlhpc.orchestrator.held`); per experiment decided, stop files and
  cancels, then the submission of its pending trials
  (:mod:`dlhpc.orchestrator.submit`), then the checkpoint keep policy
  (:mod:`dlhpc.orchestrator.checkpoints`).

Killing the process at any line loses nothing: every step is recomputed from the
scheduler, the files and the DB on the next pass. A pass whose database cannot commit
because its filesystem is full stops there, acts on nothing, and frees what dlhpc holds
there (:func:`_free_space`), so that an experiment that filled its own disk recovers.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from dlhpc._failpoints import failpoint
from dlhpc.errors import DlhpcError, LeaseHeldError, SchedulerError, StoreError
from dlhpc.orchestrator._reconcile import Decided, reconcile_experiment
from dlhpc.orchestrator._scan import Scan, pending_attempt_dirs, scan
from dlhpc.orchestrator.adopt import recover_submissions
from dlhpc.orchestrator.checkpoints import gc_pass
from dlhpc.orchestrator.clock import SYSTEM_CLOCK, Clock, store_clock
from dlhpc.orchestrator.decide import write_stop_files
from dlhpc.orchestrator.eventlog import log_event
from dlhpc.orchestrator.held import settle_held
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.submit import submit_pending
from dlhpc.protocol import split_attempt_key
from dlhpc.scheduler import JobStatus
from dlhpc.store import Event, Store, Trial, is_disk_full
from dlhpc.store.ingest import ingest_attempts
from dlhpc.store.summaries import refresh_metrics

__all__ = ["TickReport", "tick"]

# attempt folders per write transaction: each commit costs fsyncs (more on NFS), and a
# batch holds the write lock while it is applied, so readers wait at most one batch
_INGEST_BATCH = 256


@dataclass
class TickReport:
    experiments: int = 0
    polled_jobs: int = 0
    ingested_files: int = 0
    metrics: int = 0
    submitted: int = 0
    decisions: int = 0  # searcher promotions and stops acted on
    released: int = 0  # jobs the scheduler held on its own, released (held.py)
    held_cancelled: int = 0  # such jobs cancelled instead
    checkpoint_bytes_freed: int = 0  # by the checkpoint GC (keep policy)
    finished: list[int] = field(default_factory=list)
    scheduler_calls: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    lease_held_elsewhere: bool = False
    errors: list[str] = field(default_factory=list)
    # the pass stopped: its database cannot commit (a full filesystem); one line, why
    stalled: str | None = None


def tick(store: Store, pool: SchedulerPool, clock: Clock = SYSTEM_CLOCK) -> TickReport:
    """One pass; a concurrent reconciler makes this one return with ``lease_held_elsewhere``.

    ``clock`` is the real one except in the simulator (``dlhpc simulate``); the pass
    reads it on the state folder's filesystem (:func:`~dlhpc.orchestrator.clock.store_clock`)."""
    report = TickReport()
    t0 = time.monotonic()
    calls_before = pool.calls()
    try:
        with store.hold_lease():
            clock = store_clock(store, clock)
            try:
                _tick(store, pool, report, clock)
            except StoreError as err:
                if not is_disk_full(err):
                    raise
                _free_space(store, report, clock, err)  # under the lease it holds
    except LeaseHeldError:
        report.lease_held_elsewhere = True
    except StoreError as err:  # taking the lease did not commit
        if not is_disk_full(err):
            raise
        _free_space(store, report, clock, err)  # the copy's lease row says who may
    report.scheduler_calls = dict(pool.calls() - calls_before)
    report.duration_s = time.monotonic() - t0
    return report


def _tick(store: Store, pool: SchedulerPool, report: TickReport, clock: Clock) -> None:
    """The pass under the lease: poll, ingest, decide, act (see the module docstring)."""
    polled = _poll(store, pool, report, clock)
    runs = _ingest(store, pool, polled, report, clock)
    queued = _decide(store, pool, polled, runs, report, clock)
    _act(store, pool, polled.held, queued, report, clock)


@dataclass(frozen=True)
class _Polled:
    """What the poll step read (:func:`scan`), the polled jobs' states by job id, and
    the jobs each backend's scheduler holds on its own (any of the user's, by id)."""

    scan: Scan
    statuses: dict[str, JobStatus]
    held: dict[str, dict[str, JobStatus]]


def _poll(store: Store, pool: SchedulerPool, report: TickReport, clock: Clock) -> _Polled:
    """Poll: read the ACTIVE experiments and their live jobs (one read transaction),
    poll each backend once for all its jobs (:func:`_poll_jobs`), and tell, once per
    experiment, when its backend cannot read ended jobs' states."""
    read = scan(store, clock.now())
    report.experiments = len(read.exp_ids)
    statuses = _poll_jobs(pool, read.jobs, report)
    held = {b: pool.get(b).system_held() for b in read.jobs}
    _note_no_accounting(store, pool, read.jobs, read.backend_of)
    failpoint("tick.after_poll")
    return _Polled(read, statuses, held)


def _ingest(
    store: Store, pool: SchedulerPool, polled: _Polled, report: TickReport, clock: Clock
) -> dict[str, list[str]]:
    """Ingest: every event file not ingested yet in the listed trials' attempt folders
    (:func:`_ingest_batches`); then, for the jobs the scheduler restarted under the
    same id, its record of their runs (:func:`_requeued_runs`), returned for the
    decide step."""
    read = polled.scan
    todo = pending_attempt_dirs([*read.scanned, *read.settling], read.done_files, report.errors)
    _ingest_batches(store, todo, report, clock)
    failpoint("tick.after_ingest")
    # only a scanned live trial's folders can be in todo (a settling trial's are not
    # looked up: it is terminal)
    trial_backend = {t.id: read.backend_of[t.experiment_id] for t in read.scanned}
    return _requeued_runs(pool, todo, read.done_files, trial_backend, report)


def _decide(
    store: Store,
    pool: SchedulerPool,
    polled: _Polled,
    runs: dict[str, list[str]],
    report: TickReport,
    clock: Clock,
) -> list[Decided]:
    """Decide, per experiment: adopt the jobs of a submission a crash left unrecorded
    (:func:`recover_submissions`), then reconcile its trials and let its searcher
    decide (:func:`reconcile_experiment`, one commit). Returns what the act step
    must do, per experiment; one whose step fails with an error it expects (the
    scheduler's; a DlhpcError or ValueError while deciding) is left out, its error
    in ``report``."""
    queued = []
    for exp_id in polled.scan.exp_ids:
        try:
            recover_submissions(store, pool, exp_id, clock)
        except SchedulerError as err:
            report.errors.append(f"experiment {exp_id}: recovering a submission: {err}")
            continue  # never resubmit while the orphan's jobs may exist
        try:
            decided = reconcile_experiment(store, exp_id, polled.statuses, report, clock, runs)
        except (DlhpcError, ValueError) as err:
            if is_disk_full(err):
                raise  # no experiment can commit: the pass stops (see tick)
            # e.g. its searcher's optional dependency vanished, or its saved state does
            # not load: keep the other experiments moving, and say so every pass
            report.errors.append(f"experiment {exp_id}: {type(err).__name__}: {err}")
            continue
        if decided is not None:
            queued.append(decided)
    failpoint("tick.after_decide")
    return queued


def _act(
    store: Store,
    pool: SchedulerPool,
    held: dict[str, dict[str, JobStatus]],
    queued: list[Decided],
    report: TickReport,
    clock: Clock,
) -> None:
    """Act, after the decisions committed: release or cancel the jobs the scheduler
    holds on its own (:func:`settle_held`: a trial whose job could not be released
    waits for a new one, submitted below); then, per queued experiment, stop what it
    decided to stop (:func:`_stop`), submit its pending trials
    (:func:`submit_pending`: the pass's one submission step), apply the checkpoint
    keep policy. The scheduler's errors go into ``report``; a failed stop leaves the
    experiment's submission and keep policy to the next pass."""
    settle_held(store, pool, held, report)
    for d in queued:
        if not _stop(pool, d, report):
            continue
        try:
            report.submitted += len(submit_pending(store, pool, d.exp_id, clock, cfg=d.cfg))
        except SchedulerError as err:
            report.errors.append(f"experiment {d.exp_id}: {err}")
        gc_pass(store, d.exp_id, report)  # the checkpoint keep policy; errors into the report


def _stop(pool: SchedulerPool, decided: Decided, report: TickReport) -> bool:
    """Write the stop files of the running trials asked to stop (rewritten each pass)
    and cancel the jobs that must stop; False, with the error in ``report``, when
    that fails for a reason it expects."""
    try:
        write_stop_files(decided.stopping)
        if decided.cancels:
            pool.get(decided.backend).cancel(decided.cancels)
    except (DlhpcError, ValueError) as err:
        report.errors.append(f"experiment {decided.exp_id}: {type(err).__name__}: {err}")
        return False
    return True


def _poll_jobs(
    pool: SchedulerPool, by_backend: dict[str, list[str]], report: TickReport
) -> dict[str, JobStatus]:
    """One ``poll`` per backend for all its live jobs: their states, by job id. A
    failed poll gives no states this pass, never wrong ones (its error: ``report``)."""
    statuses: dict[str, JobStatus] = {}
    for backend, job_ids in by_backend.items():
        report.polled_jobs += len(job_ids)
        try:
            statuses.update(pool.get(backend).poll(job_ids))
        except SchedulerError as err:
            report.errors.append(f"poll {backend}: {err}")  # no states this pass, retry next
    return statuses


_NO_ACCOUNTING = "scheduler.no_accounting"


def _note_no_accounting(
    store: Store, pool: SchedulerPool, polled: dict[str, list[str]], backend_of: dict[int, str]
) -> None:
    """Once per experiment, an event saying its backend cannot read ended jobs' states
    (Slurm without accounting): its jobs are then judged by their exit files."""
    blind = {b for b in polled if not pool.get(b).accounting_available}
    exp_ids = [e for e, b in backend_of.items() if b in blind]
    if not exp_ids:
        return
    told = select(Event.experiment_id).where(
        Event.kind == _NO_ACCOUNTING, Event.experiment_id.in_(exp_ids)
    )
    with store.read() as s:  # most passes: every one told already, and no write
        if set(exp_ids) <= set(s.scalars(told)):
            return
    with store.write() as s:
        for exp_id in sorted(set(exp_ids) - set(s.scalars(told))):
            log_event(
                s,
                _NO_ACCOUNTING,
                f"{backend_of[exp_id]}: accounting (sacct) is unavailable; jobs that left the"
                " queue are judged by their exit files (an ended job's exit code and cause are"
                " known only from what its worker wrote)",
                exp_id,
            )


def _requeued_runs(
    pool: SchedulerPool,
    todo: list[tuple[int, Path]],
    done: dict[tuple[int, str], set[str]],
    backend_of_trial: dict[int, str],
    report: TickReport,
) -> dict[str, list[str]]:
    """The scheduler's record of every run of the jobs it restarted under the same id
    (a new attempt folder ``<job>.r<k>``, k >= 1, this pass): one query per backend,
    only on such passes. It names the cause of the attempt the restart replaced
    (Slurm 24.11 requeues a preempted task whatever its exit)."""
    by_backend: dict[str, set[str]] = defaultdict(set)
    for trial_id, adir in todo:
        parts = split_attempt_key(adir.name)
        new = (trial_id, adir.name) not in done
        if parts is not None and parts[1] >= 1 and new and trial_id in backend_of_trial:
            by_backend[backend_of_trial[trial_id]].add(parts[0])
    runs: dict[str, list[str]] = {}
    for backend, jobs in by_backend.items():
        try:
            runs.update(pool.get(backend).run_states(sorted(jobs)))
        except (SchedulerError, ValueError) as err:
            report.errors.append(f"run states {backend}: {err}")
    return runs


def _ingest_batches(
    store: Store, todo: list[tuple[int, Path]], report: TickReport, clock: Clock
) -> None:
    """Ingest in batches: one transaction per batch (a commit costs fsyncs on NFS).
    The trials' metric summaries are refreshed per batch in three grouped queries.
    (The curve archives are the reports' to rewrite: ``report._load``.)"""
    for i in range(0, len(todo), _INGEST_BATCH):
        with store.write() as s:
            chunk = todo[i : i + _INGEST_BATCH]
            trials = {
                t.id: t
                for t in s.scalars(
                    select(Trial).where(Trial.id.in_(sorted({tid for tid, _ in chunk})))
                )
            }
            folders = [(trials[tid], adir) for tid, adir in chunk if tid in trials]
            results = ingest_attempts(s, folders, clock.now())
            for result in results:
                report.ingested_files += result.files
                report.metrics += result.metrics
                report.errors.extend(result.warnings)
            refresh_metrics(s, list({t.id: t for t, _ in folders}.values()))
        failpoint("tick.after_ingest_batch")


def _free_space(store: Store, report: TickReport, clock: Clock, err: StoreError) -> None:
    """The pass could not commit (``err``: the database's filesystem is full): record
    nothing, act on nothing, and free the space the keep policy frees.

    The pass's ingest and keep policy run on a copy of the database in memory
    (:meth:`Store.memory_copy`): the committed state plus the files not ingested yet
    (the checkpoints that filled the disk among them). The folders that policy
    deletes are removed for real; their rows, here, are marked on a later pass
    (a folder already gone: 0 bytes). A trial's newest checkpoint is never among
    them while the trial is live. ``report.stalled`` says it all in one line."""
    shadow = store.memory_copy()
    scratch = TickReport()
    try:
        read = scan(shadow, clock.now())
        todo = pending_attempt_dirs([*read.scanned, *read.settling], read.done_files, [])
        _ingest_batches(shadow, todo, scratch, clock)
        for exp_id in read.exp_ids:
            gc_pass(shadow, exp_id, scratch)
    except (DlhpcError, OSError) as copy_err:
        scratch.errors.append(f"{type(copy_err).__name__}: {copy_err}")
    finally:
        shadow.close()
    freed = f"freed {scratch.checkpoint_bytes_freed} bytes of superseded checkpoints"
    trouble = f" ({'; '.join(scratch.errors)})" if scratch.errors else ""
    report.checkpoint_bytes_freed = scratch.checkpoint_bytes_freed
    report.stalled = f"{err}: nothing recorded or submitted this pass; {freed}{trouble}"
