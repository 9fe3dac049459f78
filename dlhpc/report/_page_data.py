"""The page data of an experiment report: plain, frozen dataclasses, and the pure
functions that derive the summary figures from them.

Nothing here touches the database or a file (:mod:`dlhpc.report._load` builds a
:class:`Page`; :mod:`dlhpc.report._html` renders one). Times are UTC epoch seconds.

Accounting rules (stated on the page too):

* An attempt runs from its start record to its exit record; without an exit
  record, to ``now`` while it is live, else to when the reconciler first saw its
  job gone (the rule of ``dlhpc status``, whose hours the page shows); with none
  of these it is not counted.
* Used device-hours: run hours x ``nodes x gpus_per_node`` GPUs; for a CPU
  experiment (no GPUs) CPU-hours with ``nodes x tasks_per_node x cpus_per_task``.
* Saved by early stopping (measured per trial): for each ``STOPPED_EARLY`` trial,
  ``(max_length - steps_completed) x its own seconds per step x devices``, never a
  median over other trials. Its seconds per step (:func:`step_seconds`): the time
  between its consecutive metric reports within one attempt, summed and divided by
  the steps they span (training and evaluation, no start-up); a trial with no such
  pair (each attempt reported once, e.g. stopped after a one-step rung) is timed
  from each attempt's start to its first report, and failing that by its run time
  over its steps: both count the job's start-up too, so its saving is an upper
  bound (``Usage.startup_trials`` counts those trials).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlhpc.report._curves import Curve
from dlhpc.report.status_types import DecisionStats, DiskUse, IdleGpu
from dlhpc.search import rung_plan
from dlhpc.states import LIVE_ATTEMPT_STATES, TrialState

__all__ = [
    "AttemptView",
    "EventView",
    "HParamView",
    "ModelView",
    "NoteView",
    "Page",
    "TrialView",
    "Usage",
    "attempt_spans",
    "compute_usage",
    "hparam_views",
    "pick_best",
    "rungs_of",
    "step_seconds",
]

_NUMERIC_KINDS = ("int", "double", "log")


@dataclass(frozen=True)
class AttemptView:
    """One attempt (job run) of a trial. ``end`` is the accounted end (see module doc)."""

    key: str
    job_id: str
    state: str
    cause: str  # completed, paused, stopped, crash, preempted, timeout, requeued, lost, ...
    exit_code: int | None = None
    exit_reason: str = ""
    lost_steps: int | None = None
    node_list: str = ""
    terminal_seen: float | None = None  # first tick that saw the job gone without an exit
    start: float | None = None
    end: float | None = None
    end_recorded: bool = False  # end came from the job's exit record
    gpu_util: float | None = None  # mean utilization over the attempt, percent
    gpus_seen: int = 0


@dataclass(frozen=True)
class TrialView:
    id: int
    state: str
    hparams: Mapping[str, Any]
    steps: int
    best: float | None
    latest: float | None
    restarts: int = 0
    crashes: int = 0
    error: str = ""
    attempts: tuple[AttemptView, ...] = ()
    curve: Curve | None = None  # the searcher metric's learning curve
    run_s: float = 0.0  # seconds its attempts ran (accounted)
    tags: tuple[str, ...] = ()
    note: str = ""  # its newest note


@dataclass(frozen=True)
class NoteView:
    """A note on the experiment (``trial_id`` None) or on one of its trials."""

    trial_id: int | None
    text: str
    user: str
    time: float


@dataclass(frozen=True)
class ModelView:
    """A registered model version made from one of the experiment's trials."""

    name: str
    version: int
    trial_id: int
    checkpoint_id: int
    step: int
    metric: float | None
    note: str
    user: str
    created: float


@dataclass(frozen=True)
class HParamView:
    """A hyperparameter as the scatter plots see it: ``kind`` is the config's type
    (``log``, ``int``, ``double``, ``categorical``, ``const``), or ``categorical``
    when some value is not a number."""

    name: str
    kind: str


@dataclass(frozen=True)
class Usage:
    unit: str  # "GPU" or "CPU"
    per_attempt: int  # devices one attempt holds
    used_h: float
    saved_h: float
    stopped_trials: int  # STOPPED_EARLY trials the saving is summed over
    uncounted_attempts: int  # attempts with no end time to count
    startup_trials: int = 0  # of the stopped trials, those timed with their start-up


@dataclass(frozen=True)
class EventView:
    time: float
    trial_id: int | None
    kind: str
    message: str


@dataclass(frozen=True)
class Page:
    """Everything an experiment's report shows."""

    id: int
    name: str
    description: str
    state: str
    searcher: str
    metric: str
    smaller_is_better: bool
    created: float
    ended: float | None
    generated: float
    trials: tuple[TrialView, ...]
    best: TrialView | None
    hparams: tuple[HParamView, ...]
    rungs: tuple[int, ...]
    max_length: int
    usage: Usage
    events: tuple[EventView, ...] = ()
    events_hidden: int = 0  # notable events left out (the newest are shown)
    decisions: DecisionStats | None = None
    disk: DiskUse | None = None  # checkpoint disk usage
    idle_gpus: tuple[IdleGpu, ...] = ()
    repro: Mapping[str, str] = field(default_factory=dict)  # label -> value
    repro_texts: Mapping[str, str] = field(default_factory=dict)  # title -> long text
    yaml_text: str = ""
    config_text: str = ""  # resolved config, pretty JSON
    curve_sources: Mapping[str, int] = field(default_factory=dict)  # hdf5/db/none -> trials
    other_metrics: tuple[str, ...] = ()
    user: str = ""  # who launched it
    tags: tuple[str, ...] = ()
    notes: tuple[NoteView, ...] = ()  # oldest first, the trials' too
    models: tuple[ModelView, ...] = ()  # model versions registered from its trials
    lab_stamp: str = ""  # digest of the above (report._status_lab.lab_stamps), in the page

    @property
    def elapsed_s(self) -> float:
        return max(0.0, (self.ended if self.ended is not None else self.generated) - self.created)


