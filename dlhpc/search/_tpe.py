"""A TPE proposer for the rung searchers (BOHB-style; Falkner et al., ICML 2018).

"What to try" for ``asha`` and ``hyperband``, their default proposer (settings:
``searcher: {name: asha, proposer: {name: tpe, gamma: 0.2}}``): each new trial's
configuration comes from a model of the rung results so far, the rung searcher decides
"how long". For trial ``index``:

1. a generator seeded with ``(seed, index)`` draws a coin: with probability
   ``random_fraction``, or while there are too few results for a model (below),
   the trial is random search's trial ``index``
   (:func:`~dlhpc.search._rungs.sample_config`);
2. otherwise the trials are ranked (results of every bracket at a length
   pooled; NaN last, ties by request id). ``fidelity: highest`` (the default,
   BOHB's as hpbandster runs it): the results of the longest rung that has
   ``2 * min_points`` of them, the best ``max(min_points, ceil(gamma * n))``
   of its ``n`` *good*. ``fidelity: all`` (as Optuna's TPE ranks pruned
   trials): every trial with a result (at least ``min_points`` of them), those
   with a result at a longer rung first, then by their result at their longest
   rung, the best ``max(1, ceil(gamma * n))`` *good*. Either way at most
   ``n - 1`` are good, the rest *bad*, and past :data:`MODEL_POINTS` the
   ranking is thinned evenly first;
3. each set is a product-kernel density (a mixture with one uniform component)
   over the free hyperparameters in the unit cube: ``double`` linearly, ``log``
   by exponent, ``int`` as cells of width ``1/(hi - lo + 1)``; truncated
   Gaussians with Scott's bandwidth ``std * n**(-1/(d+4))``, at least
   ``1 / min(100, n + 1)``; categoricals with an Aitchison-Aitken kernel keeping
   the own value with weight ``1 - (c-1)/(c+n)``;
4. ``candidates`` points are drawn from the good density with the bandwidths
   times ``bandwidth_factor``, and the one with the largest ``log l(x) - log
   g(x)`` is the trial's configuration (ties: the first drawn).

Pure: no I/O, no clock; the same seed, settings and tells give the same
configurations. The state is the unit-cube point of every trial created (one
column per free hyperparameter, :func:`~dlhpc.search._columns.encode_floats`).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from dlhpc.config.schema import HParam
from dlhpc.search._columns import decode_floats, encode_floats
from dlhpc.search._rungs import rank_key, sample_config
from dlhpc.search._space import _bounds, _int_bounds, _log_base, _plain, _pow, _vals

__all__ = ["FIDELITIES", "MODEL_POINTS", "TPE_DEFAULTS", "TPEProposer", "check_tpe_settings"]

#: The settings and their defaults: BOHB's fidelity (the highest rung with enough
#: results), gamma (top 15 %), random fraction (1/3) and bandwidth factor (3); Optuna's 24
#: candidates; ``min_points`` None: free dims + 1 (BOHB).
TPE_DEFAULTS: Mapping[str, Any] = {
    "fidelity": "highest",
    "gamma": 0.15,
    "random_fraction": 1 / 3,
    "min_points": None,
    "candidates": 24,
    "bandwidth_factor": 3.0,
}
FIDELITIES = ("all", "highest")
#: The most trials a density is fitted on (a long search's ranking is thinned evenly).
MODEL_POINTS = 256  # bounds a proposal's cost (pure Python), whatever the search size
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
_STD = NormalDist()

#: Request id -> metric at one rung length, one mapping per bracket having that length.
Pooled = Mapping[int, list[dict[int, float]]]


def _number(value: Any, lo: float, hi: float, lo_open: bool, hi_open: bool) -> str | None:
    """An error message unless ``value`` is a number in the interval."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if ok:
        return None
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    return f"must be a number in {interval}, got {value!r}"


