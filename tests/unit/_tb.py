"""Helpers for the TensorBoard tests: rows in a real store, and the event files read
back with TensorBoard's own reader (``event_accumulator``, every tensor kept).

TensorBoard's scalars are float32 (its data server shows no other type), so a value
read back is compared with the database's double rounded to float32 by numpy (round
to nearest, out of range to infinity), independently of the protobuf conversion the
export relies on; steps and wall times are compared exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from dlhpc._perms import current_user
from dlhpc.store import Attempt, Metric, Store, utcnow
from tests.unit._db import add_experiment, add_trial

# the test modules that import this skip without the tensorboard extra
ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
tensor_util = pytest.importorskip("tensorboard.util.tensor_util")

Point = tuple[int, float | None, float]  # step, value (None: NaN), wall time


def make_experiment(
    store: Store,
    hparams: list[dict[str, Any]],
    folder: str = "exp-000001-tb",
    user: str | None = None,
) -> tuple[int, list[int]]:
    """An experiment (run folder ``folder`` made) with one trial per ``hparams``, each
    with one attempt; its id and its trials' ids."""
    run_dir = store.runs_root / folder
    run_dir.mkdir(parents=True)
    with store.write() as s:
        exp = add_experiment(
            s,
            run_dir,
            name="tb <b>",
            metric="val_loss",
            user=current_user() if user is None else user,
        )
        ids = []
        for i, hp in enumerate(hparams):
            t = add_trial(s, exp, request_id=i, hparams_json=json.dumps(hp))
            s.add(Attempt(trial_id=t.id, attempt_key=f"1_{i}.r0", job_id=f"1_{i}",
                          state="RUNNING", created_at=utcnow()))  # fmt: skip
            ids.append(t.id)
        return exp.id, ids


def add_points(store: Store, trial_id: int, name: str, points: list[Point]) -> None:
    with store.write() as s:
        attempt = s.scalars(select(Attempt.id).where(Attempt.trial_id == trial_id)).one()
        for step, value, time in points:
            s.add(Metric(trial_id=trial_id, attempt_id=attempt, step=step, name=name,
                         value=value, time=time))  # fmt: skip


def float32(value: float | None) -> float | None:
    """``value`` as TensorBoard stores a scalar (None, the NaN, stays None)."""
    if value is None:
        return None
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def db_points(store: Store, trial_id: int, exact: bool = False) -> dict[str, list[Point]]:
    """The trial's points by metric name in step order; values as float32 unless ``exact``."""
    with store.read() as s:
        rows = s.execute(
            select(Metric.name, Metric.step, Metric.value, Metric.time)
            .where(Metric.trial_id == trial_id)
            .order_by(Metric.name, Metric.step)
        ).all()
    out: dict[str, list[Point]] = {}
    for name, step, value, time in rows:
        out.setdefault(name, []).append((step, value if exact else float32(value), time))
    return out


def accumulator(folder: Path) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    return acc


def read_points(folder: Path) -> dict[str, list[Point]]:
    """Every scalar point in a trial's folder, by tag, in step order (duplicates kept)."""
    acc = accumulator(folder)
    out: dict[str, list[Point]] = {}
    for tag in acc.Tags()["tensors"]:
        if tag.startswith("_hparams_/"):
            continue
        for e in acc.Tensors(tag):
            value = float(tensor_util.make_ndarray(e.tensor_proto).item())
            out.setdefault(tag, []).append(
                (e.step, None if math.isnan(value) else value, e.wall_time)
            )
    return {tag: sorted(points, key=lambda p: p[0]) for tag, points in out.items()}


def trial_folder(store: Store, trial_id: int, folder: str = "exp-000001-tb") -> Path:
    return store.runs_root / folder / "tensorboard" / f"trial-{trial_id:06d}"


def assert_same_as_db(store: Store, trial_ids: list[int], folder: str = "exp-000001-tb") -> None:
    for trial_id in trial_ids:
        assert read_points(trial_folder(store, trial_id, folder)) == db_points(store, trial_id), (
            trial_id
        )


LOSS: list[Point] = [
    (1, 0.5, 1_700_000_000.125),
    (2, None, 1_700_000_001.5),
    (3, 1 / 3, 1_700_000_002.0),
]
