"""Learning curves for simulated trials: a synthetic family, or a finished experiment.

A :class:`CurveSource` maps a trial's hyperparameters (and its seed) to a
:class:`Curve`: the searcher metric it reports after each epoch and how long
each epoch takes. An epoch is the unit of ``max_length`` and of the metric's
step, as in the digits example. Every source also gives the noise-free final
value of a configuration (:meth:`CurveSource.true_final`), which is how a run is
judged to have found the best configuration (:func:`best_reference`).

* :class:`SyntheticCurves`: a deterministic family with a known best
  configuration. Each non-constant hyperparameter is scaled to ``u`` in [0, 1]
  (log ranges on their exponents, categoricals by index); the family draws an
  optimum ``c`` and weights ``w`` from its seed. The curve is
  ``g(e) = A * (1 - exp(-e / tau))`` plus small per-epoch noise, with the
  asymptote ``A = 0.55 + 0.45 * exp(-sum w (u - c)^2 / (0.08 sum w))`` (1 at the
  optimum) and the speed ``tau`` set by one "learning-rate-like" dimension:
  values above its optimum learn fast and plateau lower, so early leaders are not
  always the final winners (curves cross). ``g`` becomes an accuracy-like
  metric ``0.1 + 0.89 g`` or, when smaller is better, a loss ``0.05 + 2.25 (1 - g)``.
  Epochs take ``epoch_s`` times 0.75..1.25 (one "model-size" dimension) with 3 %
  jitter.
* :class:`RecordedCurves`: each configuration gets the curve of the nearest
  recorded trial (normalised hyperparameter distance, categoricals 0/1), read by
  :func:`load_recorded` from a finished experiment in the DB; epoch durations
  come from the times of its metric records. An attempt's first record comes
  after the job's start-up too (imports, data, restore), which the simulated
  cluster adds by itself: the experiment's start-up (``startup_s``, the median
  over attempts of the first record's delay after the attempt's start minus the
  trial's own median epoch) is taken off those first epochs, so that it is not
  counted twice. Past its last recorded step a curve stays flat at its last value.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import select

from dlhpc.config.model import HParam
from dlhpc.errors import UsageError
from dlhpc.search import sample
from dlhpc.states import TrialState
from dlhpc.store import Attempt, Experiment, Metric, Store, Trial

__all__ = [
    "BestReference",
    "Curve",
    "CurveSource",
    "RecordedCurves",
    "RecordedTrial",
    "SyntheticCurves",
    "best_reference",
    "load_recorded",
    "unit_value",
]


class Curve(Protocol):
    def value(self, epoch: int) -> float:
        """The metric reported after ``epoch`` epochs (1-based; same answer every time)."""
        ...

    def seconds(self, epoch: int) -> float:
        """How long epoch ``epoch`` takes, in seconds (> 0)."""
        ...


class CurveSource(Protocol):
    label: str

    def curve(self, hparams: Mapping[str, Any], seed: int) -> Curve:
        """The curve of a trial with these hyperparameters and trial seed."""
        ...

    def true_final(self, hparams: Mapping[str, Any], length: int) -> float:
        """The noise-free metric of these hyperparameters after ``length`` epochs."""
        ...

    def max_epoch_seconds(self) -> float:
        """An upper bound of any epoch's duration (to check it fits the time limit)."""
        ...


def unit_value(hp: HParam, value: Any) -> float | None:
    """``value`` of ``hp`` scaled to [0, 1] (None for constants and unusable values)."""
    try:
        if hp.type == "categorical":
            vals = list(hp.vals)
            if len(vals) < 2:
                return 0.5
            return vals.index(value) / (len(vals) - 1) if value in vals else None
        if hp.type in ("int", "double", "log") and hp.minval is not None and hp.maxval is not None:
            x = float(value)
            if hp.type == "log":
                x = math.log(x, hp.base)
            span = float(hp.maxval) - float(hp.minval)
            return 0.5 if span <= 0 else min(1.0, max(0.0, (x - float(hp.minval)) / span))
    except (TypeError, ValueError):
        return None
    return None


