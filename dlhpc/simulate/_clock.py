"""A virtual clock for the simulator (implements :class:`~dlhpc.orchestrator.clock.Clock`).

Time only moves when the simulation driver says so (:meth:`VirtualClock.advance_to`),
never backwards. The simulated cluster stamps every record it writes with this
clock, and ``tick`` judges heartbeats, grace periods and decisions by it, so a
simulated week passes in seconds of real time.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

__all__ = ["SIM_EPOCH", "VirtualClock"]

#: Where every simulation starts (2030-01-01T00:00:00Z): fixed, so runs are reproducible.
SIM_EPOCH = 1_893_456_000.0


class VirtualClock:
    """Seconds since the epoch that move only by :meth:`advance_to` / :meth:`advance`."""

    def __init__(self, start: float = SIM_EPOCH) -> None:
        self._t = float(start)
        self.start = float(start)

    def time(self) -> float:
        return self._t

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._t, tz=timezone.utc).replace(tzinfo=None)

    def file_time(self, folder: Path) -> float:
        """The virtual now: the simulated cluster stamps its files with it."""
        return self._t

    def elapsed(self) -> float:
        """Virtual seconds since the clock was created."""
        return self._t - self.start

    def advance_to(self, t: float) -> None:
        """Move to ``t``; ValueError if that is in the past."""
        if t < self._t:
            raise ValueError(f"virtual clock cannot go back from {self._t} to {t}")
        self._t = float(t)

    def advance(self, seconds: float) -> None:
        self.advance_to(self._t + seconds)
