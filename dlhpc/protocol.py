"""The file protocol between jobs and the reconciler.

Compute nodes never open the database (principle 2). A job writes only
*immutable* files, each published atomically (write a temp name, fsync,
``os.replace``, fsync the folder); the reconciler ingests each file exactly
once, keyed by (attempt, file name). This module is the single definition of
the layout and the record format, imported by both sides; it depends on the
standard library only so that it is cheap to import inside a job.

Layout under an experiment's run folder::

    exp-000007/
      experiment.json            resolved config (written at launch)
      entry.sh                   site modules + environment.setup + exec entrypoint
      code/                      snapshot of the workdir at launch
      trials/trial-000042/
        trial.json               TrialSpec (hyperparameters never go through a shell)
        attempts/<attempt_key>/
          <stream>-<seq:08d>.jsonl   immutable event batches

``attempt_key`` names one run of a trial by a scheduler: ``<job_id>.r<restart>``
(``job_id`` is ``123_4`` for array task 4 of job 123). ``stream`` names one
writer inside an attempt (``worker-r0``, ``user-r0``, ...), so concurrent
writers never race on sequence numbers.

Event records (one JSON object per line, ``type`` first):

* ``{"type": "start", "time", "host", "pid", "job_id", "restart", "rank", "nodes"}``
* ``{"type": "metric", "time", "step", "metrics": {name: float}}``
* ``{"type": "exit", "time", "code", "reason", "signal", "step", "checkpoint_step"}``;
  reason is ``completed``, ``requeue`` (the script checkpointed and exited with
  :data:`REQUEUE_EXIT_CODE` to be run again), ``signal`` (it died of a signal Slurm
  sent, e.g. at preemption) or ``error``; ``signal`` names the first signal the
  worker saw (``TERM``, ``USR2``...) or is null
* ``{"type": "checkpoint", "time", "step", "path", "size", "metric", "metric_step"}``: a
  checkpoint was published; ``metric`` is the searcher metric reported since the
  previous checkpoint (null: none was; absent in older jobs' records)
* ``{"type": "log", "time", "level", "message"}``
* ``{"type": "env", "time", "rank", "record": {...}}``: the attempt's environment as
  the job saw it (host, nodes, CPU, GPUs/driver/CUDA, allowed env vars, data
  fingerprint; see :mod:`dlhpc.repro`), from local rank 0 of each node; ingested into
  ``attempts.env_json``
* ``{"type": "gpu", "time", "host", "gpus": [...]}``: GPU samples of one node, stream
  ``gpu-n<node>`` (see :mod:`dlhpc.harness.telemetry`); ingested into ``gpu_samples``

Besides the immutable event files, an attempt folder holds two small files that
are rewritten in place (atomically) and only read: ``heartbeat.json`` (the
worker's liveness, every :data:`HEARTBEAT_INTERVAL_S`) and ``progress.json``
(the training script's step and last checkpoint step, for lost-work accounting).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dlhpc._perms import fix_fd_mode

__all__ = [
    "EVENT_FILE_RE",
    "HEARTBEAT_FILE",
    "HEARTBEAT_INTERVAL_S",
    "PROGRESS_FILE",
    "REQUEUE_EXIT_CODE",
    "STOP_FILE",
    "read_small_json",
    "EventBatch",
    "EventWriter",
    "TrialSpec",
    "atomic_write_bytes",
    "atomic_write_text",
    "attempt_key",
    "experiment_dir",
    "iter_attempt_dirs",
    "read_event_batches",
    "trial_dir",
]

REQUEUE_EXIT_CODE = 75  # sysexits' EX_TEMPFAIL: "checkpointed, run me again"
HEARTBEAT_INTERVAL_S = 15.0
HEARTBEAT_FILE = "heartbeat.json"
PROGRESS_FILE = "progress.json"
# in the trial folder: the searcher stopped the trial; its job should end at the next step
STOP_FILE = "stop.json"

EVENT_FILE_RE = re.compile(r"^(?P<stream>[A-Za-z0-9_-]+)-(?P<seq>\d{8})\.jsonl$")
_STREAM_RE = re.compile(r"^[A-Za-z0-9_]+(-[A-Za-z0-9_]+)*$")


def experiment_dir(runs_root: Path, experiment_id: int) -> Path:
    return runs_root / f"exp-{experiment_id:06d}"


def trial_dir(runs_root: Path, experiment_id: int, trial_id: int) -> Path:
    return experiment_dir(runs_root, experiment_id) / "trials" / f"trial-{trial_id:06d}"


def attempt_key(job_id: str, restart: int) -> str:
    """The folder name of one attempt: ``123_4.r0``."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", job_id):
        raise ValueError(f"unsafe job id {job_id!r}")
    return f"{job_id}.r{restart}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _landed(tmp: str, path: Path, data: bytes) -> bool:
    """True when a rename of ``tmp`` to ``path`` that reported an error happened anyway.

    On NFS a RENAME whose reply was lost is retransmitted, and the server may answer
    the retry with ENOENT or ESTALE although the first try succeeded. The temp name
    is unique to the call, so "temp gone and ``path`` holds exactly ``data``" means
    the rename is done.
    """
    if os.path.lexists(tmp):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(data) + 1) == data
    except OSError:
        return False


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Publish ``data`` at ``path`` atomically: readers see all of it or nothing.

    A rename that reports an error but happened (NFS) counts as done, so a caller
    never publishes the same records again under another name.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        fix_fd_mode(fd)  # mkstemp's 0600 -> what the umask (the site's policy) gives
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except OSError:
            if not _landed(tmp, path, data):
                raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@dataclass(frozen=True)
