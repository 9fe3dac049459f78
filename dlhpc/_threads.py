"""Run I/O-bound calls a few at a time: each file dlhpc publishes waits on its fsyncs,
a network round trip on NFS or Lustre, so the reconciler writes its batches (trial
specs, stop files) side by side instead of one after the other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["IO_WORKERS", "map_io"]

IO_WORKERS = 8

_T = TypeVar("_T")
_R = TypeVar("_R")


def map_io(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``[fn(x) for x in items]``, up to :data:`IO_WORKERS` calls at once, results in
    order. The first error (in order) raises once every call has ended."""
    if len(items) < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(IO_WORKERS, len(items))) as pool:
        return list(pool.map(fn, items))
