"""Rung arithmetic and small helpers shared by the adaptive searchers.

Everything here is a pure function of its arguments:

* :func:`rung_lengths`: the lengths ``r_k = max_length // divisor**(R-1-k)``,
  ``k = 0..R-1``, of the successive-halving rungs;
* :func:`hyperband_plan`: Hyperband's brackets (Li et al., JMLR 2018) for a
  mode, with ``max_trials`` split across them (:func:`split_trials`);
* :func:`rung_results`: which rung results a metric report fixes;
* :func:`rank_key`: the order of results within a rung (NaN worst, ties by
  request id);
* :class:`TrialRecord`: the per-trial bookkeeping (grant, status, results);
* :func:`sample_config`, :func:`check_max_new`: shared plumbing.

The searchers' saved state is :mod:`dlhpc.search._rungstate`'s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dlhpc.config.schema import HParam, SearcherConfig
from dlhpc.search._space import sample

__all__ = [
    "EXITED",
    "FINISHED",
    "HYPERBAND_MODES",
    "PAUSED",
    "RUNNING",
    "STOPPING",
    "BracketPlan",
    "TrialRecord",
    "bracket_size",
    "check_adaptive_config",
    "check_max_new",
    "hyperband_plan",
    "rank_key",
    "rung_lengths",
    "rung_results",
    "sample_config",
    "split_trials",
]

HYPERBAND_MODES = ("aggressive", "standard", "conservative")

RankKey = tuple[int, float, int]

# Trial statuses, as the searcher sees them.
RUNNING = "running"  # holds a slot, training towards its grant
PAUSED = "paused"  # reached a grant below max_length; checkpointed, no slot
FINISHED = "finished"  # reached max_length; waiting for tell_exited
STOPPING = "stopping"  # the searcher stopped it; waiting for tell_exited
EXITED = "exited"  # tell_exited came


@dataclass(slots=True)  # slots: a long search holds 100,000s
class TrialRecord:
    """What a searcher keeps of one trial.

    ``grant`` is the index of the rung (of the trial's bracket) it may train
    to, ``resolved`` the number of rungs it has a result for, ``last`` its
    last report ``(length, metric)``.
    """

    bracket: int
    grant: int
    status: str = RUNNING
    resolved: int = 0
    last: tuple[int, float] | None = None


def rung_lengths(max_length: int, divisor: int, max_rungs: int, min_length: int = 1) -> list[int]:
    """Rung lengths, shortest first; the last is ``max_length``.

    ``r_k = max_length // divisor**(R-1-k)`` (floor division, so every length
    is an integer and ``r_{k+1} >= divisor * r_k``), with ``R = max_rungs``
    clipped so that the first rung is at least ``min_length`` (and >= 1).
    Floor division of a length >= 1 by ``divisor >= 2`` always shrinks it, so
    the lengths are strictly increasing; duplicates are dropped regardless.
    """
    if max_length < 1:
        raise ValueError(f"searcher: max_length must be >= 1, got {max_length}")
    if divisor < 2:
        raise ValueError(f"searcher: divisor must be >= 2, got {divisor}")
    if max_rungs < 1:
        raise ValueError(f"searcher: max_rungs must be >= 1, got {max_rungs}")
    floor = max(1, min_length)
    lengths = [max_length]
    while len(lengths) < max_rungs and lengths[-1] // divisor >= floor:
        lengths.append(lengths[-1] // divisor)
    return sorted(set(lengths))


def bracket_size(s: int, s_max: int, divisor: int) -> int:
    """Hyperband's ``n_s = ceil((s_max+1)/(s+1) * divisor**s)`` (exact integers)."""
    if not 0 <= s <= s_max:
        raise ValueError(f"hyperband: bracket {s} outside 0..{s_max}")
    power: int = divisor**s
    return -(-(s_max + 1) * power // (s + 1))


def split_trials(total: int, weights: list[int]) -> list[int]:
    """``total`` split proportionally to ``weights``: each part >= 1, sum exactly ``total``.

    Needs ``1 <= len(weights) <= total``. Each part starts at
    ``max(1, floor(quota))`` with ``quota = total * w / sum(weights)``
    (exact fractions); parts are then taken one by one from the part most
    above its quota, or given one by one to the part most below it, ties
    going to the earlier part. ``total == sum(weights)`` gives the weights.
    """
    if not weights or total < len(weights):
        raise ValueError(f"cannot split {total} trials into {len(weights)} parts of at least 1")
    whole = sum(weights)
    quotas = [Fraction(total * w, whole) for w in weights]
    parts = [max(1, math.floor(q)) for q in quotas]
    order = range(len(parts))
    while sum(parts) > total:
        i = max((i for i in order if parts[i] > 1), key=lambda i: (parts[i] - quotas[i], -i))
        parts[i] -= 1
    while sum(parts) < total:
        i = max(order, key=lambda i: (quotas[i] - parts[i], -i))
        parts[i] += 1
    return parts


@dataclass(frozen=True)
class BracketPlan:
    """One Hyperband bracket: ``s``, the paper's ``n_s``, its rungs and its trials."""

    s: int
    paper_trials: int  # n_s in the paper
    lengths: tuple[int, ...]  # the top s+1 rungs
    trials: int  # this search's share of max_trials


def hyperband_plan(
    lengths: list[int], divisor: int, mode: str, max_trials: int
) -> list[BracketPlan]:
    """The brackets of a Hyperband search, most aggressive (largest ``s``) first.

    ``s_max = len(lengths) - 1``; bracket ``s`` runs the top ``s+1`` rungs,
    starting at ``lengths[s_max - s]``. ``aggressive`` keeps bracket
    ``s_max`` only, ``standard`` the ``ceil((s_max+1)/2)`` most aggressive,
    ``conservative`` all of them (the paper). ``max_trials`` is split over
    the kept brackets with :func:`split_trials` weighted by ``n_s``; when
    ``max_trials`` is smaller than the number of brackets, the least
    aggressive brackets are dropped so that each kept one has a trial.
    """
    if mode not in HYPERBAND_MODES:
        raise ValueError(
            f"hyperband: mode must be one of {', '.join(HYPERBAND_MODES)}, got {mode!r}"
        )
    s_max = len(lengths) - 1
    count = {"aggressive": 1, "standard": -(-(s_max + 1) // 2), "conservative": s_max + 1}[mode]
    count = min(count, max_trials)
    kept = list(range(s_max, s_max - count, -1))
    sizes = [bracket_size(s, s_max, divisor) for s in kept]
    shares = split_trials(max_trials, sizes)
    return [
        BracketPlan(s, n, tuple(lengths[s_max - s :]), share)
        for s, n, share in zip(kept, sizes, shares, strict=True)
    ]


def rung_results(
    lengths: tuple[int, ...] | list[int],
    resolved: int,
    limit: int,
    last: tuple[int, float] | None,
    length: int,
    metric: float,
) -> list[tuple[int, float]]:
    """The rung results fixed by a report of ``metric`` at ``length``.

    ``resolved`` rungs already have a result; rungs up to index ``limit``
    (the trial's grant) may get one. Rung ``k`` gets its result from the
    first report at a length ``>= r_k``: that report's metric when it is at
    exactly ``r_k``, otherwise the previous report (``last``) when that one
    is at a length ``<= r_k`` (the last point at or before the rung), and
    otherwise (no earlier point at or before the rung) the crossing report.
    """
    out: list[tuple[int, float]] = []
    k = resolved
    while k <= limit and k < len(lengths) and lengths[k] <= length:
        if lengths[k] != length and last is not None and last[0] <= lengths[k]:
            out.append((k, last[1]))
        else:
            out.append((k, metric))
        k += 1
    return out


def rank_key(metric: float, request_id: int, smaller_is_better: bool) -> RankKey:
    """Sort key of a rung result: best first, NaN last, ties by request id."""
    if math.isnan(metric):
        return (1, 0.0, request_id)
    return (0, metric if smaller_is_better else -metric, request_id)


def sample_config(space: dict[str, HParam], seed: int, index: int) -> dict[str, Any]:
    """Hyperparameters of trial ``index``: the same draw as random search's trial ``index``.

    A generator seeded with ``(seed, index)`` samples the names in sorted
    order, so the values depend only on the seed, the space and the index
    (a restored searcher needs no generator state), and an adaptive search
    tries the configurations a random search with the same seed tries.
    """
    rng = random.Random(f"dlhpc.random:{seed}:{index}")
    return {name: sample(space[name], rng) for name in sorted(space)}


def check_max_new(max_new: int) -> None:
    """Raise :class:`ValueError` unless ``max_new`` is an int >= 0."""
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
        raise ValueError(f"ask(): max_new must be an int >= 0, got {max_new!r}")


def check_adaptive_config(kind: str, config: SearcherConfig) -> list[int]:
    """Validate the fields shared by sha, asha and hyperband; return the rung lengths."""
    if config.max_trials < 1:
        raise ValueError(f"{kind} searcher: max_trials must be >= 1, got {config.max_trials}")
    min_length = 1 if config.min_length is None else config.min_length
    if min_length > config.max_length:
        raise ValueError(
            f"{kind} searcher: min_length {min_length} > max_length {config.max_length}"
        )
    return rung_lengths(config.max_length, config.divisor, config.max_rungs, min_length)
