"""The typed status model: what :func:`dlhpc.report.status.status_data` returns.

Times are naive UTC :class:`~datetime.datetime` values (the DB's); JSON is made only
by ``to_json`` (``dlhpc status --json``), where a time is ISO 8601 with a ``Z`` and
the keys and their order are those the README documents. :func:`write_json` writes
the document experiment by experiment and trial by trial (one line per trial), so
that 100,000 trials never become one dict or one string. Fields that ``to_json``
leaves out (an attempt's ``exit_reason``, ``terminal_seen_at``, a trial's
``run_dir``) are for the report page. The per-trial classes are slotted but not
frozen (100,000s are built per ``status --json``, and a frozen one costs five times
as much to build): treat them as read-only all the same."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, TextIO

__all__ = [
    "AttemptStatus",
    "DecisionStats",
    "DiskUse",
    "ExperimentStatus",
    "GpuUse",
    "Head",
    "IdleGpu",
    "LatestNote",
    "Latency",
    "Status",
    "TrialStatus",
    "c_encoder",
    "iso",
    "write_json",
]


def iso(value: datetime | None) -> str | None:
    """``value`` (naive UTC) as ISO 8601 with a ``Z``; None stays None."""
    return value.isoformat() + "Z" if value else None


@dataclass(slots=True)
class GpuUse:
    """An attempt's GPU telemetry: GPUs seen, mean utilization, newest sample."""

    gpus: int
    util_mean: float | None
    last_sample_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "util_mean": self.util_mean,
            "last_sample_at": iso(self.last_sample_at),
        }


@dataclass(slots=True)
class IdleGpu:
    """A GPU of a live attempt idle (below ``below_pct``) since ``idle_since``."""

    trial_id: int
    attempt_key: str
    host: str
    gpu_index: int
    idle_minutes: float
    idle_since: datetime
    below_pct: float

    def to_json(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "attempt_key": self.attempt_key,
            "host": self.host,
            "gpu_index": self.gpu_index,
            "idle_minutes": self.idle_minutes,
            "idle_since": iso(self.idle_since),
            "below_pct": self.below_pct,
        }


@dataclass(frozen=True, slots=True)
class LatestNote:
    """The newest note of an experiment or trial, and how many notes it has."""

    text: str
    user: str
    created_at: datetime
    count: int

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "user": self.user,
            "created_at": iso(self.created_at),
            "count": self.count,
        }


@dataclass(slots=True)
class AttemptStatus:
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
    exit_reason: str | None = None  # the page's, not in the JSON
    terminal_seen_at: datetime | None = None  # the page's, not in the JSON

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "job_id": self.job_id,
            "state": self.state,
            "cause": self.cause,
            "exit_code": self.exit_code,
            "lost_steps": self.lost_steps,
            "node_list": self.node_list,
            "started_at": None if self.started_at is None else self.started_at.isoformat() + "Z",
            "ended_at": None if self.ended_at is None else self.ended_at.isoformat() + "Z",
            "gpu": None if self.gpu is None else self.gpu.to_json(),
            "gpu_hours": self.gpu_hours,
            "cpu_hours": self.cpu_hours,
        }