def _value_at(hp: HParam, u: float) -> Any:
    """The hyperparameter value at unit position ``u`` (inverse of :func:`unit_value`)."""
    if hp.type == "categorical":
        vals = list(hp.vals)
        return vals[round(u * (len(vals) - 1))] if len(vals) > 1 else vals[0]
    lo, hi = float(hp.minval or 0.0), float(hp.maxval or 0.0)
    x = lo + u * (hi - lo)
    if hp.type == "int":
        return round(x)
    return hp.base**x if hp.type == "log" else x


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@dataclass(frozen=True)
class _SynthCurve:
    asymptote: float
    tau: float
    epoch_s: float
    seed: int
    smaller_is_better: bool
    noise: float = 0.005

    def _metric(self, g: float) -> float:
        return 0.05 + 2.25 * (1.0 - g) if self.smaller_is_better else 0.1 + 0.89 * g

    def clean(self, epoch: int) -> float:
        return self._metric(self.asymptote * (1.0 - math.exp(-epoch / self.tau)))

    def value(self, epoch: int) -> float:
        rng = random.Random(f"dlhpc.sim.noise:{self.seed}:{epoch}")
        g = self.asymptote * (1.0 - math.exp(-epoch / self.tau)) + rng.gauss(0.0, self.noise)
        return self._metric(min(1.0, max(0.0, g)))

    def seconds(self, epoch: int) -> float:
        rng = random.Random(f"dlhpc.sim.epoch:{self.seed}:{epoch}")
        return self.epoch_s * (1.0 + rng.uniform(-0.03, 0.03))


class SyntheticCurves:
    """The built-in family (module docstring); deterministic in (space, seed)."""

    def __init__(
        self,
        space: Mapping[str, HParam],
        max_length: int,
        smaller_is_better: bool,
        epoch_s: float,
        seed: int = 0,
    ) -> None:
        self.label = f"synthetic (seed {seed})"
        self.space = dict(space)
        self.max_length = max(1, max_length)
        self.smaller_is_better = smaller_is_better
        self.epoch_s = epoch_s
        rng = random.Random(f"dlhpc.sim.synthetic:{seed}")
        self.dims = [n for n in sorted(space) if space[n].type != "const"]
        self.center: dict[str, float] = {}
        self.weight: dict[str, float] = {}
        for name in self.dims:
            hp = space[name]
            if hp.type == "categorical" and len(hp.vals) > 1:
                self.center[name] = rng.randrange(len(hp.vals)) / (len(hp.vals) - 1)
            else:
                self.center[name] = rng.uniform(0.2, 0.8)
            self.weight[name] = rng.uniform(0.5, 1.5)
        ranges = [n for n in self.dims if space[n].type != "categorical"] or self.dims
        self.speed_dim = rng.choice(ranges) if ranges else None
        self.cost_dim = rng.choice(ranges) if ranges else None

    def _units(self, hparams: Mapping[str, Any]) -> dict[str, float]:
        out = {}
        for name in self.dims:
            u = unit_value(self.space[name], hparams.get(name))
            out[name] = self.center[name] if u is None else u
        return out

    def _curve(self, hparams: Mapping[str, Any], seed: int) -> _SynthCurve:
        u = self._units(hparams)
        total_w = sum(self.weight.values()) or 1.0
        dist = sum(self.weight[n] * (u[n] - self.center[n]) ** 2 for n in self.dims)
        asymptote = 0.55 + 0.45 * math.exp(-dist / (0.08 * total_w))
        s = u[self.speed_dim] - self.center[self.speed_dim] if self.speed_dim else 0.0
        tau = self.max_length * (0.04 + 0.16 * (1.0 - _sigmoid(6.0 * s)))
        cost = 0.75 + 0.5 * u[self.cost_dim] if self.cost_dim else 1.0
        return _SynthCurve(asymptote, tau, self.epoch_s * cost, seed, self.smaller_is_better)

    def curve(self, hparams: Mapping[str, Any], seed: int) -> Curve:
        return self._curve(hparams, seed)

    def true_final(self, hparams: Mapping[str, Any], length: int) -> float:
        return self._curve(hparams, 0).clean(length)

    def max_epoch_seconds(self) -> float:
        return self.epoch_s * 1.25 * 1.03

    def best_config(self) -> dict[str, Any]:
        """The configuration with the highest asymptote (the family's known best)."""
        out = {n: _value_at(self.space[n], self.center[n]) for n in self.dims}
        out.update({n: hp.value for n, hp in self.space.items() if hp.type == "const"})
        return out


