"""Repeated simulated runs of an experiment's searcher and its alternatives.

:func:`compare` runs :func:`~dlhpc.simulate._run.simulate_once` ``reps`` times
for each searcher (the experiment's own first, then the alternatives, each with
the experiment's space, length and everything else, only ``searcher.name``
changed) and summarises them (:class:`SearcherSummary`: medians and the
fraction of runs that found the best configuration). Rep ``r`` moves every seed
by ``seed * 10007 + r`` and is the same for every searcher (common random
numbers: the same synthetic landscape, queue waits drawn from the same
generator), so differences between searchers are not sampling noise of the
landscape. An alternative is the YAML with only ``searcher.name`` changed (an
unset ``max_concurrent_trials`` takes the new searcher's default). A searcher
that cannot run this space is skipped with the reason (grid needs ``count`` on
every range; a searcher not implemented yet; a missing optional dependency).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlhpc.config.schema import ExperimentConfig, SearcherConfig
from dlhpc.config.searcher_rules import default_concurrency
from dlhpc.errors import DlhpcError, UsageError
from dlhpc.search import make_searcher, searcher_class, searcher_names
from dlhpc.simulate._curves import (
    BestReference,
    CurveSource,
    SyntheticCurves,
    best_reference,
)
from dlhpc.simulate._recorded import RecordedCurves, load_recorded
from dlhpc.simulate._run import DEFAULT_STARTUP_S, RunResult, SimSettings, simulate_once
from dlhpc.store import Store
from dlhpc.store.store import DB_NAME

__all__ = [
    "Comparison",
    "SearcherSummary",
    "compare",
    "curve_sources",
    "searcher_problem",
]


@dataclass
class SearcherSummary:
    searcher: str
    runs: list[RunResult]

    def _median(self, values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    def to_json(self) -> dict[str, Any]:
        r = self.runs
        return {
            "searcher": self.searcher,
            "reps": len(r),
            "median_gpu_hours": self._median([x.gpu_hours for x in r]),
            "median_wall_hours": self._median([x.wall_hours for x in r]),
            "median_epochs": self._median([x.epochs for x in r]),
            "p_best": sum(x.found_best for x in r) / len(r) if r else None,
            "median_best_metric": self._median([x.best_metric for x in r]),
            "median_trials": self._median([x.trials for x in r]),
            "median_promotions": self._median([x.promotions for x in r]),
            "median_stops": self._median([x.stops for x in r]),
            "median_preemptions": self._median([x.preemptions for x in r]),
            "states": dict(Counter(x.state for x in r)),
            "runs": [dataclasses.asdict(x) for x in r],
        }


@dataclass
class Comparison:
    experiment: str
    metric: str
    smaller_is_better: bool
    curves: str
    settings: SimSettings
    reps: int
    seed: int
    references: list[BestReference]
    summaries: list[SearcherSummary] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    real_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        ref = self.references[0]
        return {
            "experiment": self.experiment,
            "metric": self.metric,
            "smaller_is_better": self.smaller_is_better,
            "curves": self.curves,
            "settings": dataclasses.asdict(self.settings),
            "reps": self.reps,
            "seed": self.seed,
            "best": {
                "definition": (
                    f"the run's best COMPLETED trial has a noise-free final {self.metric} in"
                    f" the top {ref.top:.0%} of the space ({ref.samples} samples)"
                ),
                "thresholds": [r.threshold for r in self.references],
                "optima": [r.optimum for r in self.references],
            },
            "searchers": [s.to_json() for s in self.summaries],
            "skipped": self.skipped,
            "real_seconds": self.real_s,
        }


def _alternative(cfg: ExperimentConfig, name: str) -> SearcherConfig:
    """``cfg.searcher`` with searcher ``name``, as the YAML with only ``name`` changed
    would load: an unset ``max_concurrent_trials`` gets that searcher's default."""
    section = cfg.raw.get("searcher")
    given = isinstance(section, dict) and section.get("max_concurrent_trials") is not None
    concurrency = cfg.searcher.max_concurrent_trials
    if not given:
        concurrency = default_concurrency(searcher_class(name))
    return dataclasses.replace(
        cfg.searcher,
        name=name,
        max_concurrent_trials=concurrency,
    )


def searcher_problem(cfg: ExperimentConfig, name: str) -> str | None:
    """Why searcher ``name`` cannot search ``cfg``'s space (None: it can)."""
    if name not in searcher_names():
        return f"unknown searcher (known: {', '.join(searcher_names())})"
    try:
        make_searcher(cfg.hyperparameters, _alternative(cfg, name))
    except NotImplementedError:
        return "not implemented yet"
    except (ValueError, DlhpcError) as err:  # a space it refuses; a missing dependency
        return str(err)
    return None