@dataclass(slots=True)
class TrialStatus:
    id: int
    state: str
    hparams_json: str  # as stored (json.dumps, sorted keys): see ``hparams``
    steps_completed: int
    max_length: int
    target_length: int  # what progress counts toward (see report.status)
    best_metric: float | None
    latest_metric: float | None
    restarts: int
    crashes: int
    slurm_job_ids: tuple[str, ...]
    error: str | None
    gpu: tuple[str, GpuUse] | None  # (attempt key, its GPU use): the newest attempt with samples
    idle_gpus: tuple[IdleGpu, ...]
    gpu_hours: float
    cpu_hours: float
    attempts: tuple[AttemptStatus, ...]
    run_dir: str = ""  # the page's, not in the JSON
    tags: tuple[str, ...] = ()
    note: LatestNote | None = None  # the newest note

    @property
    def hparams(self) -> dict[str, Any]:
        """The trial's hyperparameters (parsed on each access)."""
        value: dict[str, Any] = json.loads(self.hparams_json)
        return value

    def to_json(self) -> dict[str, Any]:
        return self._json(self.hparams)

    def json_text(self) -> str:
        """``json.dumps(self.to_json())``, with the stored hyperparameter text put in as
        it is rather than parsed and written again (the same text: it was written by
        ``json.dumps``)."""
        text = _dumps(self._json(0))
        return text.replace('"hparams": 0', '"hparams": ' + self.hparams_json, 1)

    def _json(self, hparams: Any) -> dict[str, Any]:
        gpu = None if self.gpu is None else {"attempt_key": self.gpu[0], **self.gpu[1].to_json()}
        return {
            "id": self.id,
            "state": self.state,
            "hparams": hparams,
            "steps_completed": self.steps_completed,
            "max_length": self.max_length,
            "target_length": self.target_length,
            "best_metric": self.best_metric,
            "latest_metric": self.latest_metric,
            "restarts": self.restarts,
            "crashes": self.crashes,
            "slurm_job_ids": list(self.slurm_job_ids),
            "error": self.error,
            "gpu": gpu,
            "idle_gpus": [g.to_json() for g in self.idle_gpus],
            "gpu_hours": self.gpu_hours,
            "cpu_hours": self.cpu_hours,
            "attempts": [a.to_json() for a in self.attempts],
            "tags": list(self.tags),
            "note": None if self.note is None else self.note.to_json(),
        }


@dataclass(frozen=True, slots=True)
class Latency:
    """Seconds from the newest result the searcher had seen to the decision acted on."""

    n: int
    median: float
    max: float


@dataclass(frozen=True, slots=True)
class DecisionStats:
    promotions: int
    stops: int
    pending: int  # decided, not acted on yet
    latency_s: Latency | None

    def to_json(self) -> dict[str, Any]:
        lat = self.latency_s
        return {
            "promotions": self.promotions,
            "stops": self.stops,
            "pending": self.pending,
            "latency_s": None
            if lat is None
            else {"n": lat.n, "median": lat.median, "max": lat.max},
        }


@dataclass(frozen=True, slots=True)
class DiskUse:
    """Checkpoint use from the checkpoint rows (no disk scan); ``quota_warning`` is the
    CLI's (``lfs quota``), in the JSON once ``quota_checked``."""

    checkpoints: int
    checkpoint_bytes: int
    deleted_checkpoints: int
    freed_bytes: int
    checkpoint_root: str | None
    quota_warning: str | None = None
    quota_checked: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "checkpoints": self.checkpoints,
            "checkpoint_bytes": self.checkpoint_bytes,
            "deleted_checkpoints": self.deleted_checkpoints,
            "freed_bytes": self.freed_bytes,
            "checkpoint_root": self.checkpoint_root,
        }
        if self.quota_checked:
            out["quota_warning"] = self.quota_warning
        return out


@dataclass(frozen=True, slots=True)
class ExperimentStatus:
    """An experiment, its totals over every trial, and the trials listed (all, or at
    most a listing's ``limit``: see :func:`dlhpc.report.status.pick_trials`)."""

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
    trials: tuple[TrialStatus, ...]
    user: str = ""  # who launched it
    tags: tuple[str, ...] = ()
    note: LatestNote | None = None  # the newest note

    def head_json(self) -> dict[str, Any]:
        """Every key of :meth:`to_json` but ``trials``, in order."""
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "searcher": self.searcher,
            "metric": self.metric,
            "smaller_is_better": self.smaller_is_better,
            "backend": self.backend,
            "created_at": iso(self.created_at),
            "ended_at": None if self.ended_at is None else self.ended_at.isoformat() + "Z",
            "run_dir": self.run_dir,
            "max_length": self.max_length,
            "gpus_per_job": self.gpus_per_job,
            "cpus_per_job": self.cpus_per_job,
            "gpu_hours": self.gpu_hours,
            "cpu_hours": self.cpu_hours,
            "idle_gpus": [g.to_json() for g in self.idle_gpus],
            "trials_total": self.trials_total,
            "trial_counts": self.trial_counts,
            "decisions": None if self.decisions is None else self.decisions.to_json(),
            "disk": None if self.disk is None else self.disk.to_json(),
            "user": self.user,
            "tags": list(self.tags),
            "note": None if self.note is None else self.note.to_json(),
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.head_json(), "trials": [t.to_json() for t in self.trials]}


