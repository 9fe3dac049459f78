"""A simulated cluster behind the real scheduler contract (:class:`BaseScheduler`).

:class:`SimCluster` runs no processes. It keeps its tasks in memory, moves them
along a :class:`~dlhpc.simulate._clock.VirtualClock`, and writes exactly the
files a real job writes (see :mod:`dlhpc.harness.worker` and
:mod:`dlhpc.protocol`), stamped with virtual times, so the reconciler cannot
tell it from Slurm:

* ``submit``: one task per trial folder (job ids ``<array>_<index>``), PENDING
  until its queue wait (exponential, mean ``queue_wait_s``, seeded) has passed
  and enough GPUs are free: ``nodes * gpus_per_node`` of ``gpus``, one slot when
  the experiment asks for no GPU; first fit in order of eligibility, and at most
  ``max_concurrent`` running tasks per submission (the array throttle ``%N``).
* A started task reads ``trial.json`` (hyperparameters, grant = ``max_length``),
  resumes from its trial's last checkpoint (this cluster remembers one per trial
  folder), spends ``startup_s``, then trains epoch after epoch, each taking the
  curve's seconds; every epoch ends with a ``metric`` record (step = epoch, the
  searcher metric) and a ``checkpoint`` record. At its grant it exits 0.
  Records are published once per :meth:`SimCluster.advance_to` (a tick), with
  a ``start`` record first and an ``exit`` record (code, reason, signal, step,
  checkpoint_step) last; ``heartbeat.json`` is rewritten with the virtual time.
  A task that reached its grant exits ``teardown_s`` after its last epoch (the
  job's last checkpoint and exit; 0 by default).
* Interruptions lose the epoch in progress (checkpoints are per epoch):
  preemption, a Poisson process of ``preempt_rate`` per running GPU-hour, writes
  ``exit`` code 75 reason ``requeue`` signal ``TERM`` and leaves the job
  PREEMPTED (not requeued: the reconciler submits the trial again); the time
  limit (``resources.time`` minus ``preemption.lead_time``) writes code 75 signal
  ``USR2`` and requeues the task under the same id as attempt ``.r<n+1>`` after
  a new queue wait, as ``scontrol requeue`` does; the trial's
  :data:`~dlhpc.protocol.STOP_FILE` makes it exit 75 within
  :data:`STOP_NOTICE_S`; ``cancel`` ends a running task with code 75 signal
  ``TERM`` (CANCELLED) and drops a pending one.

All randomness comes from one generator seeded by ``ClusterSpec.seed`` and drawn
in event order, so the same calls give the same history.
"""

from __future__ import annotations

import heapq
import json
import os
import random
from collections import Counter
from collections.abc import Collection
from datetime import datetime, timezone
from pathlib import Path

from dlhpc.errors import SchedulerError
from dlhpc.protocol import (
    HEARTBEAT_FILE,
    REQUEUE_EXIT_CODE,
    EventWriter,
    TrialSpec,
    atomic_write_text,
    attempt_dir,
    attempt_key,
    stop_requested,
    trial_file,
)
from dlhpc.scheduler.base import BaseScheduler, JobRequest, JobState, JobStatus, SubmittedTask
from dlhpc.simulate._clock import VirtualClock
from dlhpc.simulate._curves import CurveSource
from dlhpc.simulate._tasks import ClusterSpec, SimStats, Task, TaskArray

__all__ = ["STOP_NOTICE_S", "SimCluster"]

STOP_NOTICE_S = 2.0  # the harness looks for the stop file every 2 s
_BEAT_EVERY_S = 60.0  # rewrite heartbeats this often (stale after 180 s)


def _dt(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, tz=timezone.utc).replace(tzinfo=None)


