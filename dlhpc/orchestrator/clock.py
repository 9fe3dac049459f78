"""The reconciler's clock: real time, or a virtual one (``dlhpc simulate``).

Everything the orchestrator decides from time (grace periods, heartbeat ages,
decision latencies, timestamps it records) reads it from a :class:`Clock`
passed in, so the simulator drives the same code on a virtual clock.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (the unit of event and heartbeat files)."""
        ...

    def now(self) -> datetime:
        """The same instant as a naive UTC datetime (the unit of the DB)."""
        ...


class SystemClock:
    """The wall clock."""

    def time(self) -> float:
        return time.time()

    def now(self) -> datetime:
        return datetime.now(timezone.utc).replace(tzinfo=None)


SYSTEM_CLOCK = SystemClock()
