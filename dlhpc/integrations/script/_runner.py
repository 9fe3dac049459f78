"""The script runner: one plain script as a child process, its metrics, checkpoints, signals.

entry.sh starts it (``exec $DLHPC_PYTHON -m dlhpc.integrations.script [--metrics-pattern P]
-- TOKEN...``) with the template's tokens; it reads ``trial.json`` (through
:func:`dlhpc.harness.entry.init`), fills the tokens (:func:`dlhpc._argv_template.fill`)
and runs the script without a shell, in its own process group.

On its one thread it loops about twice a second: echoes and matches stdout lines
(when a pattern is given; else stdout is the script's own), reads new lines of the
metrics file, registers complete checkpoints (a look every second,
:mod:`._checkpoints`) and looks for the searcher's stop file every 2 s. TERM, USR2
and INT are forwarded to the script's process group and mark the run as stopped;
USR1 is forwarded only. A stop decision sends TERM.

Exit code: the script's (a signal death as 128+n) when nothing stopped it; after a
forwarded TERM/USR2/INT or a stop decision always
:data:`~dlhpc.protocol.REQUEUE_EXIT_CODE` (75), whatever the script returned: dlhpc
then runs the trial again from its latest verified checkpoint (or, for a stop
decision, not at all). A script that ends by itself with 0 completes the trial.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from dlhpc._argv_template import fill
from dlhpc.harness.context import TrialContext
from dlhpc.integrations.script._checkpoints import (
    SCRIPT_SUBDIR,
    ScriptCheckpoints,
    resume_path,
    step_of,
)
from dlhpc.integrations.script._metrics import JsonlTail, LinePattern, Metrics
from dlhpc.protocol import REQUEUE_EXIT_CODE, TRIAL_DIR_VAR, stop_requested
from dlhpc.protocol.checkpoint import Checkpoint

__all__ = ["METRICS_FILE_NAME", "METRICS_FILE_VAR", "ScriptRunner"]

METRICS_FILE_VAR = "DLHPC_METRICS_FILE"
CHECKPOINT_DIR_VAR = "DLHPC_CHECKPOINT_DIR"
RESUME_VAR = "DLHPC_RESUME"
METRICS_FILE_NAME = "script-metrics.jsonl"
_STOPS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)
_FORWARDED = (*_STOPS, signal.SIGUSR1)
_TICK_S = 0.5
_LOOK_EVERY_S = 1.0
_STOP_FILE_EVERY_S = 2.0
_STDOUT_GRACE_S = 5.0  # after the script exited, how long its stdout may stay open


@dataclass
class _Entry:
    """What :meth:`TrialContext.checkpoint` saves: one registration of a script entry."""

    step: int
    checkpoints: ScriptCheckpoints
    name: str

    def save(self) -> Checkpoint:
        return self.checkpoints.publish(self.name, self.step)


class ScriptRunner:
    """Runs ``tokens`` (filled) for the trial of ``ctx``; :meth:`run` returns the exit code."""

    def __init__(self, ctx: TrialContext, tokens: Sequence[str], pattern: str | None) -> None:
        if ctx.spec is None:
            raise ValueError("the script runner needs a dlhpc job's trial (DLHPC_TRIAL_DIR)")
        self.ctx = ctx
        self.spec = ctx.spec
        self.tokens = list(tokens)
        self.trial_dir = Path(os.environ[TRIAL_DIR_VAR])
        root = Path(self.spec.checkpoint_dir)
        self.root = root
        self.checkpoints = ScriptCheckpoints(root / SCRIPT_SUBDIR, root)
        out_dir = ctx.attempt_dir if ctx.attempt_dir is not None else self.trial_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_file = out_dir / METRICS_FILE_NAME
        self.jsonl = JsonlTail(self.metrics_file, self._note)
        self.pattern = LinePattern(pattern, self._note) if pattern is not None else None
        self.stopped_by: str | None = None  # the first TERM/USR2/INT, or "searcher"
        self.last_step = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()

    def _note(self, message: str) -> None:
        self.ctx.log("warning", message)

    def argv(self, resume: str) -> list[str]:
        """The script's argv: the tokens with hyperparameters and dlhpc's names filled
        (``resume``: the value of ``{checkpoint}``)."""
        spec = self.spec
        values: dict[str, object] = {
            **spec.hparams,
            "trial_id": spec.trial_id,
            "experiment_id": spec.experiment_id,
            "seed": spec.seed,
            "max_length": spec.max_length,
            "checkpoint_dir": str(self.checkpoints.script_dir),
            "checkpoint": resume,
            "metrics_file": str(self.metrics_file),
        }
        return fill(self.tokens, values)

    # -- signals -----------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum in _STOPS and self.stopped_by is None:
            self.stopped_by = signal.Signals(signum).name.removeprefix("SIG")
        self._send(signum)

    def _send(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    # -- the run -------------------------------------------------------------------

    def run(self) -> int:
        """Start the script, loop until it ends, register its last checkpoints, and
        return the exit code (see the module doc)."""
        resume = resume_path(self.root)
        argv = self.argv(resume)
        env = dict(os.environ)
        env[METRICS_FILE_VAR] = str(self.metrics_file)
        env[CHECKPOINT_DIR_VAR] = str(self.checkpoints.script_dir)
        env[RESUME_VAR] = resume
        if resume:
            self.ctx.log("info", f"resuming from {resume}")
        for sig in _FORWARDED:  # after init(): these replace the context's handlers
            signal.signal(sig, self._on_signal)
        print(f"[dlhpc] running {shlex.join(argv)}", file=sys.stderr, flush=True)
        try:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.PIPE if self.pattern is not None else None,
                start_new_session=True,  # its own process group: forwarding reaches it once
            )
        except OSError as exc:
            self.ctx.log("error", f"cannot start {argv[0]!r}: {exc}")
            self.ctx.close()
            return 127
        if self.stopped_by is not None:  # a signal before the script existed
            self._send(signal.SIGTERM)
        reader = self._start_reader(self.proc.stdout)
        code = self._loop(self.proc, reader)
        return self._finish(code)

    def _start_reader(self, stream: IO[bytes] | None) -> threading.Thread | None:
        if stream is None:
            return None

        def read() -> None:
            out = sys.stdout.buffer
            for raw in stream:
                with contextlib.suppress(OSError, ValueError):
                    out.write(raw)
                    out.flush()
                self.lines.put(raw.decode("utf-8", errors="replace"))
            self.lines.put(None)

        thread = threading.Thread(target=read, name="dlhpc-script-stdout", daemon=True)
        thread.start()
        return thread

    def _loop(self, proc: subprocess.Popen[bytes], reader: threading.Thread | None) -> int:
        next_look = time.monotonic() + _LOOK_EVERY_S
        next_stop = time.monotonic() + _STOP_FILE_EVERY_S
        reader_done = reader is None
        ended: float | None = None  # when the script exited
        while True:
            reader_done = self._drain(_TICK_S) or reader_done
            for item in self.jsonl.read():
                self._report(item)
            now = time.monotonic()
            running = proc.poll() is None
            if running and now >= next_look:
                next_look = now + _LOOK_EVERY_S
                self._register(self.checkpoints.stable())
            if running and now >= next_stop:
                next_stop = now + _STOP_FILE_EVERY_S
                if self.stopped_by is None and stop_requested(self.trial_dir):
                    self.stopped_by = "searcher"
                    self.ctx.log("info", "the searcher stopped this trial: SIGTERM to the script")
                    self._send(signal.SIGTERM)
            if not running:
                ended = now if ended is None else ended
                # a child of the script may hold stdout open: wait for it a little only
                if reader_done or now - ended >= _STDOUT_GRACE_S:
                    return proc.wait()

    def _drain(self, timeout: float) -> bool:
        """Handle the stdout lines queued, waiting up to ``timeout`` for the first;
        True once the reader has finished."""
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            return False
        while True:
            if item is None:
                return True
            if self.pattern is not None and (found := self.pattern.match(item)) is not None:
                self._report(found)
            try:
                item = self.lines.get_nowait()
            except queue.Empty:
                return False

    def _report(self, item: Metrics) -> None:
        step, metrics = item
        self.ctx.report(step, metrics)
        self.last_step = step
        self.ctx.progress(step)

    def _register(self, names: list[str]) -> None:
        if self.ctx.rank != 0:  # one registrar per trial; every rank's script shares the folder
            return
        for name in names:
            entry = _Entry(step_of(name, self.last_step), self.checkpoints, name)
            try:
                self.ctx.checkpoint(entry)
            except (OSError, ValueError) as exc:
                self.ctx.log("warning", f"checkpoint {name} not registered: {exc}")

    def _finish(self, code: int) -> int:
        if code < 0:
            code = 128 - code
        for item in self.jsonl.read():
            self._report(item)
        if code == 0:  # a clean exit: whatever it wrote is complete
            self._register(self.checkpoints.changed())
        if self.stopped_by is not None:
            self.ctx.log(
                "info",
                f"the script ended with {code} after {self.stopped_by}; exit"
                f" {REQUEUE_EXIT_CODE} (dlhpc resumes it from its latest checkpoint)",
            )
            code = REQUEUE_EXIT_CODE
        self.ctx.close()
        return code