@dataclass(frozen=True)
class RecordedTrial:
    """One finished trial's curve: the metric at steps 1..n and each epoch's seconds."""

    hparams: dict[str, Any]
    values: tuple[float, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class _Recorded:
    trial: RecordedTrial

    def value(self, epoch: int) -> float:
        return self.trial.values[min(max(epoch, 1), len(self.trial.values)) - 1]

    def seconds(self, epoch: int) -> float:
        return self.trial.seconds[min(max(epoch, 1), len(self.trial.seconds)) - 1]


@dataclass
class RecordedCurves:
    """Nearest recorded trial in normalised hyperparameter space (module docstring)."""

    space: Mapping[str, HParam]
    trials: list[RecordedTrial]
    label: str = "recorded"
    startup_s: float = 0.0  # measured start-up, taken off each attempt's first epoch
    _cache: dict[str, RecordedTrial] = field(default_factory=dict)

    def _distance(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
        d = 0.0
        for name, hp in self.space.items():
            if hp.type == "const" or name not in b:
                continue
            if hp.type == "categorical":
                d += 0.0 if a.get(name) == b[name] else 1.0
                continue
            ua, ub = unit_value(hp, a.get(name)), unit_value(hp, b[name])
            d += 1.0 if ua is None or ub is None else (ua - ub) ** 2
        return d

    def nearest(self, hparams: Mapping[str, Any]) -> RecordedTrial:
        key = json.dumps(dict(hparams), sort_keys=True, default=str)
        if key not in self._cache:
            self._cache[key] = min(self.trials, key=lambda t: self._distance(hparams, t.hparams))
        return self._cache[key]

    def curve(self, hparams: Mapping[str, Any], seed: int) -> Curve:
        return _Recorded(self.nearest(hparams))

    def true_final(self, hparams: Mapping[str, Any], length: int) -> float:
        return _Recorded(self.nearest(hparams)).value(length)

    def max_epoch_seconds(self) -> float:
        return max(max(t.seconds) for t in self.trials)


def _durations(
    rows: list[tuple[int, float, int]], starts: dict[int, float | None]
) -> list[tuple[float, bool]]:
    """(seconds, from the attempt's start) of each (step, time, attempt id) row in step
    order: since the previous row of the same attempt, else since the attempt's start
    (start-up included; NaN when the start is unknown)."""
    out: list[tuple[float, bool]] = []
    prev: tuple[float, int] | None = None
    for _step, at, attempt in rows:
        if prev is not None and prev[1] == attempt:
            out.append((max(at - prev[0], 1e-3), False))
        else:
            start = starts.get(attempt)
            out.append((max(at - start, 1e-3) if start is not None else math.nan, True))
        prev = (at, attempt)
    return out


def _without_startup(per_trial: list[list[tuple[float, bool]]]) -> tuple[list[list[float]], float]:
    """Each trial's step seconds with the measured start-up taken off its attempts'
    first steps, and that start-up (0 when no attempt has two records to tell it)."""
    own = [[d for d, first in ds if not first and math.isfinite(d)] for ds in per_trial]
    every = [d for ds in own for d in ds]
    if not every:
        return [[d for d, _first in ds] for ds in per_trial], 0.0
    shared = statistics.median(every)
    delays = [
        d - (statistics.median(mine) if mine else shared)
        for ds, mine in zip(per_trial, own, strict=True)
        for d, first in ds
        if first and math.isfinite(d)
    ]
    startup = max(0.0, statistics.median(delays)) if delays else 0.0
    out = [[max(d - startup, 1e-3) if first else d for d, first in ds] for ds in per_trial]
    return out, startup


def load_recorded(
    store: Store, experiment_id: int, metric: str, space: Mapping[str, HParam]
) -> RecordedCurves:
    """The curves of experiment ``experiment_id``'s trials that reported ``metric``
    (COMPLETED trials only when there are any). UsageError when there is nothing to use."""
    with store.read() as s:
        exp = s.get(Experiment, experiment_id)
        if exp is None:
            raise UsageError(f"--curves experiment:{experiment_id}: no such experiment")
        trials = s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)).all()
        rows = s.execute(
            select(Metric.trial_id, Metric.step, Metric.value, Metric.time, Metric.attempt_id)
            .join(Trial, Trial.id == Metric.trial_id)
            .where(Trial.experiment_id == experiment_id, Metric.name == metric)
            .order_by(Metric.trial_id, Metric.step)
        ).all()
        starts = {
            a.id: a.started_at.timestamp() if a.started_at else None
            for a in s.scalars(
                select(Attempt).join(Trial).where(Trial.experiment_id == experiment_id)
            )
        }
    by_trial: dict[int, list[tuple[int, float | None, float, int]]] = {}
    for trial_id, step, value, at, attempt in rows:
        by_trial.setdefault(trial_id, []).append((step, value, at, attempt))
    done = [t for t in trials if t.state == TrialState.COMPLETED.value and t.id in by_trial]
    use = done or [t for t in trials if t.id in by_trial]
    if not use:
        raise UsageError(
            f"--curves experiment:{experiment_id}: no trial reported {metric!r}"
            f" (the metric of the experiment being simulated)"
        )
    timed = [_durations([(st, at, att) for st, _v, at, att in by_trial[t.id]], starts) for t in use]
    per_trial, startup = _without_startup(timed)
    recorded = []
    for t, durations in zip(use, per_trial, strict=True):
        points = by_trial[t.id]
        values: list[float] = []
        seconds: list[float] = []
        last = math.nan
        for (step, value, _at, _att), dur in zip(points, durations, strict=True):
            if step < 1:
                continue  # a step-0 report (before training) is not an epoch
            while len(values) < step - 1:  # skipped steps keep the previous value
                values.append(last)
                seconds.append(dur)
            last = value if value is not None else last
            values.append(last)
            seconds.append(dur)
        recorded.append((t, values, seconds))
    known = [d for _t, _v, secs in recorded for d in secs if math.isfinite(d)]
    fallback = statistics.median(known) if known else 60.0
    out = [
        RecordedTrial(
            json.loads(t.hparams_json),
            tuple(vals),
            tuple(d if math.isfinite(d) else fallback for d in secs),
        )
        for t, vals, secs in recorded
        if vals
    ]
    label = f"experiment {experiment_id} ({len(out)} trials, start-up {startup:.3g} s)"
    return RecordedCurves(space, out, label=label, startup_s=startup)


