"""The local backend: job arrays mirrored by detached runner processes."""

from dlhpc.scheduler.local.scheduler import LocalScheduler

__all__ = ["LocalScheduler"]