class TrialSpec:
    """What a job needs to run one trial; stored as ``trial.json``."""

    experiment_id: int
    trial_id: int
    hparams: dict[str, Any]
    max_length: int
    seed: int
    experiment_dir: str
    code_dir: str
    entry_script: str
    checkpoint_dir: str
    metric: str
    smaller_is_better: bool
    env: dict[str, str] = field(default_factory=dict)
    keep_latest: int = 1  # checkpoints of this trial to keep (checkpoint.keep_latest)
    deterministic: bool = False  # reproducibility.deterministic
    deepspeed: dict[str, Any] | None = None  # the resolved `deepspeed.config` mapping
    # declared data inputs (`data:`), fingerprinted at attempt start: [{"path", "hash"}]
    data: list[dict[str, Any]] = field(default_factory=list)
    umask: int | None = None  # the site's permission policy; the worker applies it first

    def write(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(asdict(self), indent=2, sort_keys=True))

    @classmethod
    def read(cls, path: Path) -> TrialSpec:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


class EventWriter:
    """Buffers event records and publishes them as immutable numbered files.

    Not thread-safe; one writer per (attempt folder, stream). ``flush`` is
    cheap when nothing is buffered. A writer resumes numbering after the
    highest existing file of its stream, so a restarted process never
    overwrites a published file.
    """

    def __init__(self, attempt_dir: Path, stream: str) -> None:
        if not _STREAM_RE.fullmatch(stream):
            raise ValueError(f"bad stream name {stream!r}")
        self.attempt_dir = attempt_dir
        self.stream = stream
        attempt_dir.mkdir(parents=True, exist_ok=True)
        existing = [
            int(m["seq"])
            for p in attempt_dir.iterdir()
            if (m := EVENT_FILE_RE.match(p.name)) and m["stream"] == stream
        ]
        self._seq = max(existing, default=-1) + 1
        self._buffer: list[dict[str, Any]] = []

    def add(self, record_type: str, **fields: Any) -> None:
        self._buffer.append({"type": record_type, "time": time.time(), **fields})

    def pending(self) -> int:
        return len(self._buffer)

    def flush(self) -> Path | None:
        """Publish buffered records as one new file; returns its path (None if empty)."""
        if not self._buffer:
            return None
        body = "".join(json.dumps(r, sort_keys=True, allow_nan=True) + "\n" for r in self._buffer)
        path = self.attempt_dir / f"{self.stream}-{self._seq:08d}.jsonl"
        atomic_write_text(path, body)
        self._seq += 1
        self._buffer.clear()
        return path


@dataclass(frozen=True)
class EventBatch:
    """One published event file."""

    name: str
    records: list[dict[str, Any]]


def iter_attempt_dirs(trial_path: Path) -> Iterator[Path]:
    """The attempt folders of a trial; a symlink (a job pointing elsewhere) is never one."""
    attempts = trial_path / "attempts"
    if attempts.is_symlink() or not attempts.is_dir():
        return
    yield from sorted(p for p in attempts.iterdir() if p.is_dir() and not p.is_symlink())


def read_event_batches(attempt_path: Path, skip: Iterable[str] = ()) -> list[EventBatch]:
    """Read the published event files of an attempt, except those named in ``skip``.

    Temp files (dot-prefixed) are never read, nor is anything but a regular file
    (a symlink could point out of the attempt folder: it is opened with
    ``O_NOFOLLOW`` and returned as a batch without records). A file that does not
    parse is a bug in the writer, not a torn write (publication is atomic), so it
    raises.
    """
    done = set(skip)
    batches = []
    # names, not paths, sorted: the same order (one folder), without Path comparisons
    for name in sorted(os.listdir(attempt_path)):
        if name in done or not EVENT_FILE_RE.match(name):
            continue
        text = _read_regular(attempt_path / name)
        if text is None:  # marked ingested with no records, so it is not looked at again
            batches.append(EventBatch(name, []))
            continue
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        batches.append(EventBatch(name, records))
    return batches


def _read_regular(path: Path) -> str | None:
    """The text of ``path`` if it is a regular file, not through a symlink; else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == errno.ELOOP:  # a symlink
            return None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None  # a fifo or device would block or never end
        return f.read().decode("utf-8")


def read_small_json(path: Path) -> dict[str, Any] | None:
    """A heartbeat or progress file, or None when absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
