"""The detached process that runs one local batch: ``python -m
dlhpc.scheduler.local.runner BATCH_JSON [--lock-fd N]``.

It holds the batch's ``runner.lock`` for its whole life (inherited from the
submitter through ``--lock-fd``, so there is no moment where a live batch looks
dead), starts at most ``max_parallel`` tasks at a time in task order, each in
its own process group with ``DLHPC_JOB_ID=local-<batch>_<i>``, and publishes
every task's state in ``status/<i>.json``. A cancel marker stops a pending task
from starting and gets a running task's group SIGTERM, then SIGKILL after
:data:`KILL_AFTER_S` (to the entrypoint's group too, which the task's worker names
in ``status/<i>.pgid``). SIGTERM/SIGINT to the runner cancels the whole batch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from dlhpc.scheduler.local.batch import Batch, BatchPaths, job_id, lock_exclusive
from dlhpc.scheduler.local.environment import GROUP_FILE_VAR, read_group_file

__all__ = ["KILL_AFTER_S", "main", "run_batch"]

KILL_AFTER_S = 10.0
TICK_S = 0.1


@dataclass
class _Task:
    proc: subprocess.Popen[bytes]
    start: float
    files: list[IO[bytes]]
    term_sent: float | None = None


@dataclass
class _Runner:
    batch: Batch
    paths: BatchPaths
    running: dict[int, _Task] = field(default_factory=dict)
    stop: bool = False

    def on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self.stop = True

    def start(self, index: int) -> None:
        trial = self.batch.trial_dirs[index]
        env = dict(os.environ, **self.batch.env, DLHPC_JOB_ID=job_id(self.batch.batch, index))
        env[GROUP_FILE_VAR] = str(self.paths.group(index))
        self.paths.stdout(index).parent.mkdir(parents=True, exist_ok=True)
        out = self.paths.stdout(index).open("ab")
        err = self.paths.stderr(index).open("ab")
        now = time.time()
        try:
            proc = subprocess.Popen(
                [*self.batch.command, trial],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            out.close()
            err.close()
            self.paths.write_status(
                index, "FAILED", start=now, end=time.time(), reason=f"could not start: {exc}"
            )
            return
        self.running[index] = _Task(proc, now, [out, err])
        self.paths.write_status(index, "RUNNING", pid=proc.pid, start=now)

    def signal_cancelled(self, cancelled: set[int]) -> None:
        now = time.time()
        for index, task in self.running.items():
            if index not in cancelled and not self.stop:
                continue
            if task.term_sent is None:
                task.term_sent = now
                _killpg(task.proc.pid, signal.SIGTERM)
            elif now - task.term_sent > KILL_AFTER_S:
                # the entrypoint's group first: it is gone once the task's worker dies
                child = read_group_file(self.paths.group(index))
                if child is not None and task.proc.poll() is None:
                    _killpg(child, signal.SIGKILL)
                _killpg(task.proc.pid, signal.SIGKILL)

    def reap(self) -> None:
        for index, task in list(self.running.items()):
            code = task.proc.poll()
            if code is None:
                continue
            del self.running[index]
            for f in task.files:
                f.close()
            if code == 0:
                state = "COMPLETED"
            elif task.term_sent is not None:
                state = "CANCELLED"
            else:
                state = "FAILED"
            exit_code = code if code >= 0 else 128 - code
            self.paths.write_status(
                index,
                state,
                pid=task.proc.pid,
                start=task.start,
                end=time.time(),
                exit_code=exit_code,
            )

    def run(self) -> None:
        pending = list(range(len(self.batch.trial_dirs)))
        limit = max(1, self.batch.max_parallel)
        while pending or self.running:
            cancelled = self.paths.cancelled()
            if self.stop:
                cancelled |= set(pending)
            for index in [i for i in pending if i in cancelled]:
                pending.remove(index)
                self.paths.write_status(index, "CANCELLED", end=time.time(), reason="cancelled")
            self.signal_cancelled(cancelled)
            self.reap()
            while pending and len(self.running) < limit and not self.stop:
                self.start(pending.pop(0))
            if pending or self.running:
                time.sleep(TICK_S)


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def run_batch(spec: Path, lock_fd: int | None = None) -> None:
    """Run the batch described by ``spec``; returns when every task is final."""
    paths = BatchPaths(spec.parent)
    if lock_fd is None:
        lock_fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
        if not lock_exclusive(lock_fd, block=False):
            raise SystemExit(f"another runner holds {paths.lock}")
    runner = _Runner(Batch.read(spec), paths)
    signal.signal(signal.SIGTERM, runner.on_signal)
    signal.signal(signal.SIGINT, runner.on_signal)
    runner.run()
    os.close(lock_fd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[1] == "--lock-fd" and args[2].isdigit():
        run_batch(Path(args[0]), int(args[2]))
    elif len(args) == 1:
        run_batch(Path(args[0]))
    else:
        usage = "usage: python -m dlhpc.scheduler.local.runner BATCH_JSON [--lock-fd N]"
        print(usage, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
