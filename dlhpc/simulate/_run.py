"""One simulated run: the real ``launch`` and ``tick`` against a :class:`SimCluster`.

:func:`simulate_once` makes a fresh state folder (a real :class:`Store`, on
``/dev/shm`` when there is one), launches the experiment with its backend set
to ``"sim"`` (a :class:`SchedulerPool` holding the simulated cluster), then
alternates ``cluster.advance_to(now)`` and ``tick(store, pool, clock)`` every
``tick_interval_s`` virtual seconds until the experiment is terminal or
``max_days`` have passed. Only the scheduler backend and the clock differ from
a real run.

Idle stretches are skipped: after enough idle ticks in a row (no file
ingested, nothing submitted, no decision, no cluster event) to outlast the
reconciler's grace periods, the clock jumps to the first tick at or after the
cluster's next event, keeping ticks on the ``tick_interval_s`` grid.

The configuration a run *ends with* is its best COMPLETED trial by the searcher
metric at its final step; it *found the best* when that configuration's
noise-free final value is within the reference's top fraction
(:class:`~dlhpc.simulate._curves.BestReference`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from dlhpc._perms import remove_tree
from dlhpc.config.schema import ExperimentConfig
from dlhpc.orchestrator import launch, tick
from dlhpc.orchestrator.decide import stop_grace
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.orchestrator.recovery import EXIT_RECORD_GRACE
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.simulate._clock import VirtualClock
from dlhpc.simulate._cluster import SimCluster
from dlhpc.simulate._curves import BestReference, CurveSource
from dlhpc.simulate._tasks import ClusterSpec, SimStats
from dlhpc.states import TrialState
from dlhpc.store import Attempt, Decision, Experiment, Store, Trial

__all__ = [
    "DEFAULT_STARTUP_S",
    "RunResult",
    "SimSettings",
    "drive",
    "sim_config",
    "simulate_once",
]

DEFAULT_STARTUP_S = 30.0  # a job's start-up when neither given nor measured


@dataclass(frozen=True)
class SimSettings:
    """The simulated cluster and the simulation's own knobs."""

    gpus: int = 8
    queue_wait_s: float = 60.0
    preempt_rate: float = 0.0  # per running GPU-hour
    startup_s: float | None = None  # None: recorded curves' measured start-up, else 30 s
    teardown_s: float | None = None  # None: recorded curves' measured exit time, else 0 s
    tick_interval_s: float = 60.0
    max_days: float = 30.0  # virtual time limit of one run
    top: float = 0.05  # "the best" = the top 5 % of the space
    epoch_s: float | None = None  # synthetic curves; None: from resources.time


@dataclass
class RunResult:
    """One simulated run. ``state`` is the experiment's final state, or TIME_LIMIT
    (``max_days`` passed) or STALLED (nothing running, queued or due, yet not done)."""

    searcher: str
    rep: int
    state: str
    gpu_hours: float
    wall_hours: float
    wasted_gpu_hours: float
    epochs: int  # trial-epochs trained (checkpointed; a lost epoch is not counted)
    best_metric: float | None  # the chosen trial's observed final metric
    best_true: float | None  # its noise-free final metric
    found_best: bool
    best_hparams: dict[str, Any] | None
    trials: int
    completed: int
    stopped_early: int
    failed: int
    promotions: int
    stops: int
    preemptions: int
    timeouts: int
    attempt_causes: dict[str, int]
    ticks: int
    real_s: float


def sim_config(cfg: ExperimentConfig, offset: int, root: Path) -> ExperimentConfig:
    """``cfg`` for one simulated run: backend ``sim``, the searcher and
    reproducibility seeds moved by ``offset``, an empty workdir (no
    code is run) and checkpoints under ``root``."""
    code = root / "code"
    code.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(
        cfg,
        backend="sim",  # a backend only the simulator registers (see simulate_once)
        workdir=code,
        searcher=dataclasses.replace(cfg.searcher, seed=(cfg.searcher.seed + offset) % 2**31),
        reproducibility=dataclasses.replace(
            cfg.reproducibility, seed=(cfg.reproducibility.seed + offset) % 2**31
        ),
        checkpoint=dataclasses.replace(cfg.checkpoint, dir=root / "checkpoints"),
    )


def _scratch() -> Path:
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and shm.stat().st_mode & 0o002 else None
    return Path(tempfile.mkdtemp(prefix="dlhpc-sim-", dir=base))


def simulate_once(
    cfg: ExperimentConfig,
    source: CurveSource,
    settings: SimSettings,
    reference: BestReference,
    *,
    rep: int = 0,
    offset: int = 0,
    home: Path | None = None,
) -> RunResult:
    """Simulate ``cfg`` (its ``searcher.name`` as given) once; see the module docstring.

    ``offset`` moves the seeds (searcher, trials, cluster). With ``home`` the
    state folder is kept there for inspection, else a temporary one is removed.
    """
    t0 = time.monotonic()
    root = home or _scratch()
    try:
        run_cfg = sim_config(cfg, offset, root / "sim")
        clock = VirtualClock()
        spec = ClusterSpec(
            settings.gpus,
            settings.queue_wait_s,
            settings.preempt_rate,
            DEFAULT_STARTUP_S if settings.startup_s is None else settings.startup_s,
            settings.teardown_s or 0.0,
            seed=offset,
        )
        cluster = SimCluster(clock, source, spec)
        store = Store(root / "home")
        try:
            backends = BackendTable().with_backend(Backend("sim", lambda _root: cluster))
            pool = SchedulerPool(local_root=root / "home" / "local", backends=backends)
            exp_id = launch(run_cfg, store, pool).experiment_id
            state, ticks = _drive(store, pool, cluster, clock, settings, exp_id)
            cluster.finalize()
            result = _result(store, exp_id, cfg, source, reference, cluster.stats, state, rep)
            result.wall_hours = clock.elapsed() / 3600
            result.ticks = ticks
            result.real_s = time.monotonic() - t0
            return result
        finally:
            store.close()
    finally:
        if home is None:
            remove_tree(root, ignore_errors=True)


