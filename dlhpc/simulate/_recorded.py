"""Recorded learning curves: a finished experiment's trials as a curve source.

Read by :func:`load_recorded` from the DB (see :mod:`dlhpc.simulate._curves` for
the rules: nearest recorded trial, epoch durations from the metric records'
times, the measured start-up taken off each attempt's first epoch). It also
measures ``teardown_s``: the median over attempts that exited 0 of their exit
time minus their last report (the last checkpoint and the process's exit).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select

from dlhpc.config.schema import HParam
from dlhpc.errors import UsageError
from dlhpc.simulate._curves import Curve, unit_value
from dlhpc.store import Attempt, Experiment, Metric, Store, Trial

__all__ = ["RecordedCurves", "RecordedTrial", "load_recorded"]


@dataclass(frozen=True)
class RecordedTrial:
    """One finished trial's curve: the metric at steps 1..n and each epoch's seconds."""

    hparams: dict[str, Any]
    values: tuple[float, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class _Recorded:
    trial: RecordedTrial

    def value(self, epoch: int) -> float:
        return self.trial.values[min(max(epoch, 1), len(self.trial.values)) - 1]

    def seconds(self, epoch: int) -> float:
        return self.trial.seconds[min(max(epoch, 1), len(self.trial.seconds)) - 1]


@dataclass
class RecordedCurves:
    """Nearest recorded trial in normalised hyperparameter space (module docstring)."""

    space: Mapping[str, HParam]
    trials: list[RecordedTrial]
    label: str = "recorded"
    startup_s: float = 0.0  # measured start-up, taken off each attempt's first epoch
    teardown_s: float = 0.0  # measured: an attempt's exit after its last report
    _cache: dict[str, RecordedTrial] = field(default_factory=dict)

    def _distance(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
        d = 0.0
        for name, hp in self.space.items():
            if hp.type == "const" or name not in b:
                continue
            if hp.type == "categorical":
                d += 0.0 if a.get(name) == b[name] else 1.0
                continue
            ua, ub = unit_value(hp, a.get(name)), unit_value(hp, b[name])
            d += 1.0 if ua is None or ub is None else (ua - ub) ** 2
        return d

    def nearest(self, hparams: Mapping[str, Any]) -> RecordedTrial:
        key = json.dumps(dict(hparams), sort_keys=True, default=str)
        if key not in self._cache:
            self._cache[key] = min(self.trials, key=lambda t: self._distance(hparams, t.hparams))
        return self._cache[key]

    def curve(self, hparams: Mapping[str, Any], seed: int) -> Curve:
        return _Recorded(self.nearest(hparams))

    def true_final(self, hparams: Mapping[str, Any], length: int) -> float:
        return _Recorded(self.nearest(hparams)).value(length)

    def max_epoch_seconds(self) -> float:
        return max(max(t.seconds) for t in self.trials)


def _durations(
    rows: list[tuple[int, float, int]], starts: dict[int, float | None]
) -> list[tuple[float, bool]]:
    """(seconds, from the attempt's start) of each (step, time, attempt id) row in step
    order: since the previous row of the same attempt, else since the attempt's start
    (start-up included; NaN when the start is unknown)."""
    out: list[tuple[float, bool]] = []
    prev: tuple[float, int] | None = None
    for _step, at, attempt in rows:
        if prev is not None and prev[1] == attempt:
            out.append((max(at - prev[0], 1e-3), False))
        else:
            start = starts.get(attempt)
            out.append((max(at - start, 1e-3) if start is not None else math.nan, True))
        prev = (at, attempt)
    return out


def _without_startup(per_trial: list[list[tuple[float, bool]]]) -> tuple[list[list[float]], float]:
    """Each trial's step seconds with the measured start-up taken off its attempts'
    first steps, and that start-up (0 when no attempt has two records to tell it)."""
    own = [[d for d, first in ds if not first and math.isfinite(d)] for ds in per_trial]
    every = [d for ds in own for d in ds]
    if not every:
        return [[d for d, _first in ds] for ds in per_trial], 0.0
    shared = statistics.median(every)
    delays = [
        d - (statistics.median(mine) if mine else shared)
        for ds, mine in zip(per_trial, own, strict=True)
        for d, first in ds
        if first and math.isfinite(d)
    ]
    startup = max(0.0, statistics.median(delays)) if delays else 0.0
    out = [[max(d - startup, 1e-3) if first else d for d, first in ds] for ds in per_trial]
    return out, startup


@dataclass(frozen=True)
class _Read:
    """What :func:`load_recorded` reads of an experiment."""

    trials: Sequence[Trial]
    rows: Sequence[Any]  # (trial id, step, value, time, attempt id) of the metric, in order
    starts: dict[int, float | None]  # attempt id -> its start (None: unknown)
    ends: dict[int, float]  # attempt id -> its end, of the attempts that exited 0


def _read(store: Store, experiment_id: int, metric: str) -> _Read:
    """Read the experiment's trials, its ``metric`` records (by trial and step) and its
    attempts' start and end times in one read transaction; UsageError when there is no
    such experiment."""
    with store.read() as s:
        exp = s.get(Experiment, experiment_id)
        if exp is None:
            raise UsageError(f"--curves experiment:{experiment_id}: no such experiment")
        trials = s.scalars(select(Trial).where(Trial.experiment_id == experiment_id)).all()
        rows = s.execute(
            select(Metric.trial_id, Metric.step, Metric.value, Metric.time, Metric.attempt_id)
            .join(Trial, Trial.id == Metric.trial_id)
            .where(Trial.experiment_id == experiment_id, Metric.name == metric)
            .order_by(Metric.trial_id, Metric.step)
        ).all()
        attempts = s.scalars(
            select(Attempt).join(Trial).where(Trial.experiment_id == experiment_id)
        ).all()
        starts = {a.id: _epoch(a.started_at) if a.started_at else None for a in attempts}
        ends = {  # attempts that trained their grant and exited 0
            a.id: _epoch(a.ended_at) for a in attempts if a.ended_at and a.exit_code == 0
        }
    return _Read(trials, rows, starts, ends)


def _steps(
    points: list[tuple[int, float | None, float, int]], durations: list[float]
) -> tuple[list[float], list[float]]:
    """A trial's metric value and seconds at steps 1..n from its (step, value, time,
    attempt) points and their durations: a step-0 point is left out, a skipped step
    takes the next point's seconds and the previous value (NaN before any), and a
    missing value keeps the previous one."""
    values: list[float] = []
    seconds: list[float] = []
    last = math.nan
    for (step, value, _at, _att), dur in zip(points, durations, strict=True):
        if step < 1:
            continue  # a step-0 report (before training) is not an epoch
        while len(values) < step - 1:  # skipped steps keep the previous value
            values.append(last)
            seconds.append(dur)
        last = value if value is not None else last
        values.append(last)
        seconds.append(dur)
    return values, seconds


def _teardown(rows: Sequence[Any], ends: dict[int, float]) -> float:
    """The median, over the attempts in ``ends`` that reported, of their end minus their
    last report; 0 when there is none, and never below 0."""
    last_report: dict[int, float] = {}
    for _trial, _step, _value, at, attempt in rows:
        last_report[attempt] = max(at, last_report.get(attempt, at))
    exits = [end - last_report[a] for a, end in ends.items() if a in last_report]
    return max(0.0, statistics.median(exits)) if exits else 0.0


def load_recorded(
    store: Store, experiment_id: int, metric: str, space: Mapping[str, HParam]
) -> RecordedCurves:
    """The curves of experiment ``experiment_id``'s trials that reported ``metric``
    (every trial that did, stopped ones too: an early-stopping search completes few, and
    a replay needs each trial's own curve). UsageError when there is nothing to use."""
    got = _read(store, experiment_id, metric)
    by_trial: dict[int, list[tuple[int, float | None, float, int]]] = {}
    for trial_id, step, value, at, attempt in got.rows:
        by_trial.setdefault(trial_id, []).append((step, value, at, attempt))
    use = [t for t in got.trials if t.id in by_trial]
    if not use:
        raise UsageError(
            f"--curves experiment:{experiment_id}: no trial reported {metric!r}"
            f" (the metric of the experiment being simulated)"
        )
    timed = [
        _durations([(st, at, att) for st, _v, at, att in by_trial[t.id]], got.starts) for t in use
    ]
    per_trial, startup = _without_startup(timed)
    recorded = [
        (t, *_steps(by_trial[t.id], durations)) for t, durations in zip(use, per_trial, strict=True)
    ]
    known = [d for _t, _v, secs in recorded for d in secs if math.isfinite(d)]
    fallback = statistics.median(known) if known else 60.0
    out = [
        RecordedTrial(
            json.loads(t.hparams_json),
            tuple(vals),
            tuple(d if math.isfinite(d) else fallback for d in secs),
        )
        for t, vals, secs in recorded
        if vals
    ]
    teardown = _teardown(got.rows, got.ends)
    label = (
        f"experiment {experiment_id} ({len(out)} trials, start-up {startup:.3g} s,"
        f" teardown {teardown:.3g} s)"
    )
    return RecordedCurves(space, out, label=label, startup_s=startup, teardown_s=teardown)


def _epoch(naive_utc: datetime) -> float:
    """Seconds since the epoch of a DB time (naive, in UTC), whatever the local zone."""
    return naive_utc.replace(tzinfo=timezone.utc).timestamp()
