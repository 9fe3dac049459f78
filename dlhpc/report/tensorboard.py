"""TensorBoard event files of an experiment's metrics, written from the database.

Layout, under the experiment's run folder::

    runs/exp-000007-<slug>/tensorboard/           TensorBoard's logdir for one experiment
      events.out.tfevents.experiment.dlhpc        the HParams experiment (hparams + metrics)
      trial-000042/                               one TensorBoard run per trial
        events.out.tfevents.00000001.dlhpc        the session start (hparams), first points
        events.out.tfevents.00000002.dlhpc        the points of a later export, ...
        .dlhpc-tensorboard.json                   the watermark

Incremental, and safe against a crash at any line. The watermark (written atomically
after the event file it names) holds the event files written, the next file number,
the highest ``metrics.id`` written (rows only ever get higher ids), each tag's highest
step and whether the session end was written. An export writes the trial's rows above
that id into one new file, numbered after every file before it, then the watermark. It
*rewrites* the trial (its event files deleted, one file with every point written, then
the watermark) when the event files on disk are not exactly those the watermark names
(a crash between a file and its watermark, a missing or unreadable watermark), when a
new point's step is not after its tag's last written step (TensorBoard's data server
drops a tag's points from a repeated step on), or when new points would make its
:data:`MAX_FILES`-th file (an export every minute of a long run: one file, not
thousands). So every point is in exactly one file after each export: none lost, none
twice.

Files are published by rename from temporary names that lack ``tfevents`` (TensorBoard
reads any file whose name has it). Exports of one experiment are serialized by a lock
file. Only the database is read (no lease: nothing in it changes); ``dlhpc tick``
never calls this. A running TensorBoard picks up new files; after a rewrite it may show
the old points too until it is restarted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import select

from dlhpc._perms import fix_fd_mode, make_dirs
from dlhpc._safepath import inside
from dlhpc.errors import DlhpcError, NotFoundError
from dlhpc.protocol.atomic import fsync_dir
from dlhpc.report import _tb_events as ev
from dlhpc.report._tb_events import require_tensorboard, tensorboard_installed
from dlhpc.states import TERMINAL_TRIAL_STATES, TrialState
from dlhpc.store import Experiment, Metric, Store, Trial

__all__ = [
    "EXPERIMENT_FILE",
    "MAX_FILES",
    "TENSORBOARD_DIR",
    "WATERMARK_FILE",
    "TensorboardExport",
    "export_tensorboard",
    "require_tensorboard",
    "tensorboard_dir",
    "tensorboard_installed",
]

TENSORBOARD_DIR = "tensorboard"
EXPERIMENT_FILE = "events.out.tfevents.experiment.dlhpc"
WATERMARK_FILE = ".dlhpc-tensorboard.json"
_LOCK_FILE = ".dlhpc-tensorboard.lock"
_EVENT_FILE = re.compile(r"events\.out\.tfevents\.(\d{8})\.dlhpc")
MAX_FILES = 64  # a trial with this many event files is written anew as one
_END_STATUS = {TrialState.COMPLETED.value: "STATUS_SUCCESS"}  # other ends: STATUS_FAILURE


@dataclass
class TensorboardExport:
    """What one export of an experiment did. ``logdir`` is its TensorBoard logdir;
    ``points``: metric points written this time; ``rewritten``: trials written anew."""

    experiment_id: int
    logdir: Path
    trials: int = 0
    points: int = 0
    files: int = 0
    rewritten: list[int] = field(default_factory=list)


@dataclass
class _Watermark:
    files: list[str] = field(default_factory=list)
    next: int = 1
    last_id: int = 0
    steps: dict[str, int] = field(default_factory=dict)
    ended: bool = False


def tensorboard_dir(run_dir: str | Path) -> Path:
    """An experiment's TensorBoard logdir inside its run folder ``run_dir``."""
    return Path(run_dir) / TENSORBOARD_DIR


def _epoch(value: datetime) -> float:
    return value.replace(tzinfo=timezone.utc).timestamp()


