"""Values of one hyperparameter: random samples, grid points and a default.

Every function returns plain JSON-serialisable Python values (``int``,
``float``, ``str``, ``bool``, ``None``, lists and dicts), never numpy types,
and copies mutable values so that callers cannot alter the config through
them. ``log`` bounds are exponents of ``base``, as in Determined. Bad input
(missing bounds, ``minval > maxval``, a grid range without ``count``) raises
:class:`ValueError`.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

from dlhpc.config.schema import HParam

__all__ = ["default_value", "grid_points", "sample"]


def _bounds(hp: HParam) -> tuple[float, float]:
    if hp.minval is None or hp.maxval is None:
        raise ValueError(f"hyperparameter {hp.name!r} ({hp.type}) needs minval and maxval")
    lo, hi = float(hp.minval), float(hp.maxval)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"hyperparameter {hp.name!r}: minval and maxval must be finite")
    if lo > hi:
        raise ValueError(f"hyperparameter {hp.name!r}: minval {lo:g} > maxval {hi:g}")
    return lo, hi


def _int_bounds(hp: HParam) -> tuple[int, int]:
    lo, hi = _bounds(hp)
    ilo, ihi = math.ceil(lo), math.floor(hi)
    if ilo > ihi:
        raise ValueError(f"hyperparameter {hp.name!r}: no integer in [{lo:g}, {hi:g}]")
    return ilo, ihi


def _vals(hp: HParam) -> tuple[Any, ...]:
    if not hp.vals:
        raise ValueError(f"hyperparameter {hp.name!r} (categorical) needs at least one value")
    return hp.vals


def _plain(value: Any) -> Any:
    """A deep copy with tuples turned into lists (what a JSON round trip gives)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return copy.deepcopy(value)


def _round_half_up(x: float) -> int:
    # Not round(): banker's rounding would make 2.5 -> 2 but 3.5 -> 4.
    return math.floor(x + 0.5)


def _pow(base: float, exponent: float, lo: float, hi: float) -> float:
    """``base ** exponent`` clamped to the range of the bound exponents.

    Clamping guards against the last-bit rounding of ``**`` stepping outside
    ``[base**lo, base**hi]``.
    """
    a, b = sorted((float(base**lo), float(base**hi)))
    return min(max(float(base**exponent), a), b)


def _log_base(hp: HParam) -> float:
    base = float(hp.base)
    if not (base > 0 and base != 1 and math.isfinite(base)):
        raise ValueError(f"hyperparameter {hp.name!r}: log base must be > 0 and != 1")
    return base


def _linspace(lo: float, hi: float, count: int) -> list[float]:
    if count == 1:
        return [(lo + hi) / 2]
    # lo*(1-t) + hi*t hits both endpoints exactly, unlike lo + t*(hi-lo); the
    # clamp keeps last-bit rounding inside [lo, hi] (e.g. when lo == hi).
    points = (lo * (1 - i / (count - 1)) + hi * (i / (count - 1)) for i in range(count))
    return [min(max(x, lo), hi) for x in points]


def _count(hp: HParam) -> int:
    if hp.count is None:
        raise ValueError(f"hyperparameter {hp.name!r} ({hp.type}): grid search needs 'count'")
    if isinstance(hp.count, bool) or not isinstance(hp.count, int) or hp.count < 1:
        raise ValueError(f"hyperparameter {hp.name!r}: count must be an int >= 1")
    return hp.count


def sample(hp: HParam, rng: random.Random) -> Any:
    """One value of ``hp`` drawn from ``rng``.

    ``int``: uniform integer in ``[minval, maxval]``; ``double``: uniform in
    ``[minval, maxval]``; ``log``: ``base ** uniform(minval, maxval)``;
    ``categorical``: uniform choice of ``vals``; ``const``: ``value`` (draws
    nothing from ``rng``).
    """
    if hp.type == "const":
        return _plain(hp.value)
    if hp.type == "int":
        lo_i, hi_i = _int_bounds(hp)
        return rng.randint(lo_i, hi_i)
    if hp.type == "double":
        lo, hi = _bounds(hp)
        return min(max(rng.uniform(lo, hi), lo), hi)
    if hp.type == "log":
        lo, hi = _bounds(hp)
        base = _log_base(hp)
        return _pow(base, rng.uniform(lo, hi), lo, hi)
    if hp.type == "categorical":
        vals = _vals(hp)
        return _plain(vals[rng.randrange(len(vals))])
    raise ValueError(f"hyperparameter {hp.name!r}: unknown type {hp.type!r}")


def grid_points(hp: HParam) -> list[Any]:
    """The grid values of ``hp``, ascending for ranges.

    ``int``: ``count`` evenly spaced integers from ``minval`` to ``maxval``,
    rounded half up and deduplicated (so possibly fewer than ``count``);
    ``double``: ``count`` evenly spaced values including both ends; ``log``:
    ``base`` to the power of ``count`` evenly spaced exponents; with
    ``count == 1`` the one point is the midpoint. ``categorical``: all
    ``vals`` in order; ``const``: ``[value]``.
    """
    if hp.type == "const":
        return [_plain(hp.value)]
    if hp.type == "categorical":
        return [_plain(v) for v in _vals(hp)]
    if hp.type == "int":
        lo_i, hi_i = _int_bounds(hp)
        count = min(_count(hp), hi_i - lo_i + 1)  # never build more points than integers
        points = [_round_half_up(x) for x in _linspace(lo_i, hi_i, count)]
        return list(dict.fromkeys(points))
    if hp.type == "double":
        lo, hi = _bounds(hp)
        return _linspace(lo, hi, _count(hp))
    if hp.type == "log":
        lo, hi = _bounds(hp)
        base = _log_base(hp)
        return [_pow(base, e, lo, hi) for e in _linspace(lo, hi, _count(hp))]
    raise ValueError(f"hyperparameter {hp.name!r}: unknown type {hp.type!r}")


def default_value(hp: HParam) -> Any:
    """The value a single trial uses: ``value`` for ``const``, the first of
    ``vals`` for ``categorical``, the midpoint of the range otherwise
    (rounded half up for ``int``; the midpoint exponent for ``log``)."""
    if hp.type == "const":
        return _plain(hp.value)
    if hp.type == "categorical":
        return _plain(_vals(hp)[0])
    if hp.type == "int":
        lo_i, hi_i = _int_bounds(hp)
        return _round_half_up((lo_i + hi_i) / 2)
    if hp.type == "double":
        lo, hi = _bounds(hp)
        return (lo + hi) / 2
    if hp.type == "log":
        lo, hi = _bounds(hp)
        return _pow(_log_base(hp), (lo + hi) / 2, lo, hi)
    raise ValueError(f"hyperparameter {hp.name!r}: unknown type {hp.type!r}")
