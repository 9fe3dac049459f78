"""The attempt's ``progress.json`` (:data:`~dlhpc.protocol.PROGRESS_FILE`), for the
reconciler's lost-work accounting.

It says the training step, the step of the last checkpoint and the step the
attempt's training started from (when the script told it); rank 0 rewrites it
atomically, at most every few seconds as steps go by, and at once after a
checkpoint or a start. The worker copies its last ``step`` and ``checkpoint_step``
into the attempt's exit record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dlhpc.protocol import PROGRESS_FILE, atomic_write_text

__all__ = ["PROGRESS_EVERY_S", "Progress"]

PROGRESS_EVERY_S = 5.0  # the longest a step waits to reach the file


class Progress:
    """The values ``progress.json`` holds, and its writes into ``attempt_dir`` (None:
    kept, never written: no attempt folder, or a rank other than 0)."""

    def __init__(self, attempt_dir: Path | None) -> None:
        self.path = attempt_dir / PROGRESS_FILE if attempt_dir is not None else None
        self.step = 0
        self.checkpoint_step: int | None = None
        self.start_step: int | None = None
        self._written = 0.0  # time.monotonic() of the last write

    def note(self, step: int | None) -> None:
        """Note the training ``step`` (None: unchanged); written when the last write is
        :data:`PROGRESS_EVERY_S` old."""
        if step is not None:
            self.step = step
        if time.monotonic() - self._written >= PROGRESS_EVERY_S:
            self.write()

    def started(self, step: int) -> None:
        """Training starts from ``step`` (0: from scratch; else the resumed checkpoint's,
        whose work is saved); written at once."""
        self.step = self.start_step = step
        if step > 0:
            self.checkpoint_step = step
        self.write()

    def write(self) -> None:
        """Publish the values now (atomically)."""
        self._written = time.monotonic()
        if self.path is None:
            return
        body = {"time": time.time(), "step": self.step, "checkpoint_step": self.checkpoint_step}
        body["start_step"] = self.start_step
        atomic_write_text(self.path, json.dumps(body))
