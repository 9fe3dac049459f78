"""``max_budget``: the total length (in ``max_length``'s unit) a rung search may spend.

With ``max_budget`` the budget, not ``max_trials``, ends an adaptive search
(``max_trials`` may then be left out: no count). What counts is what the searcher
*grants*: a Create costs its grant, a Continue the difference to the new grant.
A trial that exits before its grant (stopped, failed, killed) gives back the part
it did not reach (by its last reported length), so ``stop_once`` spends what its
trials trained. ``asha`` and ``hyperband`` start work only while it fits in what
is left; once nothing fits they stop their paused trials and are done. ``sha``
plays the largest ``max_trials`` whose whole plan (every rung full, ``max(1,
n // divisor)`` promoted) fits. ``max_budget`` must be at least ``max_length``
(one trial trained to the end).
"""

from __future__ import annotations

from collections.abc import Sequence

from dlhpc.config.schema import SearcherConfig
from dlhpc.config.searcher_rules import Report

__all__ = ["check_budget", "check_budget_settings", "sha_cost", "sha_trials", "unused"]


def check_budget(kind: str, config: SearcherConfig) -> None:
    """:class:`ValueError` unless ``max_budget`` is None or at least ``max_length``."""
    if config.max_budget is not None and config.max_budget < config.max_length:
        raise ValueError(
            f"{kind} searcher: max_budget {config.max_budget} < max_length {config.max_length}"
        )


def check_budget_settings(config: SearcherConfig, report: Report) -> None:
    """The loader's form of :func:`check_budget`."""
    if config.max_budget is not None and config.max_budget < config.max_length:
        report.add(
            ("searcher", "max_budget"),
            f"must be >= max_length ({config.max_length}: one whole trial), "
            f"got {config.max_budget}",
        )


def sha_cost(n: int, lengths: Sequence[int], divisor: int) -> int:
    """What synchronous successive halving of ``n`` trials grants when every rung is full."""
    cost, members, before = 0, n, 0
    for length in lengths:
        cost += members * (length - before)
        before, members = length, max(1, members // divisor)
    return cost


def sha_trials(config: SearcherConfig, lengths: Sequence[int]) -> int:
    """``max_trials``, or with ``max_budget`` the largest count up to it whose plan fits."""
    if config.max_budget is None:
        return config.max_trials
    lo, hi = 1, config.max_trials  # sha_cost(1) = max_length <= max_budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sha_cost(mid, lengths, config.divisor) <= config.max_budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def unused(granted: int, before: int, last: tuple[int, float] | None) -> int:
    """The part of a grant to ``granted`` (from ``before``) that a trial exiting with
    its last report ``last`` did not reach."""
    reached = max(before, last[0] if last is not None else 0)
    return max(0, granted - reached)
