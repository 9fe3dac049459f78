"""The reconciler's clock: real time, or a virtual one (``dlhpc simulate``).

Everything the orchestrator decides from time (grace periods, heartbeat ages,
decision latencies, timestamps it records) reads it from a :class:`Clock`
passed in, so the simulator drives the same code on a virtual clock. The age of a
file a job wrote is measured on the clock that stamped it (:meth:`Clock.file_time`),
never this machine's against a compute node's: a login node whose clock is off
still judges a heartbeat right.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

__all__ = ["CLOCK_PROBE", "SYSTEM_CLOCK", "Clock", "SystemClock"]

CLOCK_PROBE = ".dlhpc-clock"  # the empty file whose time stamp reads a folder's clock


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (the unit of event and heartbeat files)."""
        ...

    def now(self) -> datetime:
        """The same instant as a naive UTC datetime (the unit of the DB)."""
        ...

    def file_time(self, folder: Path) -> float:
        """Now, in seconds since the epoch, by the clock that stamps the modification
        times of files in ``folder`` (a shared filesystem's server, whose stamps the
        compute nodes' files get too). Raises ``OSError``."""
        ...


class SystemClock:
    """The wall clock."""

    def time(self) -> float:
        return time.time()

    def now(self) -> datetime:
        return datetime.now(timezone.utc).replace(tzinfo=None)

    def file_time(self, folder: Path) -> float:
        """Touches ``folder``'s :data:`CLOCK_PROBE` (times set to "now", which NFS
        leaves to its server) and reads its modification time back."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(folder / CLOCK_PROBE, flags, 0o666)  # the umask (site policy) applies
        try:
            os.utime(fd)
            return os.fstat(fd).st_mtime
        finally:
            os.close(fd)


SYSTEM_CLOCK = SystemClock()
