"""A bound on how long a block of a test may run: SIGALRM, so main thread only."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["time_bound"]


@contextmanager
def time_bound(seconds: int, overran: Callable[[], BaseException]) -> Iterator[None]:
    """Raise ``overran()`` in the block when it runs past ``seconds``; the previous
    SIGALRM handler is put back afterwards."""

    def ring(signum: int, frame: FrameType | None) -> None:
        raise overran()

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
