"""What ``dlhpc logs`` prints of a job's log.

A log is written by the job, so it is read as any job-written file is
(:func:`~dlhpc.protocol.safe_read.open_regular`: no symlink followed, no FIFO blocked
on), only its last ``max_bytes`` are printed (what is left out is said on stderr), and,
unless ``raw``, terminal control sequences are removed (:func:`printable`): a job's
output must not reach the user's terminal as commands (a clipboard write, a cleared
screen, a new window title).
"""

from __future__ import annotations

import codecs
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from dlhpc.errors import DlhpcError
from dlhpc.protocol.safe_read import UnsafeFile, open_regular

__all__ = ["DEFAULT_MAX_BYTES", "follow_log", "printable"]

DEFAULT_MAX_BYTES = 2**20
_CHUNK = 2**16

# ESC sequences: CSI (ESC [ ... final byte); strings (OSC, DCS, SOS, PM, APC) up to BEL or
# ST, or the end of the text; any other escape (ESC, intermediates, one final byte); then
# their 8-bit forms (CSI U+009B, the strings U+0090/98/9D/9E/9F) and any other C1 control.
_SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b[\]PX^_].*?(?:\x07|\x1b\\|$)"
    r"|\x1b[ -/]*[0-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x90\x98\x9d\x9e\x9f].*?(?:\x07|\x9c|$)"
    r"|[\x80-\x9f]",
    re.DOTALL,
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # C0 but tab and newline, and DEL


def printable(text: str) -> str:
    """``text`` without terminal control sequences or control characters: tab and
    newline stay, a carriage return becomes a newline (a progress bar's updates show
    one per line instead of overwriting what came before)."""
    text = _SEQUENCES.sub("", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROLS.sub("", text)


def follow_log(
    path: Path,
    *,
    follow: bool,
    raw: bool,
    max_bytes: int,
    out: Callable[[str], None],
    note: Callable[[str], None],
) -> None:
    """Print ``path`` through ``out``: its last ``max_bytes`` (0: all of it), then, with
    ``follow``, what the job appends, once a second, until interrupted. Raises
    :class:`DlhpcError` when the log is not a regular file (a symlink, a FIFO)."""
    fd = _open(path, wait=follow)
    if fd is None:
        return
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes) if max_bytes > 0 else 0
        if start:
            note(f"(the first {start:,} bytes of {path} are not shown; --max-bytes 0 shows all)")
        os.lseek(fd, start, os.SEEK_SET)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            while chunk := os.read(fd, _CHUNK):
                text = decoder.decode(chunk)
                out(text if raw else printable(text))
            if not follow:
                return
            time.sleep(1.0)
    finally:
        os.close(fd)


def _open(path: Path, wait: bool) -> int | None:
    """The log's descriptor; None when it is absent and ``wait`` is off (with ``wait``,
    polls once a second until the job creates it)."""
    while True:
        try:
            fd, _ = open_regular(path)
            return fd
        except FileNotFoundError:
            if not wait:
                return None
        except UnsafeFile as err:
            raise DlhpcError(f"not printed: {err}") from None
        time.sleep(1.0)
