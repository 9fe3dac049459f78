"""The typed status model: what :func:`dlhpc.report.status.status_data` returns, and
its JSON (``dlhpc status --json``), which orjson encodes from these classes.

The JSON of a class holds its fields in their order, under their names, but those whose
name starts with ``_`` (orjson leaves them out: they are the report page's). Times are
naive UTC :class:`~datetime.datetime` values (the DB's), written as ISO 8601 with a
``Z``; a trial's hyperparameters are its stored JSON text (:class:`JsonText`), written
into the document as they are; a float that is not finite is written as ``null``.
:func:`write_json` writes the document experiment by experiment and trial by trial (one
line per trial), so that 100,000 trials are never held at once. The per-trial classes
are neither slotted (orjson encodes a dataclass from its ``__dict__`` several times
faster) nor frozen (100,000s are built per ``status --json``, and a frozen one costs
five times as much to build): treat them as read-only all the same."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

import orjson

__all__ = [
    "AttemptStatus",
    "CheckedDiskUse",
    "DecisionStats",
    "DiskUse",
    "ExperimentStatus",
    "GpuUse",
    "Head",
    "IdleGpu",
    "JsonText",
    "LatestNote",
    "Latency",
    "Status",
    "TrialGpu",
    "TrialStatus",
    "encode",
    "write_json",
]


class JsonText(str):
    """JSON text (a trial's stored hyperparameters), written into a document as it is."""

    __slots__ = ()


def _as_is(value: Any) -> Any:
    """orjson's ``default``: a :class:`JsonText` as its text; nothing else is expected."""
    if type(value) is JsonText:
        return orjson.Fragment(str(value))
    raise TypeError(f"not a status model value: {type(value).__name__}")


# a naive time is UTC, written with a "Z"; subclasses of str (JsonText) go to _as_is
_OPTIONS = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z | orjson.OPT_PASSTHROUGH_SUBCLASS


def encode(value: Any) -> bytes:
    """``value`` (of this model, or lists and dicts of it) as compact JSON, UTF-8."""
    return orjson.dumps(value, default=_as_is, option=_OPTIONS)


class _Json:
    """``to_json``: the value's JSON (:func:`encode`) read back as Python values."""

    __slots__ = ()

    def to_json(self) -> Any:
        return orjson.loads(encode(self))


@dataclass
class GpuUse(_Json):
    """An attempt's GPU telemetry: GPUs seen, mean utilization, newest sample."""

    gpus: int
    util_mean: float | None
    last_sample_at: datetime


@dataclass
class TrialGpu(_Json):
    """A trial's GPU use: that of its newest attempt with samples (``attempt_key``)."""

    attempt_key: str
    gpus: int
    util_mean: float | None
    last_sample_at: datetime

    @classmethod
    def of(cls, attempt_key: str, gpu: GpuUse) -> TrialGpu:
        return cls(attempt_key, gpu.gpus, gpu.util_mean, gpu.last_sample_at)


@dataclass
class IdleGpu(_Json):
    """A GPU of a live attempt idle (below ``below_pct``) since ``idle_since``."""

    trial_id: int
    attempt_key: str
    host: str
    gpu_index: int
    idle_minutes: float
    idle_since: datetime
    below_pct: float


@dataclass(frozen=True, slots=True)
class LatestNote(_Json):
    """The newest note of an experiment or trial, and how many notes it has."""

    text: str
    user: str
    created_at: datetime
    count: int


@dataclass
class AttemptStatus(_Json):
    key: str
    job_id: str
    state: str
    cause: str | None
    exit_code: int | None
    lost_steps: int | None
    node_list: str | None
    started_at: datetime | None
    ended_at: datetime | None
    gpu: GpuUse | None
    gpu_hours: float
    cpu_hours: float
    _exit_reason: str | None = None  # the page's, not in the JSON
    _terminal_seen_at: datetime | None = None  # the page's, not in the JSON

    @property
    def exit_reason(self) -> str | None:
        return self._exit_reason

    @property
    def terminal_seen_at(self) -> datetime | None:
        return self._terminal_seen_at


@dataclass
class TrialStatus(_Json):
    id: int
    state: str
    hparams: JsonText  # as stored (json.dumps, sorted keys): see ``hparams_dict``
    steps_completed: int
    max_length: int
    target_length: int  # what progress counts toward (see report.status)
    best_metric: float | None
    latest_metric: float | None
    restarts: int
    crashes: int
    slurm_job_ids: tuple[str, ...]
    error: str | None
    gpu: TrialGpu | None  # the newest attempt with samples
    idle_gpus: tuple[IdleGpu, ...]
    gpu_hours: float
    cpu_hours: float
    attempts: tuple[AttemptStatus, ...]
    _run_dir: str = ""  # the page's, not in the JSON
    tags: tuple[str, ...] = ()
    note: LatestNote | None = None  # the newest note

    @property
    def hparams_dict(self) -> dict[str, Any]:
        """The trial's hyperparameters (parsed on each access)."""
        value: dict[str, Any] = json.loads(self.hparams)
        return value

    @property
    def run_dir(self) -> str:
        return self._run_dir


@dataclass(frozen=True, slots=True)
class Latency(_Json):
    """Seconds from the newest result the searcher had seen to the decision acted on."""

    n: int
    median: float
    max: float


@dataclass(frozen=True, slots=True)
class DecisionStats(_Json):
    promotions: int
    stops: int
    pending: int  # decided, not acted on yet
    latency_s: Latency | None


@dataclass(frozen=True, slots=True)
class DiskUse(_Json):
    """Checkpoint use from the checkpoint rows (no disk scan). The CLI's quota check
    (``lfs quota``) makes it a :class:`CheckedDiskUse` (:meth:`with_quota`)."""

    checkpoints: int
    checkpoint_bytes: int
    deleted_checkpoints: int
    freed_bytes: int
    checkpoint_root: str | None

    def with_quota(self, warning: str | None) -> CheckedDiskUse:
        """This use, its quota checked: ``warning`` is the check's (None: none)."""
        return CheckedDiskUse(
            self.checkpoints, self.checkpoint_bytes, self.deleted_checkpoints,
            self.freed_bytes, self.checkpoint_root, warning,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class CheckedDiskUse(DiskUse):
    """:class:`DiskUse` once the CLI checked the quota: ``quota_warning`` in the JSON."""

    quota_warning: str | None


@dataclass(frozen=True, slots=True)
class ExperimentStatus(_Json):
    """An experiment, its totals over every trial, and the trials listed (all, or at
    most a listing's ``limit``: see :func:`dlhpc.report.status.pick_trials`); ``trials``
    last (:func:`write_json` writes them after the rest)."""

    id: int
    name: str
    state: str
    searcher: str
    metric: str
    smaller_is_better: bool
    backend: str
    created_at: datetime
    ended_at: datetime | None
    run_dir: str
    max_length: int | None
    gpus_per_job: int
    cpus_per_job: int
    gpu_hours: float
    cpu_hours: float
    idle_gpus: tuple[IdleGpu, ...]
    trials_total: int
    trial_counts: dict[str, int]
    decisions: DecisionStats | None
    disk: DiskUse | None
    user: str = ""  # who launched it
    tags: tuple[str, ...] = ()
    note: LatestNote | None = None  # the newest note
    trials: tuple[TrialStatus, ...] = ()


@dataclass(frozen=True, slots=True)
class Status(_Json):
    """``dlhpc status``: the experiments, newest first."""

    experiments: tuple[ExperimentStatus, ...]


_BATCH = 256  # trial lines per write
# an experiment's status (its trials empty), or a callable giving it once its trials are
# consumed (its totals summed from them: report.status.iter_status_json)
Head = ExperimentStatus | Callable[[], ExperimentStatus]
_NO_TRIALS = b'"trials":[]}'  # how an experiment's JSON ends when its trials are empty


def write_json(
    experiments: Iterable[tuple[Head, Iterable[TrialStatus]]],
    out: IO[bytes],
    finish: Callable[[ExperimentStatus], ExperimentStatus] | None = None,
) -> None:
    """Write ``{"experiments": [...]}`` (:func:`encode` of a :class:`Status`) to ``out``
    piece by piece: each experiment (its ``trials`` empty: they are the pair's second
    item) up to its trials' ``[``, then its trials one line each. A callable head is
    called after its trials are consumed: their text goes to a temporary file (not
    memory) until the head is written. ``finish`` (e.g. a quota check) is applied to
    each head before it is written."""
    out.write(b'{"experiments":[')
    for i, (head, trials) in enumerate(experiments):
        sep = b"," if i else b""
        if isinstance(head, ExperimentStatus):
            out.write(sep + _head_text(finish(head) if finish else head))
            any_trial = _write_trials(trials, out)
        else:
            with tempfile.TemporaryFile() as tmp:
                any_trial = _write_trials(trials, tmp)
                e = head()
                out.write(sep + _head_text(finish(e) if finish else e))
                tmp.seek(0)
                shutil.copyfileobj(tmp, out, 1 << 20)
        out.write(b"\n  ]}" if any_trial else b"]}")
    out.write(b"\n]}\n")


def _head_text(e: ExperimentStatus) -> bytes:
    """An experiment's line up to its trials' ``[`` (it must have none)."""
    text = encode(e)
    if not text.endswith(_NO_TRIALS):
        raise ValueError("an experiment head with trials: write_json takes them apart")
    return b"\n  " + text[:-2]


def _write_trials(trials: Iterable[TrialStatus], out: IO[bytes]) -> bool:
    """The trials' lines, each after a comma but the first; whether there was one."""
    lines: list[bytes] = []  # written _BATCH at a time: one write per trial costs more
    any_trial = False
    for t in trials:
        lines.append(encode(t))
        if len(lines) == _BATCH:
            out.write((b"," if any_trial else b"") + b"\n    " + b",\n    ".join(lines))
            lines.clear()
            any_trial = True
    if lines:
        out.write((b"," if any_trial else b"") + b"\n    " + b",\n    ".join(lines))
        any_trial = True
    return any_trial