class SimCluster(BaseScheduler):
    """The simulated backend (module docstring); ``name`` is ``"sim"``."""

    name = "sim"

    def __init__(self, clock: VirtualClock, curves: CurveSource, spec: ClusterSpec) -> None:
        if spec.gpus < 1:
            raise ValueError("a simulated cluster needs at least one GPU")
        self.clock = clock
        self.curves = curves
        self.spec = spec
        self.now = clock.time()
        self.free = spec.gpus
        self.stats = SimStats()
        self.calls: Counter[str] = Counter()
        self._rng = random.Random(f"dlhpc.sim.cluster:{spec.seed}")
        self._tasks: dict[str, Task] = {}
        self._arrays: dict[str, TaskArray] = {}
        self._next_array = 1001
        self._seq = 0
        self._waiting: list[tuple[float, int, str]] = []  # not eligible yet
        self._ready: list[Task] = []  # eligible, waiting for GPUs (eligibility order)
        self._events: list[tuple[float, int, str, int]] = []  # (time, seq, job, version)
        self._running: dict[str, Task] = {}
        self._checkpoints: dict[Path, int] = {}  # trial folder -> epochs checkpointed
        self._dirty: set[str] = set()

    # -- the contract ----------------------------------------------------------

    def render(self, request: JobRequest) -> list[str]:
        gpus = self._gpus(request)
        lines = [
            f"# dlhpc simulated array {request.name!r}: {len(request.trial_dirs)} task(s),"
            f" {gpus} GPU slot(s) each, at most {request.max_concurrent or 'all'} at a time",
            *(f"# task {i}: {d}" for i, d in enumerate(request.trial_dirs)),
        ]
        return ["\n".join(lines) + "\n"]

    def submit(self, request: JobRequest) -> list[SubmittedTask]:
        """Queue one task per trial folder; each becomes eligible after its queue wait."""
        self.calls["submit"] += 1
        self._sync()
        gpus = self._gpus(request)
        if gpus > self.spec.gpus:
            raise SchedulerError(f"a task needs {gpus} GPUs; the cluster has {self.spec.gpus}")
        array_id = str(self._next_array)
        self._next_array += 1
        array = TaskArray(request.name, request.max_concurrent)
        self._arrays[array_id] = array
        out = []
        limit_s = max(1.0, request.resources.time_minutes * 60.0 - request.preemption.lead_time_s)
        for i, trial in enumerate(request.trial_dirs):
            job_id = f"{array_id}_{i}"
            task = Task(job_id, array_id, Path(trial), gpus, limit_s, self._next_seq(), 0.0)
            self._tasks[job_id] = task
            array.job_ids.append(job_id)
            self._enqueue(task)
            logs = self.log_paths(request.folder, job_id)
            out.append(SubmittedTask(Path(trial), job_id, logs[0], logs[1]))
        return out

    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        self.calls["poll"] += 1
        self._sync()
        out = {}
        for jid in job_ids:
            t = self._tasks.get(jid)
            if t is None:
                out[jid] = JobStatus(jid, JobState.UNKNOWN)
                continue
            out[jid] = JobStatus(
                job_id=jid,
                state=t.state,
                raw_state=t.state.value,
                node_list="sim-node" if t.start is not None else "",
                start=_dt(t.start),
                end=_dt(t.end),
                exit_code=t.exit_code,
            )
        return out

    def cancel(self, job_ids: Collection[str]) -> None:
        """Running tasks exit 75 (TERM) now and become CANCELLED; queued ones just end."""
        self.calls["cancel"] += 1
        self._sync()
        for jid in job_ids:
            t = self._tasks.get(jid)
            if t is None or t.state.is_terminal:
                continue
            self.stats.cancels += 1
            if t.state == JobState.RUNNING:
                self._finish(t, self.now, REQUEUE_EXIT_CODE, "requeue", "TERM", JobState.CANCELLED)
            else:
                t.state, t.end, t.version = JobState.CANCELLED, self.now, t.version + 1
                if t in self._ready:
                    self._ready.remove(t)
        self._flush()

    def log_paths(self, folder: Path, job_id: str) -> list[Path]:
        return [folder / f"sim-{job_id}.out", folder / f"sim-{job_id}.err"]

    def find_jobs(self, name: str) -> list[str]:
        return [j for a in self._arrays.values() if a.name == name for j in a.job_ids]

    # -- time ------------------------------------------------------------------

    def next_event_time(self) -> float | None:
        """When something next happens on the cluster (None: nothing ever will)."""
        if self._ready and self.free > 0 and self._can_start_any():
            return self.now  # GPUs freed by a cancel since advance_to started what fit
        return self._next_time()

    def advance_to(self, t: float) -> None:
        """Run the cluster up to virtual time ``t``, then publish files and heartbeats."""
        if t < self.now:
            return
        for task in self._running.values():  # stop files written since the last call
            if task.stop_at == float("inf") and stop_requested(task.trial_dir):
                task.stop_at = min(self.now + STOP_NOTICE_S, t)
                self._push(task)
        while True:
            self._schedule()
            nxt = self._next_time()
            if nxt is None or nxt > t:
                break
            self.now = max(self.now, nxt)
            if self._events and self._events[0][0] <= self.now:
                _, _, jid, version = heapq.heappop(self._events)
                task = self._tasks[jid]
                if version == task.version and task.state == JobState.RUNNING:
                    self._step(task)
        self.now = t
        for task in self._running.values():
            if t - task.last_beat >= _BEAT_EVERY_S:
                self._beat(task)
        self._flush()

    def finalize(self) -> None:
        """Count the running segments' GPU time up to now (at the end of a simulation)."""
        for task in self._running.values():
            self.stats.gpu_s += (self.now - task.seg_start) * task.gpus
            self.stats.wasted_gpu_s += (self.now - task.seg_start - task.useful_s) * task.gpus

    # -- internals -------------------------------------------------------------

    def _sync(self) -> None:
        if self.clock.time() > self.now:
            self.advance_to(self.clock.time())

    def _gpus(self, request: JobRequest) -> int:
        r = request.resources
        return max(1, r.nodes * r.gpus_per_node)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _enqueue(self, task: Task) -> None:
        wait = self._rng.expovariate(1.0 / self.spec.queue_wait_s) if self.spec.queue_wait_s else 0
        task.eligible_at = self.now + wait
        task.version += 1
        heapq.heappush(self._waiting, (task.eligible_at, task.seq, task.job_id))

    def _stale(self, event: tuple[float, int, str, int]) -> bool:
        task = self._tasks[event[2]]
        return event[3] != task.version or task.state != JobState.RUNNING

    def _next_time(self) -> float | None:
        while self._events and self._stale(self._events[0]):
            heapq.heappop(self._events)
        times = [self._events[0][0]] if self._events else []
        if self._waiting:
            times.append(self._waiting[0][0])
        return min(times) if times else None

    def _can_start_any(self) -> bool:
        return any(
            t.gpus <= self.free and self._throttle_ok(self._arrays[t.array]) for t in self._ready
        )

    def _throttle_ok(self, array: TaskArray) -> bool:
        return array.max_concurrent <= 0 or array.running < array.max_concurrent

    def _schedule(self) -> None:
        """Make due tasks eligible, then start what fits (first fit, eligibility order)."""
        while self._waiting and self._waiting[0][0] <= self.now:
            _, _, jid = heapq.heappop(self._waiting)
            task = self._tasks[jid]
            if task.state in (JobState.PENDING, JobState.REQUEUED):
                self._ready.append(task)
        if not self._ready or self.free <= 0:
            return
        keep = []
        for task in self._ready:
            array = self._arrays[task.array]
            if task.gpus <= self.free and self._throttle_ok(array):
                self._start(task)
            else:
                keep.append(task)
        self._ready = keep

    def _start(self, t: Task) -> None:
        spec = TrialSpec.read(trial_file(t.trial_dir))
        self.free -= t.gpus
        self._arrays[t.array].running += 1
        self._running[t.job_id] = t
        self.stats.starts += 1
        self.stats.events += 1
        now = self.now
        t.state, t.start, t.seg_start, t.useful_s = JobState.RUNNING, now, now, 0.0
        t.end = t.exit_code = None
        t.curve = self.curves.curve(spec.hparams, spec.seed)
        t.grant, t.metric, t.ckpt_dir = spec.max_length, spec.metric, spec.checkpoint_dir
        t.epoch = self._checkpoints.get(t.trial_dir, 0)
        t.epoch_len = self._epoch_s(t)
        t.next_epoch_end = now + self.spec.startup_s + t.epoch_len
        rate = self.spec.preempt_rate * t.gpus / 3600.0
        t.preempt_at = now + self._rng.expovariate(rate) if rate > 0 else float("inf")
        t.limit_at = now + t.limit_s
        t.stop_at = float("inf")
        t.tearing_down = False
        adir = attempt_dir(t.trial_dir, attempt_key(t.job_id, t.restart))
        t.writer = EventWriter(adir, "worker-r0")
        t.writer.add(
            "start",
            time=now,
            host="sim-node",
            pid=0,
            job_id=t.job_id,
            restart=t.restart,
            rank=0,
            nodes="sim-node",
        )
        self._dirty.add(t.job_id)
        self._beat(t)
        self._push(t)

    def _epoch_s(self, t: Task) -> float:
        if t.epoch >= t.grant or t.curve is None:
            return 0.0
        return t.curve.seconds(t.epoch + 1)

    def _push(self, t: Task) -> None:
        at = min(t.next_epoch_end, t.preempt_at, t.limit_at, t.stop_at)
        heapq.heappush(self._events, (at, self._next_seq(), t.job_id, t.version))

    def _step(self, t: Task) -> None:
        """The task's next event is due at ``self.now``."""
        self.stats.events += 1
        now = self.now
        if t.next_epoch_end <= now and t.next_epoch_end <= min(t.preempt_at, t.limit_at, t.stop_at):
            if t.epoch < t.grant and t.curve is not None and t.writer is not None:
                t.epoch += 1
                value = t.curve.value(t.epoch)
                t.writer.add("metric", time=now, step=t.epoch, metrics={t.metric: value})
                t.writer.add("checkpoint", time=now, step=t.epoch, path=_ckpt_path(t), size=0)
                self._checkpoints[t.trial_dir] = t.epoch
                t.useful_s += t.epoch_len
                self.stats.epochs += 1
                self._dirty.add(t.job_id)
            if t.epoch >= t.grant and self.spec.teardown_s > 0 and not t.tearing_down:
                t.tearing_down = True  # the last checkpoint and the exit take teardown_s
                t.next_epoch_end = now + self.spec.teardown_s
                self._push(t)
            elif t.epoch >= t.grant:
                self._finish(t, now, 0, "completed", None, JobState.COMPLETED)
            else:
                t.epoch_len = self._epoch_s(t)
                t.next_epoch_end = now + t.epoch_len
                self._push(t)
        elif t.stop_at <= min(t.preempt_at, t.limit_at):
            self.stats.stops += 1
            self._finish(t, now, REQUEUE_EXIT_CODE, "requeue", None, JobState.FAILED)
        elif t.preempt_at <= t.limit_at:
            self.stats.preemptions += 1
            self._finish(t, now, REQUEUE_EXIT_CODE, "requeue", "TERM", JobState.PREEMPTED)
        else:  # USR2 before the time limit: exit 75, then the task requeues itself
            self.stats.timeouts += 1
            self._finish(t, now, REQUEUE_EXIT_CODE, "requeue", "USR2", JobState.REQUEUED)
            t.restart += 1
            t.end = None
            self._enqueue(t)

    def _finish(
        self, t: Task, now: float, code: int, reason: str, sig: str | None, state: JobState
    ) -> None:
        assert t.writer is not None  # running tasks have one
        t.writer.add(
            "exit",
            time=now,
            code=code,
            reason=reason,
            signal=sig,
            step=t.epoch,
            checkpoint_step=self._checkpoints.get(t.trial_dir, 0),
        )
        t.writer.flush()
        self._dirty.discard(t.job_id)
        t.writer = None
        self.stats.gpu_s += (now - t.seg_start) * t.gpus
        self.stats.wasted_gpu_s += (now - t.seg_start - t.useful_s) * t.gpus
        self.free += t.gpus
        self._arrays[t.array].running -= 1
        self._running.pop(t.job_id, None)
        t.state, t.end, t.exit_code, t.version = state, now, code, t.version + 1

    def _beat(self, t: Task) -> None:
        adir = attempt_dir(t.trial_dir, attempt_key(t.job_id, t.restart))
        atomic_write_text(adir / HEARTBEAT_FILE, json.dumps({"time": self.now, "pid": 0}))
        os.utime(adir / HEARTBEAT_FILE, (self.now, self.now))  # stamped by the virtual clock
        t.last_beat = self.now

    def _flush(self) -> None:
        for jid in self._dirty:
            w = self._tasks[jid].writer
            if w is not None:
                w.flush()
        self._dirty.clear()


def _ckpt_path(t: Task) -> str:
    """Where a real job would publish this epoch's checkpoint; no folder is made: the
    GC marks its row deleted as missing, so the active rows stay as few as in a real run."""
    return str(Path(t.ckpt_dir) / f"ckpt-{t.epoch:010d}") if t.ckpt_dir else f"sim:{t.epoch}"
