"""dlhpc's searchers for ``bench_search_lcbench.py``: a method's searcher as an experiment
file makes it (:func:`make_method`, for the ask/tell driver ``_lcbench_driver.py``), and
the product's own path to check the driver against (:func:`run_dlhpc`: a real ``launch``
and ``tick`` on the simulated cluster of ``dlhpc simulate``, :mod:`dlhpc.simulate`; its
decisions read back by :func:`store_decisions`), curves and epoch times from the LCBench
surrogate.

A method is a YAML ``searcher:`` mapping (exactly what an experiment file holds, e.g.
``{name: asha, proposer: tpe}``), so a searcher added to dlhpc runs here by its name and
settings, without changes to this file. The experiment file is written to a scratch
folder and read by :func:`dlhpc.config.load_experiment`, so the searcher's own
settings rules apply. Keys the mapping leaves out get the benchmark's values
(:func:`searcher_section`; ``max_trials``: :func:`natural_trials`).

One run is :func:`run_dlhpc`: as :func:`dlhpc.simulate.simulate_once` (the same
:class:`SimCluster`, :class:`VirtualClock`, ``launch`` and ``tick`` loop with idle
stretches skipped), except that it ends when the run has trained ``budget`` epochs
(every method's budget) and that it records each trained epoch in a :class:`Trace`
(the cluster's virtual time when the epoch ended, its seconds, its value).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from _lcbench_measures import Trace
from _lcbench_surrogate import MAX_LENGTH, SPACE, Curve, Surrogate
from sqlalchemy import select

from dlhpc.config import load_experiment
from dlhpc.config.schema import ExperimentConfig
from dlhpc.orchestrator import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.search import BaseSearcher, SearcherTable, make_searcher
from dlhpc.simulate import SIM_EPOCH, ClusterSpec, SimCluster, VirtualClock, drive, sim_config
from dlhpc.store import Decision, Store, Trial


@dataclass(frozen=True)
class SimKnobs:
    """The simulated cluster: ``workers`` GPUs; the rest as ``dlhpc simulate``'s options."""

    workers: int
    tick_interval_s: float = 60.0
    queue_wait_s: float = 0.0
    startup_s: float = 0.0
    time_scale: float = 1.0  # multiplies the surrogate's epoch seconds


def searcher_section(given: Mapping[str, Any], budget: int, workers: int) -> dict[str, Any]:
    """``given`` plus the benchmark's values of the keys it leaves out: the metric
    (val_accuracy, larger is better), ``max_length`` 50 and ``max_concurrent_trials`` =
    ``workers``. ``max_trials`` (when not given) is set by :func:`natural_trials`."""
    out = dict(given)
    out.setdefault("metric", "val_accuracy")
    out.setdefault("smaller_is_better", False)
    out.setdefault("max_length", MAX_LENGTH)
    out.setdefault("max_concurrent_trials", workers)
    return out


def expected_spend(searcher: Any, divisor: int) -> float | None:
    """Epochs a rung-based searcher spends when each rung keeps 1/divisor of the one below
    it: sum over brackets of trials * sum_k (l_k - l_(k-1)) / divisor^k (None: the
    searcher has no ``brackets``)."""
    brackets = getattr(searcher, "brackets", None)
    if not brackets:
        return None
    return float(
        sum(
            b.trials
            * sum(
                (hi - lo) / divisor**k
                for k, (lo, hi) in enumerate(zip((0, *b.lengths), b.lengths, strict=False))
            )
            for b in brackets
        )
    )


def natural_trials(cfg: ExperimentConfig, budget: int, workers: int) -> int:
    """``max_trials`` for a run of ``budget`` epochs: for a searcher with rungs
    (``brackets``), the largest count whose :func:`expected_spend` fits the budget (as
    scripts/bench/search/bench_search.py); for any other, the full trainings the budget
    pays for plus ``workers`` (the runs still going when it is spent)."""
    sc = cfg.searcher

    def spend(n: int) -> float | None:
        made = make_searcher(cfg.hyperparameters, dataclasses.replace(sc, max_trials=n))
        return expected_spend(made, sc.divisor)

    if spend(1) is None:
        return math.ceil(budget / sc.max_length) + workers
    lo, hi = 1, 2
    while (spend(hi) or 0.0) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # spend(lo) <= budget < spend(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if (spend(mid) or 0.0) <= budget else (lo, mid)
    return lo


