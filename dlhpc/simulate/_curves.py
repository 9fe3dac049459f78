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
* ``RecordedCurves`` (:mod:`dlhpc.simulate._recorded`): each configuration gets
  the curve of the nearest recorded trial (normalised hyperparameter distance,
  categoricals 0/1), read by ``load_recorded`` from a finished experiment in the DB; epoch durations
  come from the times of its metric records. An attempt's first record comes
  after the job's start-up too (imports, data, restore), which the simulated
  cluster adds by itself: the experiment's start-up (``startup_s``, the median
  over attempts of the first record's delay after the attempt's start minus the
  trial's own median epoch) is taken off those first epochs, so that it is not
  counted twice. Past its last recorded step a curve stays flat at its last value.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dlhpc.config.schema import HParam
from dlhpc.errors import UsageError
from dlhpc.search import sample

__all__ = [
    "BestReference",
    "Curve",
    "CurveSource",
    "SyntheticCurves",
    "best_reference",
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