def _publish(path: Path, data: bytes) -> None:
    """Atomically, from a temp name TensorBoard does not read, with the umask's mode."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".dlhpc-tb-", suffix=".tmp")
    try:
        fix_fd_mode(fd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def _read_watermark(folder: Path) -> _Watermark | None:
    try:
        data = json.loads((folder / WATERMARK_FILE).read_text(encoding="utf-8"))
        mark = _Watermark(
            files=[str(f) for f in data["files"]],
            next=int(data["next"]),
            last_id=int(data["last_id"]),
            steps={str(k): int(v) for k, v in data["steps"].items()},
            ended=bool(data["ended"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return mark


def _write_watermark(folder: Path, mark: _Watermark) -> None:
    data = json.dumps(mark.__dict__, sort_keys=True).encode("utf-8")
    _publish(folder / WATERMARK_FILE, data)


def _event_files(folder: Path) -> list[str]:
    """The names of the event files in a trial's folder (ours and any other)."""
    return sorted(p.name for p in folder.iterdir() if "tfevents" in p.name and p.is_file())


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _points(store: Store, trial_id: int, after_id: int) -> list[ev.MetricPoint]:
    """The trial's points above ``after_id`` (one short read: a tick is never kept waiting)."""
    with store.read() as s:
        rows = s.execute(
            select(Metric.id, Metric.step, Metric.name, Metric.value, Metric.time)
            .where(Metric.trial_id == trial_id, Metric.id > after_id)
            .order_by(Metric.id)
        ).all()
    return [ev.MetricPoint(*row) for row in rows]


@dataclass(frozen=True)
class _TrialInfo:
    """What an export needs of a trial row (read once, before any file is written)."""

    id: int
    hparams: dict[str, ev.HparamValue]
    created: float
    end: ev.SessionEnd | None

    @classmethod
    def of(cls, trial: Trial) -> _TrialInfo:
        end = None
        if trial.state in TERMINAL_TRIAL_STATES and trial.ended_at is not None:
            status = _END_STATUS.get(trial.state, "STATUS_FAILURE")
            end = ev.SessionEnd(status, _epoch(trial.ended_at))
        hparams = ev.flat_hparams(json.loads(trial.hparams_json or "{}"))
        return cls(trial.id, hparams, _epoch(trial.created_at), end)

    @property
    def folder_name(self) -> str:
        return f"trial-{self.id:06d}"


def _needs_rewrite(mark: _Watermark | None, on_disk: list[str], new: list[ev.MetricPoint]) -> bool:
    if mark is None or sorted(mark.files) != on_disk:
        return True
    if new and len(mark.files) >= MAX_FILES:  # compact: one file, not one per export
        return True
    return any(p.step <= mark.steps.get(p.name, -1) for p in new)


def _start_over(folder: Path, mark: _Watermark | None, on_disk: list[str]) -> _Watermark:
    """Delete the trial's event files; the watermark to write the trial anew with. A
    crash part-way leaves files and a watermark that disagree, so the next export
    starts over again. File numbers go on after the highest one seen."""
    numbers = [int(m.group(1)) for m in map(_EVENT_FILE.fullmatch, on_disk) if m]
    for name in on_disk:
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
    fsync_dir(folder)
    return _Watermark(next=max([mark.next if mark else 1, *(n + 1 for n in numbers)]))


