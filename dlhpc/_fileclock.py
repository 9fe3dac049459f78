"""The clock of a filesystem: "now" as it stamps the files in a folder.

On a shared filesystem that is its server's clock, which every machine using it reads
alike (the login nodes, the compute nodes whose files it stamps), whatever their own
clocks say.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CLOCK_PROBE", "file_time"]

CLOCK_PROBE = ".dlhpc-clock"  # the empty file whose time stamp reads a folder's clock


def file_time(folder: Path) -> float:
    """Seconds since the epoch by ``folder``'s filesystem: touches its
    :data:`CLOCK_PROBE` (times set to "now", which NFS leaves to its server) and reads
    its modification time back. Raises ``OSError``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(folder / CLOCK_PROBE, flags, 0o666)  # the umask (site policy) applies
    try:
        os.utime(fd)
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
