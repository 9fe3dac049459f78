"""The one way the login node reads a file a job wrote.

A job runs the user's code on a compute node: what it leaves in its attempt folder
(event files, ``heartbeat.json``, ``progress.json``, checkpoint manifests) is input,
not trusted state. :func:`read_bounded` opens such a file with ``O_NOFOLLOW |
O_NONBLOCK`` (a symlink is never followed, a FIFO never blocks), accepts only a
regular file (``fstat``) no larger than the caller's limit, and reads at most that
many bytes; :func:`parse_json` decodes strict UTF-8 and parses JSON, its nesting
bounded (:func:`check_depth`). Each failure is one typed error, :class:`UnsafeFile`,
naming the file and why: the reader quarantines the file rather than stopping.
Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "EVENT_FILE_LIMIT",
    "MANIFEST_LIMIT",
    "MAX_DEPTH",
    "STATE_FILE_LIMIT",
    "UnsafeFile",
    "check_depth",
    "open_regular",
    "parse_json",
    "read_bounded",
    "read_state_file",
]

# An event file holds at most the harness's flush_every (10,000) records; packed
# metrics lines keep even thousands of metrics per step well below this.
EVENT_FILE_LIMIT = 64 * 2**20
STATE_FILE_LIMIT = 64 * 2**10  # heartbeat.json, progress.json: a few fields
MANIFEST_LIMIT = 16 * 2**20  # a checkpoint of ~100,000 files
MAX_DEPTH = 32  # nesting of a record or small file (an env record is 4 deep)

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# open() errors that reading again will not change; others (EIO, ESTALE...) may pass
_LASTING = {
    errno.ELOOP: "a symbolic link (never followed)",
    errno.EACCES: "not readable (permission denied)",
    errno.EPERM: "not readable (operation not permitted)",
    errno.ENXIO: "not a regular file",
    errno.ENAMETOOLONG: "name too long",
}


class UnsafeFile(ValueError):
    """A job-written file that is not read: ``path`` and ``reason`` (one line).

    ``transient``: an I/O error that a later read may not meet (the file is left to
    be read again); otherwise the file's content or kind is at fault, for good.
    """

    def __init__(self, path: Path, reason: str, *, transient: bool = False) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.transient = transient


def open_regular(path: Path, dir_fd: int | None = None) -> tuple[int, int]:
    """``(fd, size)`` of the regular file ``path`` (a name relative to the folder
    ``dir_fd`` when given), opened read-only without following a symlink or blocking
    on a FIFO; the caller closes ``fd``.

    Raises :class:`FileNotFoundError` when it is absent and :class:`UnsafeFile` when
    it is a symlink, not a regular file or does not open."""
    try:
        fd = os.open(path, _FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as err:
        reason = _LASTING.get(err.errno or 0)
        raise UnsafeFile(path, reason or f"open: {err.strerror}", transient=not reason) from None
    try:
        info = os.fstat(fd)
    except OSError as err:
        os.close(fd)
        raise UnsafeFile(path, f"fstat: {err.strerror}", transient=True) from None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFile(path, "not a regular file")
    return fd, info.st_size


def read_bounded(path: Path, limit: int, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (relative to ``dir_fd`` when given, as
    :func:`open_regular`), at most ``limit`` of them.

    Raises :class:`FileNotFoundError` when it is absent and :class:`UnsafeFile` when
    it is a symlink, not a regular file, larger than ``limit`` or does not read.
    One ``open``, ``fstat`` and ``read`` for a file that is all right.
    """
    fd, size = open_regular(path, dir_fd)
    try:
        if size > limit:
            raise UnsafeFile(path, f"{size} bytes, over the limit of {limit}")
        data = os.read(fd, size + 1)
        while len(data) < size and (more := os.read(fd, limit + 1 - len(data))):
            data += more  # a short read (rare): read on to the end or the limit
    except OSError as err:
        raise UnsafeFile(path, f"read: {err.strerror}", transient=True) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnsafeFile(path, f"grew past the limit of {limit} bytes")
    return data


def parse_json(data: bytes | str, path: Path) -> Any:
    """``data`` (strict UTF-8 when bytes) parsed as JSON, nested at most
    :data:`MAX_DEPTH` deep; :class:`UnsafeFile` naming ``path`` when it is not."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text)
    except UnicodeDecodeError as err:
        raise UnsafeFile(path, f"not UTF-8 at byte {err.start}") from None
    except RecursionError:
        raise UnsafeFile(path, "JSON nested too deep") from None
    except ValueError as err:
        raise UnsafeFile(path, f"not valid JSON: {err}") from None
    if not check_depth(value):
        raise UnsafeFile(path, f"JSON nested more than {MAX_DEPTH} deep")
    return value


def check_depth(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when ``value`` (parsed JSON) nests lists and objects at most ``limit``
    deep; iterative, so any depth is answered."""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        if not level:
            return True
        nested: list[Any] = []
        for v in level:
            nested.extend(v.values() if isinstance(v, dict) else v)
        level = [v for v in nested if isinstance(v, dict | list)]
    return not level


def read_state_file(path: Path) -> dict[str, Any] | None:
    """A heartbeat or progress file (rewritten in place by its job) as an object;
    None when absent. :class:`UnsafeFile` when it is not a small regular file
    holding one JSON object."""
    try:
        data = parse_json(read_bounded(path, STATE_FILE_LIMIT), path)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise UnsafeFile(path, f"a JSON {type(data).__name__}, not an object")
    return data