def _export_trial(
    store: Store,
    trial: _TrialInfo,
    folder: Path,
    kinds: dict[str, str],
    result: TensorboardExport,
) -> None:
    """Bring one trial's folder up to the database (the rule in the module docstring)."""
    old = _read_watermark(folder)
    on_disk = _event_files(folder)
    new = _points(store, trial.id, old.last_id if old else 0)
    if old is not None and not _needs_rewrite(old, on_disk, new):
        mark = old
    else:
        if old is not None or on_disk:
            result.rewritten.append(trial.id)
        mark = _start_over(folder, old, on_disk)
        if old is not None and old.last_id > 0:  # the points written before, too
            new = _points(store, trial.id, 0)
    ordered = sorted(new, key=lambda p: (p.step, p.name))  # each tag's steps in order
    events: list[Any] = []
    if not mark.files:  # a new TensorBoard run: its HParams session first
        hparams = ev.in_column(trial.hparams, kinds)
        events.append(ev.session_start_event(hparams, trial.folder_name, trial.created))
    events.extend(ev.point_events(ordered))
    end = None if mark.ended else trial.end
    if end is not None:
        events.append(ev.session_end_event(end))
    if not events:
        return
    name = f"events.out.tfevents.{mark.next:08d}.dlhpc"
    _publish(folder / name, ev.event_file_bytes(events, ordered[0].time if new else trial.created))
    for p in ordered:
        mark.steps[p.name] = max(p.step, mark.steps.get(p.name, -1))
    mark.files.append(name)
    mark.next += 1
    mark.last_id = max([mark.last_id, *(p.id for p in new)])
    mark.ended = mark.ended or end is not None
    _write_watermark(folder, mark)
    result.points += len(new)
    result.files += 1


def _experiment_file(
    store: Store, exp: Experiment, values: dict[str, list[ev.HparamValue]], logdir: Path
) -> None:
    """The HParams experiment (rewritten only when it changed): every trial's
    hyperparameters and every metric name, the searcher's metric first."""
    with store.read() as s:
        names = s.scalars(
            select(Metric.name).distinct().join(Trial).where(Trial.experiment_id == exp.id)
        ).all()
    metrics = [exp.metric, *sorted(set(names) - {exp.metric})]
    created = _epoch(exp.created_at)
    event = ev.experiment_event(exp.name, exp.user, created, values, metrics)
    data = ev.event_file_bytes([event], created)
    path = logdir / EXPERIMENT_FILE
    with contextlib.suppress(OSError):
        if path.read_bytes() == data:
            return
    _publish(path, data)


def export_tensorboard(store: Store, experiment_id: int) -> TensorboardExport:
    """Write (or bring up to date) the TensorBoard event files of experiment
    ``experiment_id``'s trials under ``<run folder>/tensorboard``: every metric point
    of the database once, with the HParams experiment and each trial's session.

    Reads the database only, in short reads (one per trial), never holding it while
    files are written. Raises :class:`~dlhpc.errors.NotFoundError` (exit 2) for an
    unknown experiment, :class:`~dlhpc.errors.UsageError` (exit 2) without the
    ``tensorboard`` package, :class:`~dlhpc.errors.UnsafePathError` when the
    ``tensorboard`` folder or a trial's folder in it leads out of the run folder (a
    symlink: nothing is written or deleted there), and
    :class:`~dlhpc.errors.DlhpcError` when the run folder is missing or a folder or
    file cannot be written.
    """
    require_tensorboard()
    with store.read() as s:
        exp = s.get(Experiment, experiment_id)
        if exp is None:
            raise NotFoundError(f"no experiment {experiment_id}")
        trials = [_TrialInfo.of(t) for t in exp.trials]
    if not Path(exp.run_dir).is_dir():  # never made anew here: its files are gone
        raise DlhpcError(f"experiment {experiment_id}'s run folder {exp.run_dir} is missing")
    logdir = tensorboard_dir(exp.run_dir)
    result = TensorboardExport(experiment_id, logdir, trials=len(trials))
    values: dict[str, list[ev.HparamValue]] = {}  # each column's values, all trials
    for trial in trials:
        for name, value in trial.hparams.items():
            values.setdefault(name, []).append(value)
    kinds = ev.column_kinds(values)
    try:
        make_dirs(logdir, store.permissions)
        inside(exp.run_dir, logdir, "TensorBoard folder")
        with _locked(logdir):
            for trial in trials:
                folder = make_dirs(logdir / trial.folder_name, store.permissions)
                inside(exp.run_dir, folder, "TensorBoard folder")  # no symlink out of it
                _export_trial(store, trial, folder, kinds, result)
            _experiment_file(store, exp, values, logdir)
    except OSError as err:
        raise DlhpcError(
            f"cannot write TensorBoard files under {logdir}: {err.strerror or err}"
        ) from err
    return result
