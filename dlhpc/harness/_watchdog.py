"""Ending a trial that was asked to stop and does not poll.

``dlhpc.init()`` turns SIGTERM/SIGUSR2 into a request (``ctx.should_stop()``), so
that a script that polls can checkpoint before it exits for requeue. A script
that never polls would then ignore preemption, ``scancel`` and the searcher's
stop decision until Slurm's SIGKILL (or forever, for a stop decision).
:class:`StopWatchdog` is a daemon thread that closes that trap:

* it learns of the stop requests even while the main thread is busy in C code
  (the signal's wakeup fd), and looks for the searcher's stop file every couple
  of seconds;
* when a request has not been seen by the script (``should_stop()`` returning
  true) within the grace (``poll_grace_s``, or twice the longest gap between the
  script's polls so far, whichever is longer), and no checkpoint is being
  written, it logs one line, flushes the trial's records, and makes the main
  thread raise ``SystemExit(75)`` (``finally`` blocks and atexit run);
* if the process still runs ``exit_grace_s`` later (the main thread stuck in C
  code, or the exit swallowed), it publishes what is buffered and ends the
  process with ``os._exit(75)``.

It acts only while the context's own handler is installed for SIGTERM: code that
replaced it (a later context, the plain-script runner, a framework) handles stops
itself, and the watchdog stands aside.

The exit code is :data:`~dlhpc.protocol.REQUEUE_EXIT_CODE`, as for a script
that polls; the trial is run again after a preemption, not after a stop decision.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dlhpc.protocol import REQUEUE_EXIT_CODE, stop_requested

if TYPE_CHECKING:
    from dlhpc.harness.context import TrialContext

__all__ = ["StopWatchdog", "StopWatch"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)  # preemption, time limit (USR1 is NCCL's)
STOP_FILE_EVERY_S = 2.0  # how often the searcher's stop file is looked for


class StopWatch:
    """The stop request and what the script did about it; shared by the main
    thread (signal handler, polls) and the watchdog thread. Plain attributes,
    each written by one side or idempotently."""

    def __init__(self) -> None:
        self.reason: str | None = None  # TERM, USR2 or searcher
        self.since: float | None = None  # monotonic time of the request
        self.noticed = False  # the script saw it, or is exiting on its own
        self.busy = 0  # checkpoints being written: never cut one short
        self.exit_requested = False  # the watchdog asked the main thread to exit
        self.exit_raised = False
        self._last_poll: float | None = None
        self.max_gap = 0.0  # longest time between two polls so far

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason, self.since = reason, time.monotonic()

    def polled(self) -> None:
        now = time.monotonic()
        if self._last_poll is not None and now - self._last_poll > self.max_gap:
            self.max_gap = now - self._last_poll
        self._last_poll = now


class StopWatchdog(threading.Thread):
    """The daemon thread described in the module docstring (one per TrialContext)."""

    def __init__(
        self,
        ctx: TrialContext,
        watch: StopWatch,
        trial_dir: Path | None,
        poll_grace_s: float,
        exit_grace_s: float = 5.0,
    ) -> None:
        super().__init__(name="dlhpc-stop-watchdog", daemon=True)
        self.ctx, self.watch, self.trial_dir = ctx, watch, trial_dir
        self.poll_grace_s, self.exit_grace_s = poll_grace_s, exit_grace_s
        self._rfd, self.wake_fd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self.wake_fd, False)
        self._main = threading.main_thread().ident

    def install_wakeup_fd(self) -> None:
        """Learn of signals while the main thread is in C code (main thread only;
        kept out of the way of an event loop that already set its own)."""
        with contextlib.suppress(ValueError):
            old = signal.set_wakeup_fd(self.wake_fd, warn_on_full_buffer=False)
            if old != -1:
                signal.set_wakeup_fd(old)

    def wake(self, signum: int) -> None:
        """Called by the signal handler (the main thread)."""
        with contextlib.suppress(OSError):
            os.write(self.wake_fd, bytes([signum]))

    def wait_s(self) -> float:
        return max(self.poll_grace_s, 2 * self.watch.max_gap)

    def run(self) -> None:
        next_file_check = time.monotonic()
        while True:
            now = time.monotonic()
            timeout = max(0.0, next_file_check - now) if self.trial_dir is not None else 3600.0
            if self.watch.since is not None:
                timeout = min(timeout, max(0.05, self.watch.since + self.wait_s() - now))
            ready, _, _ = select.select([self._rfd], [], [], timeout)
            if ready:
                self._drain()
            now = time.monotonic()
            if self.trial_dir is not None and now >= next_file_check:
                next_file_check = now + STOP_FILE_EVERY_S
                if self.watch.reason is None and stop_requested(self.trial_dir):
                    self.watch.request("searcher")
            if self._due(now):
                self._end()
                return

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            data = os.read(self._rfd, 512)
            for signum in set(data):
                if signum in STOP_SIGNALS and self.ctx.owns_handler(signum):
                    self.watch.request(signal.Signals(signum).name.removeprefix("SIG"))

    def _due(self, now: float) -> bool:
        w = self.watch
        if w.since is None or w.noticed or w.busy or not self.ctx.in_charge():
            return False
        return now - w.since >= self.wait_s()

    def _message(self) -> str:
        reason = self.watch.reason
        what = "the searcher stopped this trial" if reason == "searcher" else f"received {reason}"
        action = "exiting" if reason == "searcher" else "exiting for requeue"
        return (
            f"[dlhpc] {what} and the script did not poll within {self.wait_s():g}s: "
            f"{action} (call ctx.step()/should_stop() to checkpoint first)"
        )

    def _end(self) -> None:
        message = self._message()
        print(message, file=sys.stderr, flush=True)
        self.ctx.record_log("warning", message.removeprefix("[dlhpc] "))
        self.watch.exit_requested = True
        # the main thread raises SystemExit(75) (in_charge: the handler is this context's)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_kill(self._main or 0, signal.SIGTERM)
        time.sleep(self.exit_grace_s)
        print(
            f"[dlhpc] the main thread did not exit within {self.exit_grace_s:g}s: "
            "ending the process",
            file=sys.stderr,
            flush=True,
        )
        self.ctx.last_resort_flush(timeout_s=5.0)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(REQUEUE_EXIT_CODE)
