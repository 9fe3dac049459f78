"""The reconciler lease: at most one writer at a time, across processes and hosts.

A lease is a row (name, owner, expires_at). Acquiring it is one
``BEGIN IMMEDIATE`` transaction that takes the row when it is free, expired or
already ours. The holder renews it at every write transaction
(:meth:`dlhpc.store.Store.write`) and checks it is still the owner there
(fencing): a reconciler that stalled past its expiry and lost the lease to
another gets :class:`LeaseLostError` instead of writing.
"""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from dlhpc.errors import DlhpcError, LeaseHeldError
from dlhpc.store.tables import Lease

__all__ = ["LeaseLostError", "make_owner_token", "take", "verify_and_renew", "give_back"]

RECONCILER = "reconciler"


class LeaseLostError(DlhpcError):
    """This process's lease expired and another process took it."""


def make_owner_token() -> str:
    """``host:pid:start:nonce``; ``start`` (the process's start time, ``-`` where
    unknown) tells this process from a later one that reuses its pid."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process(pid)[0] or '-'}:{uuid.uuid4().hex[:8]}"


def _process(pid: int) -> tuple[str | None, bool]:
    """(start time in clock ticks since boot, is a zombie) from ``/proc``; (None,
    False) where there is no ``/proc`` or no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
    except (OSError, IndexError):
        return None, False
    return (fields[19] if len(fields) > 19 else None), fields[:1] == ["Z"]


def take(session: Session, name: str, owner: str, ttl_s: float, now: datetime) -> None:
    """Take the lease in the caller's (IMMEDIATE) transaction or raise LeaseHeldError."""
    row = session.get(Lease, name)
    expires = now + timedelta(seconds=ttl_s)
    if row is None:
        session.add(Lease(name=name, owner=owner, acquired_at=now, expires_at=expires))
        return
    if row.owner != owner and row.expires_at > now and not _owner_is_dead(row.owner):
        raise LeaseHeldError(
            f"another reconciler ({row.owner}) holds the lease until {row.expires_at:%H:%M:%S} UTC"
        )
    if row.owner != owner:
        row.acquired_at = now
    row.owner = owner
    row.expires_at = expires


def _owner_is_dead(owner: str) -> bool:
    """True when ``owner`` was a process on this host that no longer exists.

    Lets the next cron tick on the same login node take over at once from a
    reconciler that was killed, instead of waiting for the lease to expire.
    Owners on other hosts cannot be checked and are waited out.
    A killed reconciler whose parent has not reaped it yet (a zombie) is dead,
    and so is one whose pid a later process reuses (its start time differs).
    """
    parts = owner.split(":")
    host, pid_text = parts[0], parts[1] if len(parts) > 1 else ""
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # another user's process: the pid was reused, or /proc tells nothing
    start, zombie = _process(int(pid_text))
    recorded = parts[2] if len(parts) == 4 and parts[2].isdigit() else None
    return zombie or (start is not None and recorded is not None and start != recorded)


def verify_and_renew(session: Session, name: str, owner: str, ttl_s: float, now: datetime) -> None:
    """Raise :class:`LeaseLostError` unless ``owner`` holds the lease; else renew it (one
    SELECT now; the UPDATE goes with the transaction's first flush, as before)."""
    row = session.get(Lease, name)
    if row is None or row.owner != owner:
        lost_to = row.owner if row is not None else ""
        raise LeaseLostError(f"lease {name!r} lost to {lost_to or 'nobody'}; stopping")
    row.expires_at = now + timedelta(seconds=ttl_s)


def give_back(session: Session, name: str, owner: str) -> None:
    row = session.get(Lease, name)
    if row is not None and row.owner == owner:
        session.delete(row)