def check_tpe_settings(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The settings with defaults filled in, and ``(key, message)`` for each bad one."""
    out = dict(TPE_DEFAULTS)
    problems: list[tuple[str, str]] = []
    for key, value in settings.items():
        if key not in TPE_DEFAULTS:
            problems.append((key, f"unknown setting of proposer 'tpe' ({', '.join(TPE_DEFAULTS)})"))
            continue
        if key in ("min_points", "candidates"):
            floor = 2 if key == "min_points" else 1
            bad = isinstance(value, bool) or not isinstance(value, int) or value < floor
            msg = f"must be an integer >= {floor}, got {value!r}" if bad else None
            if value is None and key == "min_points":
                msg = None
        elif key == "fidelity":
            ok = value in FIDELITIES
            msg = None if ok else f"must be one of {', '.join(FIDELITIES)}, got {value!r}"
        elif key == "gamma":
            msg = _number(value, 0.0, 1.0, True, True)
        elif key == "random_fraction":
            msg = _number(value, 0.0, 1.0, False, False)
        else:
            msg = _number(value, 1.0, 1e6, False, False)
        if msg:
            problems.append((key, msg))
        else:
            out[key] = value
    return out, problems


@dataclass(frozen=True)
class _Dim:
    """A free hyperparameter: ``cats`` > 0 for a categorical (its value count)."""

    hp: HParam
    cats: int = 0


def _free_dims(space: Mapping[str, HParam]) -> list[_Dim]:
    """The hyperparameters with more than one value, in sorted name order."""
    dims: list[_Dim] = []
    for name in sorted(space):
        hp = space[name]
        if hp.type == "categorical" and len(_vals(hp)) > 1:
            dims.append(_Dim(hp, len(_vals(hp))))
        elif hp.type == "int" and len(set(_int_bounds(hp))) > 1:
            dims.append(_Dim(hp))
        elif hp.type in ("double", "log") and len(set(_bounds(hp))) > 1:
            dims.append(_Dim(hp))  # noqa: SIM114 (one line per type reads better)
    return dims


def _encode(d: _Dim, value: Any) -> float:
    """A value of ``d`` as its unit-cube coordinate (a categorical: its index)."""
    hp = d.hp
    if d.cats:
        keys = [json.dumps(_plain(v), sort_keys=True) for v in _vals(hp)]
        return float(keys.index(json.dumps(value, sort_keys=True)))
    if hp.type == "int":
        lo_i, hi_i = _int_bounds(hp)
        return (float(value) - lo_i + 0.5) / (hi_i - lo_i + 1)
    lo, hi = _bounds(hp)
    x = math.log(value, _log_base(hp)) if hp.type == "log" else value
    return min(max((x - lo) / (hi - lo), 0.0), 1.0)


def _decode(d: _Dim, u: float) -> Any:
    """Inverse of :func:`_encode` (cells for ints, clamped to the bounds)."""
    hp = d.hp
    if d.cats:
        return _plain(_vals(hp)[int(u)])
    if hp.type == "int":
        lo_i, hi_i = _int_bounds(hp)
        return lo_i + min(hi_i - lo_i, max(0, math.floor(u * (hi_i - lo_i + 1))))
    lo, hi = _bounds(hp)
    x = lo * (1 - u) + hi * u
    if hp.type == "log":
        return _pow(_log_base(hp), x, lo, hi)
    return min(max(x, lo), hi)


class _Density:
    """A product-kernel density over ``points`` plus one uniform component (see module doc)."""

    def __init__(self, dims: list[_Dim], points: list[list[float]]) -> None:
        self.dims, self.points = dims, points
        n, free = len(points), len(dims)
        floor = 1 / min(100, n + 1)
        self.widths: list[float] = []
        for j, d in enumerate(dims):
            if d.cats:
                self.widths.append((d.cats - 1) / (d.cats + n))  # the mass moved off a value
                continue
            xs = [p[j] for p in points]
            mean = sum(xs) / n
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
            self.widths.append(max(std * n ** (-1 / (free + 4)), floor))
        # per point: the sum over numeric dims of log(h * sqrt(2 pi) * Z), Z its truncation
        self._norms = [
            sum(
                math.log(h) + _LOG_SQRT_2PI + math.log(_mass(p[j], h))
                for j, (d, h) in enumerate(zip(dims, self.widths, strict=True))
                if not d.cats
            )
            for p in points
        ]
        self._prior = -sum(math.log(d.cats) for d in dims if d.cats)

    def log_pdf(self, x: list[float]) -> float:
        terms = [self._prior]
        for p, norm in zip(self.points, self._norms, strict=True):
            t = -norm
            for j, (d, h) in enumerate(zip(self.dims, self.widths, strict=True)):
                if d.cats:
                    t += math.log(1 - h) if x[j] == p[j] else math.log(h / (d.cats - 1))
                else:
                    z = (x[j] - p[j]) / h
                    t -= 0.5 * z * z
            terms.append(t)
        top = max(terms)
        return top + math.log(sum(math.exp(t - top) for t in terms)) - math.log(len(terms))

    def sample(self, rng: random.Random, factor: float) -> list[float]:
        """A point from the mixture, the Gaussian bandwidths times ``factor``."""
        i = rng.randrange(len(self.points) + 1)
        if i == len(self.points):
            return [float(rng.randrange(d.cats)) if d.cats else rng.random() for d in self.dims]
        out: list[float] = []
        for j, (d, h) in enumerate(zip(self.dims, self.widths, strict=True)):
            mu = self.points[i][j]
            if d.cats:
                draw = rng.random()
                if draw >= h:
                    out.append(mu)
                else:  # one of the other values, uniformly
                    k = rng.randrange(d.cats - 1)
                    out.append(float(k if k < mu else k + 1))
                continue
            s = h * factor
            a, b = _STD.cdf(-mu / s), _STD.cdf((1 - mu) / s)
            q = a + (b - a) * rng.random()
            x = mu + s * _STD.inv_cdf(min(max(q, 1e-300), 1 - 1e-16)) if b - a > 1e-12 else mu
            out.append(min(max(x, 0.0), 1.0))
        return out


def _mass(mu: float, h: float) -> float:
    """The mass of a Gaussian at ``mu`` of width ``h`` inside [0, 1]."""
    return max(_STD.cdf((1 - mu) / h) - _STD.cdf(-mu / h), 1e-300)


class TPEProposer:
    """The TPE proposer (see the module doc); ``settings`` as :func:`check_tpe_settings` gives."""

    name = "tpe"

    def __init__(
        self, space: Mapping[str, HParam], seed: int, sib: bool, settings: Mapping[str, Any]
    ) -> None:
        self.space, self.seed, self.smaller_is_better = dict(space), seed, sib
        self.settings = dict(TPE_DEFAULTS) | dict(settings)
        self.dims = _free_dims(space)
        given = self.settings["min_points"]
        self.min_points: int = given if given is not None else len(self.dims) + 1
        self.reset()

    def reset(self) -> None:
        self._points: list[list[float]] = []  # request id -> unit-cube point

    def propose(self, index: int, pooled: Pooled) -> dict[str, Any]:
        """The configuration of trial ``index`` (the next one) given the rung results."""
        if index != len(self._points):
            raise ValueError(f"tpe proposer: trial {index} proposed out of order")
        rng = random.Random(f"dlhpc.tpe:{self.seed}:{index}")
        split = None if rng.random() < self.settings["random_fraction"] else self._split(pooled)
        if split is None or not self.dims:
            hparams = sample_config(self.space, self.seed, index)
            self._points.append([_encode(d, hparams[d.hp.name]) for d in self.dims])
            return hparams
        good, bad = (_Density(self.dims, [self._points[rid] for rid in ids]) for ids in split)
        best, score = None, -math.inf
        for _ in range(self.settings["candidates"]):
            x = good.sample(rng, self.settings["bandwidth_factor"])
            s = good.log_pdf(x) - bad.log_pdf(x)
            if best is None or s > score:
                best, score = x, s
        assert best is not None  # candidates >= 1
        self._points.append(best)
        hparams = sample_config(self.space, self.seed, index)  # the fixed ones
        hparams.update({d.hp.name: _decode(d, u) for d, u in zip(self.dims, best, strict=True)})
        return hparams

    def _split(self, pooled: Pooled) -> tuple[list[int], list[int]] | None:
        """The good and bad request ids (None: too few results for a model)."""
        highest = self.settings["fidelity"] == "highest"
        ranked = self._ranked_highest(pooled) if highest else self._ranked_all(pooled)
        if ranked is None or len(ranked) < max(self.min_points, 2):
            return None
        if len(ranked) > MODEL_POINTS:  # every step-th, the best kept: the same quantiles
            step = math.ceil(len(ranked) / MODEL_POINTS)
            ranked = ranked[::step]
        n = len(ranked)
        k = max(1, math.ceil(self.settings["gamma"] * n))
        if highest:  # BOHB's: each set has at least min_points (see _ranked_highest)
            k = max(k, self.min_points)
        k = min(k, n - 1)
        return ranked[:k], ranked[k:]

    def _ranked_all(self, pooled: Pooled) -> list[int]:
        """Every trial with a result, by the longest rung it has a result at (longest
        first), then by that result (:func:`~dlhpc.search._rungs.rank_key`)."""
        keys: dict[int, tuple[int, tuple[int, float, int]]] = {}
        for length in sorted(pooled):  # a longer rung's result replaces a shorter one's
            for results in pooled[length]:
                for rid, v in results.items():
                    keys[rid] = (-length, rank_key(v, rid, self.smaller_is_better))
        return sorted(keys, key=keys.__getitem__)

    def _ranked_highest(self, pooled: Pooled) -> list[int] | None:
        """BOHB's: the results of the longest rung with ``2 * min_points`` of them (enough
        for a good and a bad set of ``min_points`` each), best first."""
        for length in sorted(pooled, reverse=True):
            if sum(map(len, pooled[length])) >= 2 * self.min_points:
                results = {rid: v for r in pooled[length] for rid, v in r.items()}
                sib = self.smaller_is_better
                return sorted(results, key=lambda rid: rank_key(results[rid], rid, sib))
        return None

    def state(self) -> dict[str, Any]:
        cols = [[p[j] for p in self._points] for j in range(len(self.dims))]
        return {"proposer_points": [encode_floats(c) for c in cols], "proposed": len(self._points)}

    def load(self, state: Mapping[str, Any], trials: int) -> None:
        """Restore :meth:`state` of a search with ``trials`` trials created."""
        cols = [list(decode_floats(c)) for c in state["proposer_points"]]
        n = int(state["proposed"])
        if len(cols) != len(self.dims) or n != trials or any(len(c) != n for c in cols):
            raise ValueError("tpe proposer: points do not match the trials or the space")
        self._points = [[c[i] for c in cols] for i in range(n)]