def attempt_spans(attempts: Sequence[AttemptView], now: float) -> list[tuple[float, float] | None]:
    """The accounted ``(start, end)`` of each attempt (None: not counted)."""
    out: list[tuple[float, float] | None] = []
    for a in attempts:
        end = a.end
        if end is None:
            end = now if a.state in LIVE_ATTEMPT_STATES else a.terminal_seen
        if a.start is None or end is None:
            out.append(None)
        else:
            out.append((a.start, max(a.start, end)))
    return out


def compute_usage(
    trials: Sequence[TrialView],
    resources: Mapping[str, Any],
    max_length: int,
    status_hours: tuple[float, float] | None = None,
) -> Usage:
    """Device-hours used and saved (see the module doc); pure. ``status_hours``: the
    experiment status's ``(gpu_hours, cpu_hours)``, the used figure when given (the
    page then agrees with ``dlhpc status``)."""
    nodes = int(resources.get("nodes", 1) or 1)
    gpus = int(resources.get("gpus_per_node", 0) or 0)
    tasks = int(resources.get("tasks_per_node") or max(1, gpus))
    if gpus > 0:
        unit, per = "GPU", nodes * gpus
    else:
        unit, per = "CPU", nodes * tasks * int(resources.get("cpus_per_task", 1) or 1)
    saved = 0.0
    used = sum(t.run_s for t in trials) * per / 3600.0
    if status_hours is not None:
        used = status_hours[0] if unit == "GPU" else status_hours[1]
    stopped = uncounted = with_startup = 0
    for t in trials:
        uncounted += sum(1 for a in t.attempts if a.start is not None and a.end is None)
        if t.state == TrialState.STOPPED_EARLY.value and t.steps > 0:
            stopped += 1
            measured = step_seconds(t)
            if measured is None:
                continue
            sec, startup = measured
            with_startup += startup
            saved += max(0, max_length - t.steps) * sec * per / 3600.0
    return Usage(unit, per, used, saved, stopped, uncounted, with_startup)


def _owner(starts: Sequence[float], at: float) -> int | None:
    """The index of the last of ``starts`` (ascending) at or before ``at`` (None: none)."""
    i = bisect.bisect_right(starts, at) - 1
    return i if i >= 0 else None


def step_seconds(t: TrialView) -> tuple[float, bool] | None:
    """Trial ``t``'s own measured seconds per step and whether they include start-up
    (see the module doc); None when nothing of it was timed. Each point of its curve
    belongs to the last attempt that started at or before it."""
    starts = sorted(a.start for a in t.attempts if a.start is not None)
    train_s = first_s = 0.0
    train_steps = first_steps = 0
    prev: tuple[int, float, int | None] | None = None  # step, time, attempt
    points = zip(t.curve.steps, t.curve.times, strict=True) if t.curve is not None else ()
    for step, at in points:
        if not math.isfinite(at) or (prev is not None and step <= prev[0]):
            continue
        own = _owner(starts, at)
        if prev is not None and own == prev[2]:
            train_s, train_steps = train_s + at - prev[1], train_steps + step - prev[0]
        elif own is not None:
            first_s += at - starts[own]
            first_steps += step - (prev[0] if prev is not None else 0)
        prev = (step, at, own)
    if train_steps > 0:
        return max(0.0, train_s) / train_steps, False
    if first_steps > 0:
        return max(0.0, first_s) / first_steps, True
    if t.run_s > 0 and t.steps > 0:
        return t.run_s / t.steps, True
    return None


def pick_best(trials: Sequence[TrialView], smaller_is_better: bool) -> TrialView | None:
    """The trial with the best ``best`` metric (NaN and None never win; ties: lower id)."""
    scored = [t for t in trials if t.best is not None and not math.isnan(t.best)]
    if not scored:
        return None
    sign = 1.0 if smaller_is_better else -1.0
    return min(scored, key=lambda t: (sign * (t.best or 0.0), t.id))


def rungs_of(searcher: Mapping[str, Any]) -> tuple[int, ...]:
    """The rung lengths of a search with rungs (e.g. sha, asha, hyperband), else ()."""
    return rung_plan(searcher)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def hparam_views(space: Mapping[str, Any], trials: Sequence[TrialView]) -> tuple[HParamView, ...]:
    """One view per hyperparameter name seen in the config or the trials, sorted."""
    names = sorted({*space, *(k for t in trials for k in t.hparams)})
    out = []
    for name in names:
        spec = space.get(name)
        kind = str(spec.get("type", "")) if isinstance(spec, Mapping) else ""
        values = [t.hparams[name] for t in trials if name in t.hparams]
        numeric = all(_is_number(v) for v in values)
        if kind in _NUMERIC_KINDS and not numeric:
            kind = "categorical"
        elif kind == "log" and any(v <= 0 for v in values):
            kind = "double"
        elif kind not in (*_NUMERIC_KINDS, "categorical", "const"):
            kind = "double" if numeric and values else "categorical"
        out.append(HParamView(name, kind))
    return tuple(out)
