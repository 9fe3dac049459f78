"""The reconciler's clock: real time, or a virtual one (``dlhpc simulate``).

Everything the orchestrator decides from time (grace periods, heartbeat ages,
decision latencies, timestamps it records) reads it from a :class:`Clock`
passed in, so the simulator drives the same code on a virtual clock. The age of a
file a job wrote is measured on the clock that stamped it (:meth:`Clock.file_time`),
never this machine's against a compute node's: a login node whose clock is off
still judges a heartbeat right. A pass of the reconciler (and ``dlhpc launch`` and
``kill``) reads its clock on the filesystem that holds the database
(:func:`store_clock`), which every login node that uses that database shares: the
times one node records and another judges (grace periods, the settle window) are
on one clock, whatever the nodes' own clocks say. A time recorded that closes or
follows others (an end, a later attempt) is :func:`not_before` them, so that times
written on another clock (Slurm's, a compute node's) never come after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dlhpc._fileclock import CLOCK_PROBE, file_time
from dlhpc.errors import StoreError
from dlhpc.store import Experiment, Store, Trial

__all__ = [
    "CLOCK_PROBE",
    "SYSTEM_CLOCK",
    "Clock",
    "OffsetClock",
    "SystemClock",
    "experiment_end",
    "not_before",
    "shared_clock",
    "store_clock",
    "trial_time",
]


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
        """:func:`dlhpc._fileclock.file_time`: touches ``folder``'s :data:`CLOCK_PROBE`."""
        return file_time(folder)


SYSTEM_CLOCK = SystemClock()


@dataclass(frozen=True)
class OffsetClock:
    """``base`` moved by ``offset_s`` seconds; files' stamps stay ``base``'s."""

    base: Clock
    offset_s: float

    def time(self) -> float:
        return self.base.time() + self.offset_s

    def now(self) -> datetime:
        return self.base.now() + timedelta(seconds=self.offset_s)

    def file_time(self, folder: Path) -> float:
        return self.base.file_time(folder)


def shared_clock(base: Clock, folder: Path) -> OffsetClock:
    """``base`` set to the clock that stamps files in ``folder`` (their offset read
    once, now, by :meth:`Clock.file_time`): on a shared filesystem, the clock every
    machine that uses it reads alike. Raises ``OSError``."""
    return OffsetClock(base, base.file_time(folder) - base.time())


def store_clock(store: Store, base: Clock = SYSTEM_CLOCK) -> OffsetClock:
    """``base`` on the clock of ``store``'s state folder (:func:`shared_clock` of its
    home): the clock of the times recorded there, and of its lease. Raises
    ``StoreError``."""
    try:
        return shared_clock(base, store.home)
    except OSError as err:
        raise StoreError(f"state folder {store.home}: its clock not read: {err}") from err


def not_before(now: datetime, *recorded: datetime | None) -> datetime:
    """``now``, or the latest of the ``recorded`` times (None: not recorded) where one
    is later: what a time the reconciler writes must not precede (an experiment's or
    trial's end its creation and its parts' times, a job's end seen its submission)."""
    return max((now, *(t for t in recorded if t is not None)))


def trial_time(t: Trial, now: datetime) -> datetime:
    """A time for what happens to trial ``t`` ``now`` (its end, a new attempt):
    :func:`not_before` its creation, its stop request and every time recorded of its
    attempts (Slurm's start and end too)."""
    times = [(a.created_at, a.started_at, a.ended_at, a.terminal_seen_at) for a in t.attempts]
    return not_before(now, t.created_at, t.stop_requested_at, *(x for ts in times for x in ts))


def experiment_end(s: Session, exp: Experiment, now: datetime) -> datetime:
    """When ``exp`` ends if it ends ``now``: :func:`not_before` its creation and its
    trials' ends (as flushed in ``s``)."""
    latest = s.scalar(select(func.max(Trial.ended_at)).where(Trial.experiment_id == exp.id))
    return not_before(now, exp.created_at, latest)