@dataclass(frozen=True)
class BestReference:
    """What counts as finding the best configuration.

    ``threshold`` is the top-``top`` quantile of the noise-free final metric over
    ``samples`` configurations drawn from the space (the search space's own
    sampler, a fixed seed); a run found the best when the configuration it ends
    with is at least that good. ``optimum`` is the best value seen (or known).
    """

    threshold: float
    optimum: float
    top: float
    samples: int
    smaller_is_better: bool

    def is_best(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return value <= self.threshold if self.smaller_is_better else value >= self.threshold


def best_reference(
    source: CurveSource,
    space: Mapping[str, HParam],
    length: int,
    smaller_is_better: bool,
    top: float = 0.05,
    samples: int = 2000,
) -> BestReference:
    """The :class:`BestReference` of ``source`` over ``space`` at ``length`` epochs."""
    rng = random.Random("dlhpc.sim.reference")
    names = sorted(space)
    finals = []
    for _ in range(samples):
        v = source.true_final({n: sample(space[n], rng) for n in names}, length)
        if not math.isnan(v):
            finals.append(v)
    if isinstance(source, SyntheticCurves):
        finals.append(source.true_final(source.best_config(), length))
    if not finals:
        raise UsageError("the curve source gives no usable metric values")
    finals.sort(reverse=not smaller_is_better)  # best first
    k = max(0, min(len(finals) - 1, math.ceil(top * len(finals)) - 1))
    return BestReference(finals[k], finals[0], top, samples, smaller_is_better)
