"""The on-disk layout of a local batch, shared by the scheduler and the runner.

A batch is the local analogue of one Slurm job array::

    <request.folder>/local-<batch>/
      batch.json         what the runner runs (tasks, env, interpreter, limit)
      batch.txt          the human-readable "script" (what render returns)
      runner.lock        flock held by the runner while it lives
      runner.pid         the runner's pid (informational)
      runner.log         the runner's own stdout/stderr
      status/<i>.json    {"state", "pid", "start", "end", "exit_code", "reason"}
      cancel/<i>         cancel marker of task i (written by cancel)
      logs/<i>.out|.err  task i's stdout/stderr
    <root>/<batch>.batch  one line: the batch folder (lets poll find it by id)

Task ids are ``local-<batch>_<i>``; ``<batch>`` is 8 hex digits. A missing
status file means the task has not started (PENDING). Status files are only
written by the runner, atomically (:func:`dlhpc.protocol.atomic_write_text`).
This module imports the standard library and :mod:`dlhpc.protocol` only: the
runner imports it at start-up.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlhpc.protocol import atomic_write_text

__all__ = [
    "JOB_ID_RE",
    "Batch",
    "BatchPaths",
    "job_id",
    "parse_job_id",
    "runner_alive",
]

JOB_ID_RE = re.compile(r"^local-(?P<batch>[0-9a-f]{8})_(?P<index>\d+)$")
STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED")


def job_id(batch: str, index: int) -> str:
    return f"local-{batch}_{index}"


def parse_job_id(jid: str) -> tuple[str, int]:
    """``local-0a1b2c3d_4`` -> (``0a1b2c3d``, 4); ValueError for anything else."""
    m = JOB_ID_RE.match(jid)
    if m is None:
        raise ValueError(f"not a local job id: {jid!r}")
    return m["batch"], int(m["index"])


@dataclass(frozen=True)
class BatchPaths:
    dir: Path

    @classmethod
    def of(cls, folder: Path, batch: str) -> BatchPaths:
        return cls(folder / f"local-{batch}")

    @property
    def spec(self) -> Path:
        return self.dir / "batch.json"

    @property
    def script(self) -> Path:
        return self.dir / "batch.txt"

    @property
    def lock(self) -> Path:
        return self.dir / "runner.lock"

    @property
    def pid(self) -> Path:
        return self.dir / "runner.pid"

    @property
    def runner_log(self) -> Path:
        return self.dir / "runner.log"

    def status(self, index: int) -> Path:
        return self.dir / "status" / f"{index}.json"

    def group(self, index: int) -> Path:
        """Where task ``index``'s worker writes its entrypoint's process group."""
        return self.dir / "status" / f"{index}.pgid"

    def cancel(self, index: int) -> Path:
        return self.dir / "cancel" / str(index)

    def stdout(self, index: int) -> Path:
        return self.dir / "logs" / f"{index}.out"

    def stderr(self, index: int) -> Path:
        return self.dir / "logs" / f"{index}.err"

    def read_status(self, index: int) -> dict[str, Any] | None:
        """Task ``index``'s status record; None when it has none yet."""
        try:
            record: dict[str, Any] = json.loads(self.status(index).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return record

    def write_status(self, index: int, state: str, **fields: Any) -> None:
        if state not in STATES:
            raise ValueError(f"bad local task state {state!r}")
        record = {"state": state, "pid": None, "start": None, "end": None, "exit_code": None}
        record.update(fields)
        atomic_write_text(self.status(index), json.dumps(record, sort_keys=True))

    def cancelled(self) -> set[int]:
        """Indices with a cancel marker."""
        try:
            names = os.listdir(self.dir / "cancel")
        except FileNotFoundError:
            return set()
        return {int(n) for n in names if n.isdigit()}


@dataclass(frozen=True)
class Batch:
    """What the runner runs (``batch.json``)."""

    batch: str
    name: str
    trial_dirs: list[str]
    command: list[str]  # argv prefix; the trial folder is appended
    env: dict[str, str]
    max_parallel: int

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True)

    @classmethod
    def read(cls, path: Path) -> Batch:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def lock_exclusive(fd: int, *, block: bool) -> bool:
    """flock ``fd``; False when ``block`` is False and another holder exists."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


def runner_alive(paths: BatchPaths) -> bool:
    """Whether the batch's runner still holds its lock (immune to pid reuse)."""
    try:
        fd = os.open(paths.lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        return not lock_exclusive(fd, block=False)
    finally:
        os.close(fd)  # closing releases a lock we may have taken