@dataclass(frozen=True, slots=True)
class Status:
    """``dlhpc status``: the experiments, newest first."""

    experiments: tuple[ExperimentStatus, ...]

    def to_json(self) -> dict[str, Any]:
        return {"experiments": [e.to_json() for e in self.experiments]}


def c_encoder(item_separator: str) -> Any:
    """The C encoder json.dumps builds on each call, with its defaults but
    ``item_separator``, or None where CPython's private accelerator is missing. No cycle
    check: what it encodes is a tree. ``"".join(enc(value, 0))`` is the text."""
    if c_make_encoder is None:
        return None
    return c_make_encoder(
        None, json.JSONEncoder().default, encode_basestring_ascii,
        None, ": ", item_separator, False, False, True,
    )  # fmt: skip


# json.dumps, less its per-call set-up (3 of a trial's 10 us): its encoder built once;
# where it is missing, json.dumps itself.
_ENCODER = c_encoder(", ")


def _dumps(value: Any) -> str:
    """``json.dumps(value)`` (the same text)."""
    if _ENCODER is None:
        return json.dumps(value)
    return "".join(_ENCODER(value, 0))


_BATCH = 256  # trial lines per write
# an experiment's status, or a callable giving it once its trials are consumed (its
# totals summed from them: report.status.iter_status_json)
Head = ExperimentStatus | Callable[[], ExperimentStatus]


def write_json(
    experiments: Iterable[tuple[Head, Iterable[TrialStatus | str]]],
    out: TextIO,
    finish: Callable[[ExperimentStatus], ExperimentStatus] | None = None,
) -> None:
    """Write ``{"experiments": [...]}`` (:meth:`Status.to_json`) to ``out`` piece by
    piece: each experiment's keys (its ``trials`` taken from the pair's second item, not
    from the status), then its trials one line each (a ``str`` is a trial's JSON text
    already, as :meth:`TrialStatus.json_text` writes it). A callable head is called
    after its trials are consumed: their text goes to a temporary file (not memory)
    until the head is written. ``finish`` (e.g. a quota check) is applied to each head
    before it is written."""
    out.write('{"experiments": [')
    for i, (head, trials) in enumerate(experiments):
        sep = "," if i else ""
        if isinstance(head, ExperimentStatus):
            out.write(sep + _head_text(finish(head) if finish else head))
            any_trial = _write_trials(trials, out)
        else:
            with tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogatepass") as tmp:
                any_trial = _write_trials(trials, tmp)
                e = head()
                out.write(sep + _head_text(finish(e) if finish else e))
                tmp.seek(0)
                shutil.copyfileobj(tmp, out, 1 << 20)
        out.write("\n  ]}" if any_trial else "]}")
    out.write("\n]}\n")


def _head_text(e: ExperimentStatus) -> str:
    """An experiment's line up to its trials' ``[``."""
    return "\n  " + _dumps(e.head_json())[:-1] + ', "trials": ['


def _write_trials(trials: Iterable[TrialStatus | str], out: TextIO) -> bool:
    """The trials' lines, each after a comma but the first; whether there was one."""
    lines: list[str] = []  # written _BATCH at a time: one write per trial costs more
    any_trial = False
    for t in trials:
        lines.append(t if isinstance(t, str) else t.json_text())
        if len(lines) == _BATCH:
            out.write(("," if any_trial else "") + "\n    " + ",\n    ".join(lines))
            lines.clear()
            any_trial = True
    if lines:
        out.write(("," if any_trial else "") + "\n    " + ",\n    ".join(lines))
        any_trial = True
    return any_trial
