"""Crash injection for tests: ``DLHPC_FAILPOINTS=name[,name...]`` SIGKILLs the process
when it reaches a named point, so tests can prove that killing the reconciler at
that line loses nothing. Unset in normal use; the check is one dict lookup."""

from __future__ import annotations

import os
import signal

__all__ = ["failpoint"]


def failpoint(name: str) -> None:
    points = os.environ.get("DLHPC_FAILPOINTS")
    if points and name in points.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
