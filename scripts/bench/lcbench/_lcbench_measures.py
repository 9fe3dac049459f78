"""Measures of ``bench_search_lcbench.py``: a run's trace, compute to the target, regret.

A :class:`Trace` is every epoch a run trained, in the order they ended on the virtual
clock: (virtual wall seconds since the start, the epoch's seconds, the metric it
reported). Compute is counted in epochs (trial-epochs) and in GPU-seconds (the sum of
the trained epochs' seconds, one GPU per trial); both stop at the budget (epochs), the
same for every method. An epoch that was cut off (a stop in the middle of it) is not in
the trace and costs nothing here.

* :meth:`Trace.to_target`: the compute and wall time spent when a trial first reports a
  value >= the target (None: not within the budget).
* :meth:`Trace.regret_at`: normalised regret of the best value reported within each of
  the given epoch budgets (1.0 before the first report: regret of the task's minimum).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Trace:
    """One run's epochs; ``budget`` caps what :meth:`add` keeps (later ones are dropped)."""

    budget: int
    wall: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @property
    def epochs(self) -> int:
        return len(self.values)

    @property
    def full(self) -> bool:
        return len(self.values) >= self.budget

    def add(self, wall_s: float, epoch_s: float, value: float) -> bool:
        """Record one trained epoch; True once the budget is spent (this one included)."""
        if not self.full:
            if self.wall and wall_s < self.wall[-1]:
                raise ValueError(f"epochs must come in time order: {wall_s} < {self.wall[-1]}")
            self.wall.append(wall_s)
            self.seconds.append(epoch_s)
            self.values.append(value if math.isfinite(value) else -math.inf)
        return self.full

    def to_target(self, target: float) -> dict[str, float] | None:
        """{epochs, gpu_hours, wall_hours} when a value first reached ``target``."""
        for i, v in enumerate(self.values):
            if v >= target:
                return {
                    "epochs": i + 1,
                    "gpu_hours": math.fsum(self.seconds[: i + 1]) / 3600,
                    "wall_hours": self.wall[i] / 3600,
                }
        return None

    def best(self, epochs: int | None = None) -> float | None:
        vals = self.values[: self.epochs if epochs is None else epochs]
        return max(vals) if vals else None

    def regret_at(self, budgets: Sequence[int], regret: Callable[[float], float]) -> list[float]:
        """Normalised regret of the best value within each of ``budgets`` (epochs)."""
        out, best, i = [], -math.inf, 0
        for b in budgets:
            while i < min(b, self.epochs):
                best = max(best, self.values[i])
                i += 1
            out.append(1.0 if best == -math.inf else regret(best))
        return out

    def digest(self) -> str:
        """A short digest of every recorded epoch (virtual time, seconds, value): equal
        digests, the same run."""
        text = repr((self.wall, self.seconds, self.values))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def summary(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "gpu_hours": math.fsum(self.seconds) / 3600,
            "wall_hours": (self.wall[-1] if self.wall else 0.0) / 3600,
            "best": self.best(),
        }


def checkpoints(budget: int, first: int, points: int = 24) -> list[int]:
    """``points`` epoch budgets from ``first`` to ``budget``, evenly spaced in log scale."""
    if budget <= first:
        return [budget]
    ratio = (budget / first) ** (1 / max(1, points - 1))
    out = sorted({min(budget, round(first * ratio**k)) for k in range(points)} | {budget})
    return out


def median_inf(values: Sequence[float | None]) -> float:
    """Median where None (not reached within the budget) counts as +inf."""
    return statistics.median([math.inf if v is None else v for v in values])


def ratio(value: float, ref: float, budget: float) -> float:
    """``value / ref`` of two medians; a reference beyond the budget counts as the budget
    (the ratio is then an upper bound); inf when ``value`` is beyond the budget."""
    if math.isinf(value):
        return math.inf
    return value / (budget if math.isinf(ref) else ref)
