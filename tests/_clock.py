"""Clocks for tests of the reconciler: this machine's clock moved (files' stamps not),
or the whole world later on."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from dlhpc.orchestrator.clock import SYSTEM_CLOCK


class SkewedClock:
    """The system clock ``by`` off (ahead when positive). :meth:`file_time` stays the
    filesystem's: the clock that stamps files is not this machine's."""

    def __init__(self, by: timedelta) -> None:
        self.by = by

    def time(self) -> float:
        return SYSTEM_CLOCK.time() + self.by.total_seconds()

    def now(self) -> datetime:
        return SYSTEM_CLOCK.now() + self.by

    def file_time(self, folder: Path) -> float:
        return SYSTEM_CLOCK.file_time(folder)


class LaterClock:
    """The world ``later`` on (files' stamps too), read on a machine whose clock is
    ``skew`` off (ahead when positive)."""

    def __init__(self, later: timedelta, skew: timedelta = timedelta(0)) -> None:
        self.later, self.skew = later, skew

    def time(self) -> float:
        return SYSTEM_CLOCK.time() + (self.later + self.skew).total_seconds()

    def now(self) -> datetime:
        return SYSTEM_CLOCK.now() + self.later + self.skew

    def file_time(self, folder: Path) -> float:
        return SYSTEM_CLOCK.file_time(folder) + self.later.total_seconds()