def experiment_text(section: Mapping[str, Any]) -> str:
    """The experiment file of one method (``section``: the complete searcher mapping)."""
    space: dict[str, Any] = {}
    for name, hp in SPACE.items():
        entry: dict[str, Any] = {"type": hp.type, "minval": hp.minval, "maxval": hp.maxval}
        if hp.type == "log":
            entry["base"] = hp.base
        if hp.count is not None:
            entry["count"] = hp.count
        space[name] = entry
    doc = {
        "name": "lcbench",
        "entrypoint": "python train.py",
        "resources": {"time": "30-00:00:00", "gpus_per_node": 1},
        "hyperparameters": space,
        "searcher": dict(section),
    }
    return yaml.safe_dump(doc, sort_keys=False)


def load_method(section: Mapping[str, Any], folder: Path) -> ExperimentConfig:
    """The :class:`ExperimentConfig` of ``section`` (ConfigError: the searcher's rules
    refuse it, with the mapping's field)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "experiment.yaml"
    path.write_text(experiment_text(section))
    return load_experiment(path, site="local", searchers=SearcherTable())


def method_config(
    section: Mapping[str, Any], folder: Path, budget: int, workers: int
) -> ExperimentConfig:
    """:func:`load_method`, with :func:`natural_trials` when ``section`` has no max_trials
    (the loader checks the searcher's rules again with the count it gets)."""
    if "max_trials" in section:
        return load_method(section, folder)
    first = load_method({**section, "max_trials": 1}, folder)
    return load_method({**section, "max_trials": natural_trials(first, budget, workers)}, folder)


def make_method(section: Mapping[str, Any], budget: int, workers: int) -> BaseSearcher:
    """A fresh searcher of ``section`` (complete) as :func:`run_dlhpc` runs it: read from
    an experiment file (the loader's rules; :func:`method_config`) in a temporary
    folder, removed at once."""
    with tempfile.TemporaryDirectory(prefix="dlhpc-lcbench-") as folder:
        cfg = method_config(section, Path(folder), budget, workers)
    return make_searcher(cfg.hyperparameters, cfg.searcher)


class _SimCurve:
    """A surrogate curve as the simulated cluster reads it; records every epoch it ends."""

    def __init__(self, curve: Curve, source: LCBenchSource) -> None:
        self._curve, self._source = curve, source

    def value(self, epoch: int) -> float:
        v = self._curve.values[epoch - 1]
        self._source.record(self.seconds(epoch), v)
        return v

    def seconds(self, epoch: int) -> float:
        return self._curve.seconds[epoch - 1] * self._source.time_scale


class LCBenchSource:
    """A :class:`dlhpc.simulate.CurveSource` over one task; ``record`` feeds ``trace``
    with the cluster's time (``cluster`` is set once the cluster exists)."""

    def __init__(self, surrogate: Surrogate, task: str, trace: Trace, time_scale: float) -> None:
        self.label = f"LCBench task {task}"
        self.surrogate, self.task, self.trace, self.time_scale = surrogate, task, trace, time_scale
        self.cluster: SimCluster | None = None
        self.start = 0.0

    def record(self, epoch_s: float, value: float) -> None:
        now = self.cluster.now if self.cluster is not None else self.start
        self.trace.add(now - self.start, epoch_s, value)

    def curve(self, hparams: Mapping[str, Any], seed: int) -> _SimCurve:
        return _SimCurve(self.surrogate.curve(self.task, hparams), self)

    def true_final(self, hparams: Mapping[str, Any], length: int) -> float:
        return self.surrogate.curve(self.task, hparams).values[length - 1]

    def max_epoch_seconds(self) -> float:
        return math.inf  # not known ahead; the time limit is 30 days


def run_dlhpc(
    section: Mapping[str, Any],
    surrogate: Surrogate,
    task: str,
    seed: int,
    budget: int,
    knobs: SimKnobs,
    scratch: Path | None = None,
    inspect: Callable[[Store, int], None] | None = None,
) -> tuple[Trace, dict[str, Any]]:
    """One run of the searcher ``section`` (complete, see :func:`searcher_section`);
    returns its trace and facts (trials, ticks, how it ended). The run's store, file
    protocol and simulated jobs live in a fresh folder under ``scratch`` (None: the
    system's temporary folder), removed at the end; a memory file system there (e.g.
    /dev/shm) saves the fsyncs and deletes of thousands of small files and changes
    nothing that is measured (the clock is virtual). ``inspect(store, experiment id)``,
    when given, reads the store at the end, before it is removed."""
    root = Path(tempfile.mkdtemp(prefix="dlhpc-lcbench-", dir=scratch))
    trace = Trace(budget)
    try:
        exp = method_config(section, root / "exp", budget, knobs.workers)
        cfg = sim_config(exp, seed, root / "sim")
        clock = VirtualClock()
        source = LCBenchSource(surrogate, task, trace, knobs.time_scale)
        source.start = clock.time()
        spec = ClusterSpec(knobs.workers, knobs.queue_wait_s, 0.0, knobs.startup_s, seed=seed)
        cluster = SimCluster(clock, source, spec)
        source.cluster = cluster
        store = Store(root / "home")
        try:
            backends = BackendTable().with_backend(Backend("sim", lambda _root: cluster))
            pool = SchedulerPool(local_root=root / "home" / "local", backends=backends)
            exp_id = launch(cfg, store, pool).experiment_id
            end, ticks = _drive(store, pool, cluster, clock, knobs, exp_id, trace)
            cluster.finalize()
            facts = {
                "end": end,
                "max_trials": cfg.searcher.max_trials,
                "ticks": ticks,
                "starts": cluster.stats.starts,  # trial starts, a resumed trial again
                "cluster_gpu_hours": cluster.stats.gpu_s / 3600,
            }
            if inspect is not None:
                inspect(store, exp_id)
        finally:
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return trace, facts


_ENDS = {  # how drive() ended -> the run's "end" fact
    "stopped": "budget",
    "finished": "searcher done before the budget",
    "stalled": "stalled",
}


def _drive(
    store: Store,
    pool: SchedulerPool,
    cluster: SimCluster,
    clock: VirtualClock,
    knobs: SimKnobs,
    exp_id: int,
    trace: Trace,
) -> tuple[str, int]:
    """Tick until the budget is spent or the experiment ends; (how it ended, ticks)."""
    how, ticks = drive(
        store, pool, cluster, clock, exp_id, knobs.tick_interval_s, stop=lambda: trace.full
    )
    return _ENDS[how], ticks


def store_decisions(
    store: Store, exp_id: int
) -> tuple[list[tuple[float, str, int, Any]], dict[int, int]]:
    """What the searcher of ``exp_id`` decided, from the store: (virtual seconds since the
    start, kind, request id, x) per created trial (x: its hyperparameters as JSON), per
    promotion and per stop (x: the length), ordered by time, kind and request id; and
    the last length told per request id. ``launch`` creates the first trials before
    the virtual clock starts (stamped with the real time): they count as created at 0."""
    start = datetime.fromtimestamp(SIM_EPOCH, tz=timezone.utc).replace(tzinfo=None)

    def at(when: datetime) -> float:
        return max(0.0, round((when - start).total_seconds(), 6))

    with store.read() as s:
        trials = s.scalars(select(Trial).where(Trial.experiment_id == exp_id)).all()
        rid = {t.id: t.request_id for t in trials}
        out: list[tuple[float, str, int, Any]] = [
            (at(t.created_at), "create", t.request_id, t.hparams_json) for t in trials
        ]
        out += [
            (at(d.decided_at), d.kind, rid[d.trial_id], d.length)
            for d in s.scalars(select(Decision).where(Decision.experiment_id == exp_id))
        ]
        told = {t.request_id: t.told_step for t in trials}
    return sorted(out, key=lambda d: (d[0], d[1], d[2])), told