def _drive(
    store: Store,
    pool: SchedulerPool,
    cluster: SimCluster,
    clock: VirtualClock,
    settings: SimSettings,
    exp_id: int,
) -> tuple[str, int]:
    """Tick until the experiment ends; returns (final state, ticks)."""
    end = clock.time() + settings.max_days * 86400
    how, ticks = drive(store, pool, cluster, clock, exp_id, settings.tick_interval_s, end=end)
    if how == "finished":
        with store.read() as s:
            exp = s.get(Experiment, exp_id)
            return (exp.state if exp else "UNKNOWN"), ticks
    return ("STALLED" if how == "stalled" else "TIME_LIMIT"), ticks


def drive(
    store: Store,
    pool: SchedulerPool,
    cluster: SimCluster,
    clock: VirtualClock,
    exp_id: int,
    interval: float,
    *,
    end: float | None = None,
    stop: Callable[[], bool] | None = None,
) -> tuple[str, int]:
    """Run real ``tick`` passes every ``interval`` virtual seconds, the simulated
    cluster advanced before each, until the experiment finishes; returns how it
    ended and the ticks run. ``finished``: the tick finished ``exp_id``;
    ``stalled``: idle, with no simulated event left; ``time_limit``: the next tick
    would pass ``end``; ``stopped``: ``stop()`` was true (asked before each tick).
    While nothing changes for longer than the exit-record and stop graces, the
    clock jumps to the tick before the cluster's next event."""
    grace = max(EXIT_RECORD_GRACE, stop_grace()).total_seconds()
    idle_needed = math.ceil(grace / interval) + 1
    idle = ticks = 0
    while True:
        events = cluster.stats.events
        cluster.advance_to(clock.time())
        if stop is not None and stop():
            return "stopped", ticks
        report = tick(store, pool, clock)
        ticks += 1
        if report.errors:
            raise RuntimeError(f"simulated tick failed: {'; '.join(report.errors)}")
        if exp_id in report.finished:
            return "finished", ticks
        busy = report.ingested_files or report.submitted or report.decisions
        idle = 0 if busy or cluster.stats.events != events else idle + 1
        nxt = clock.time() + interval
        if idle >= idle_needed:
            due = cluster.next_event_time()
            if due is None:
                return "stalled", ticks
            if due > nxt:
                nxt = clock.time() + math.ceil((due - clock.time()) / interval) * interval
        if end is not None and nxt > end:
            return "time_limit", ticks
        clock.advance_to(nxt)


def _result(
    store: Store,
    exp_id: int,
    cfg: ExperimentConfig,
    source: CurveSource,
    reference: BestReference,
    stats: SimStats,
    state: str,
    rep: int,
) -> RunResult:
    length = cfg.searcher.max_length
    sib = cfg.searcher.smaller_is_better
    with store.read() as s:
        trials = s.scalars(select(Trial).where(Trial.experiment_id == exp_id)).all()
        kinds = Counter(s.scalars(select(Decision.kind).where(Decision.experiment_id == exp_id)))
        causes = Counter(
            s.scalars(select(Attempt.cause).join(Trial).where(Trial.experiment_id == exp_id)).all()
        )
    states = Counter(t.state for t in trials)
    done = [
        t
        for t in trials
        if t.state == TrialState.COMPLETED.value
        and t.steps_completed >= length
        and t.latest_metric is not None
    ]
    chosen = None
    if done:
        chosen = min(done, key=lambda t: ((t.latest_metric or 0.0) * (1 if sib else -1), t.id))
    hparams = json.loads(chosen.hparams_json) if chosen is not None else None
    true = source.true_final(hparams, length) if hparams is not None else None
    return RunResult(
        searcher=cfg.searcher.name,
        rep=rep,
        state=state,
        gpu_hours=stats.gpu_s / 3600,
        wall_hours=0.0,
        wasted_gpu_hours=stats.wasted_gpu_s / 3600,
        epochs=stats.epochs,
        best_metric=chosen.latest_metric if chosen is not None else None,
        best_true=true,
        found_best=true is not None and reference.is_best(true),
        best_hparams=hparams,
        trials=len(trials),
        completed=states[TrialState.COMPLETED.value],
        stopped_early=states[TrialState.STOPPED_EARLY.value],
        failed=states[TrialState.FAILED.value],
        promotions=kinds["promote"],
        stops=kinds["stop"],
        preemptions=stats.preemptions,
        timeouts=stats.timeouts,
        attempt_causes={k or "-": v for k, v in sorted(causes.items())},
        ticks=0,
        real_s=0.0,
    )