def _epoch_s(cfg: ExperimentConfig, settings: SimSettings) -> float:
    if settings.epoch_s is not None:
        return settings.epoch_s
    limit = cfg.resources.time_minutes * 60 - cfg.preemption.lead_time_s
    return max(1.0, 0.5 * limit / max(1, cfg.searcher.max_length))


def curve_sources(
    cfg: ExperimentConfig, spec: str, settings: SimSettings, home: Path
) -> tuple[Callable[[int], CurveSource], str]:
    """A factory ``offset -> CurveSource`` for ``--curves spec`` and its label.

    ``synthetic``: a new landscape per offset; ``experiment:ID``: that
    experiment's curves in the state folder ``home`` (the same for every offset).
    """
    space, sib = cfg.hyperparameters, cfg.searcher.smaller_is_better
    length = cfg.searcher.max_length
    if spec == "synthetic":
        epoch_s = _epoch_s(cfg, settings)
        label = f"synthetic family, ~{epoch_s:.3g} s per epoch"
        return (lambda off: SyntheticCurves(space, length, sib, epoch_s, seed=off)), label
    kind, _, ident = spec.partition(":")
    if kind != "experiment" or not ident.isdigit():
        raise UsageError(f"--curves: expected 'synthetic' or 'experiment:ID', got {spec!r}")
    if not (home / DB_NAME).exists():
        raise UsageError(f"--curves {spec}: no state database at {home / DB_NAME}")
    store = Store(home)
    try:
        recorded = load_recorded(store, int(ident), cfg.searcher.metric, space)
    finally:
        store.close()
    return (lambda _off: recorded), f"recorded curves of {recorded.label}"


def _measured_defaults(settings: SimSettings, source: CurveSource) -> SimSettings:
    """``settings`` with an unset start-up and teardown filled in: those its jobs had
    for recorded curves, else 30 s and 0 s."""
    rec = source if isinstance(source, RecordedCurves) else None
    return dataclasses.replace(
        settings,
        startup_s=settings.startup_s
        if settings.startup_s is not None
        else (rec.startup_s if rec else DEFAULT_STARTUP_S),
        teardown_s=settings.teardown_s
        if settings.teardown_s is not None
        else (rec.teardown_s if rec else 0.0),
    )


def _check_fits(cfg: ExperimentConfig, source: CurveSource, settings: SimSettings) -> None:
    gpus = max(1, cfg.resources.nodes * cfg.resources.gpus_per_node)
    if gpus > settings.gpus:
        raise UsageError(f"a trial needs {gpus} GPUs; --gpus is {settings.gpus}")
    limit = cfg.resources.time_minutes * 60 - cfg.preemption.lead_time_s
    need = source.max_epoch_seconds() + (settings.startup_s or 0.0)
    if need >= limit:
        raise UsageError(
            f"an epoch (up to {need:.0f} s with startup) does not fit the time limit"
            f" {cfg.resources.time} minus the {cfg.preemption.lead_time_s} s lead time:"
            " a trial would never finish"
        )


def compare(
    cfg: ExperimentConfig,
    searchers: Sequence[str],
    settings: SimSettings,
    *,
    curves: str = "synthetic",
    reps: int = 5,
    seed: int = 0,
    home: Path | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> Comparison:
    """Simulate each of ``searchers`` (the experiment's own is added first) ``reps``
    times; ``home`` is the state folder ``experiment:ID`` curves come from.
    ``progress(searcher, rep)`` is called before each run."""
    t0 = time.monotonic()
    factory, label = curve_sources(cfg, curves, settings, home or Path("."))
    offsets = [seed * 10007 + r for r in range(reps)]
    sources = [factory(off) for off in offsets]
    sml, length = cfg.searcher.smaller_is_better, cfg.searcher.max_length
    refs = [best_reference(src, cfg.hyperparameters, length, sml, settings.top) for src in sources]
    settings = _measured_defaults(settings, sources[0])
    _check_fits(cfg, sources[0], settings)
    out = Comparison(cfg.name, cfg.searcher.metric, sml, label, settings, reps, seed, refs)
    for name in dict.fromkeys([cfg.searcher.name, *searchers]):
        problem = searcher_problem(cfg, name)
        if problem is not None:
            out.skipped[name] = problem
            continue
        run_cfg = dataclasses.replace(cfg, searcher=_alternative(cfg, name))
        runs = []
        for rep, (off, src, ref) in enumerate(zip(offsets, sources, refs, strict=True)):
            if progress is not None:
                progress(name, rep)
            runs.append(simulate_once(run_cfg, src, settings, ref, rep=rep, offset=off))
        out.summaries.append(SearcherSummary(name, runs))
    out.real_s = time.monotonic() - t0
    return out
