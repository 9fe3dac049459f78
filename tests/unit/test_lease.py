"""The reconciler lease when its owner died in ways ``kill(pid, 0)`` cannot see:
a killed reconciler not reaped yet (a zombie), and a pid a later process reuses."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest

from dlhpc.errors import LeaseHeldError
from dlhpc.store import Store, utcnow
from dlhpc.store import lease as lease_mod
from dlhpc.store.tables import Lease


def _held_by(store: Store, owner: str) -> None:
    with store.write() as s:
        s.merge(
            Lease(
                name="reconciler",
                owner=owner,
                acquired_at=utcnow(),
                expires_at=utcnow() + timedelta(hours=1),
            )
        )


def _token(pid: int, start: str) -> str:
    return f"{socket.gethostname()}:{pid}:{start}:abcd1234"


def test_own_token_records_the_process_start_time() -> None:
    host, pid, start, nonce = lease_mod.make_owner_token().split(":")
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    assert start == lease_mod._process(os.getpid())[0] and start.isdigit() and len(nonce) == 8


def test_a_killed_reconciler_not_reaped_yet_does_not_hold_the_lease(tmp_path: Path) -> None:
    store = Store(tmp_path)
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # the reconciler is gone; its parent (this test) has not reaped it
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped
        start, zombie = lease_mod._process(pid)
        assert zombie and start is not None
        _held_by(store, _token(pid, start))
        with store.hold_lease():
            assert store.holds_lease
    finally:
        os.waitpid(pid, 0)


def test_a_reused_pid_does_not_hold_the_lease_but_a_live_owner_does(tmp_path: Path) -> None:
    store = Store(tmp_path)
    start = lease_mod._process(os.getpid())[0]
    assert start is not None
    _held_by(store, _token(os.getpid(), str(int(start) + 1)))  # same pid, another process
    with store.hold_lease():
        assert store.holds_lease
    for alive in (_token(os.getpid(), start), f"{socket.gethostname()}:{os.getpid()}:cafe0123"):
        _held_by(store, alive)  # this very process (an older token has no start time)
        with pytest.raises(LeaseHeldError), store.hold_lease():
            pass
