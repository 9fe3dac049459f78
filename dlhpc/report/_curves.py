"""The learning-curve archive: one compressed HDF5 file per trial, ``curves.h5``.

A cache of the metric rows, kept by the reports (``report._load``): a page build
reads each trial's archive, and rewrites, within a budget, those it finds stale
from the rows it then reads anyway. The tick never writes one (its pass is the
latency of every decision; an archive only serves pages). The DB keeps the
per-trial summaries (``steps_completed``, best and latest metric) and, today, the
metric rows too; the archive is what a report reads.

Layout of ``<trial run folder>/curves.h5``::

    /                      attrs: format=1, trial_id, rows, max_step, and ``index``:
                           JSON {"rows", "max_step", "metrics": [names, in group order]}
    /m0000, /m0001, ...    one dataset per metric, in name order; attr ``name``;
                           float64, shape (3, points), rows:
        0 steps            sorted, unique (integers, exact in float64 below 2**53)
        1 values           NaN where the run reported a non-finite value
        2 times            epoch seconds the job wrote the point

Metric names are user strings, so they live in an attribute, never in an HDF5
path. Datasets are gzip-compressed (with the shuffle filter); one (3, n) dataset
rather than three per metric keeps down what a reader pays per file (HDF5 object
opens dominate it). The file is built
in memory and published with :func:`dlhpc.protocol.atomic_write_bytes` (temp
name, fsync, rename): a reader sees the previous archive or the new one, never
half of one. ``rows`` and ``max_step`` let a reader tell a stale archive (newer
rows in the DB, or two page builds racing) from a current one. A
reader opens the file, reads ``index`` and only the groups it asks for. h5py
and numpy are imported on first use.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from dlhpc.protocol import atomic_write_bytes
from dlhpc.store import Metric, Store

__all__ = [
    "CURVES_FILE",
    "Curve",
    "CurveArchive",
    "archive_trials",
    "curves_path",
    "db_curves",
    "encode_curves",
    "read_curves",
    "write_curves",
]

CURVES_FILE = "curves.h5"
_FORMAT = 1


@dataclass(frozen=True)
class Curve:
    """One metric of one trial: parallel tuples, steps ascending; NaN = no value."""

    steps: tuple[int, ...]
    values: tuple[float, ...]
    times: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class CurveArchive:
    """What one ``curves.h5`` holds: the curves by metric name, and its stamp."""

    curves: dict[str, Curve]  # the metrics asked for (all by default)
    rows: int  # metric rows archived (points over all metrics)
    max_step: int
    names: tuple[str, ...] = ()  # every metric the file holds


def curves_path(trial_run_dir: str | Path) -> Path:
    return Path(trial_run_dir) / CURVES_FILE


def encode_curves(trial_id: int, curves: Mapping[str, Curve]) -> bytes:
    """The bytes of a ``curves.h5`` holding ``curves`` (pure; no file is touched)."""
    import h5py  # imported here: a tick that archives nothing does not pay for it
    import numpy as np

    buf = io.BytesIO()
    rows = sum(len(c) for c in curves.values())
    max_step = max((c.steps[-1] for c in curves.values() if c.steps), default=0)
    names = sorted(curves)
    index = json.dumps({"rows": rows, "max_step": max_step, "metrics": names})
    with h5py.File(buf, "w", libver="latest") as f:  # compact headers, smaller files
        f.attrs.update({"format": _FORMAT, "trial_id": trial_id, "rows": rows})
        f.attrs.update({"max_step": max_step, "index": index})
        for i, name in enumerate(names):
            c = curves[name]
            data = np.asarray([c.steps, c.values, c.times], dtype=np.float64).reshape(3, -1)
            ds = f.create_dataset(
                f"m{i:04d}", data=data, compression="gzip", compression_opts=4, shuffle=True
            )
            ds.attrs["name"] = name
    return buf.getvalue()


def write_curves(path: Path, trial_id: int, curves: Mapping[str, Curve]) -> None:
    """Publish ``curves`` at ``path`` atomically (reconciler only)."""
    atomic_write_bytes(path, encode_curves(trial_id, curves))


def read_curves(path: Path, only: Collection[str] | None = None) -> CurveArchive | None:
    """The archive at ``path`` with the curves of the metrics in ``only`` (every
    metric when None); None when there is no archive or it cannot be read."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            index = json.loads(f.attrs["index"])
            names = [str(n) for n in index["metrics"]]
            curves = {}
            for i, name in enumerate(names):
                if only is not None and name not in only:
                    continue
                steps, values, times = f[f"m{i:04d}"][()].tolist()
                curves[name] = Curve(tuple(int(x) for x in steps), tuple(values), tuple(times))
            return CurveArchive(curves, int(index["rows"]), int(index["max_step"]), tuple(names))
    except (OSError, KeyError, ValueError, TypeError):
        return None


def _curves_from_rows(rows: Iterable[tuple[str, int, float | None, float]]) -> dict[str, Curve]:
    """Rows ``(name, step, value, time)`` sorted by (name, step) -> curves by name."""
    cols: dict[str, tuple[list[int], list[float], list[float]]] = {}
    for name, step, value, at in rows:
        s, v, t = cols.setdefault(name, ([], [], []))
        s.append(int(step))
        v.append(math.nan if value is None else float(value))
        t.append(float(at))
    return {n: Curve(tuple(s), tuple(v), tuple(t)) for n, (s, v, t) in cols.items()}


def db_curves(
    session_rows: Iterable[tuple[int, str, int, float | None, float]],
) -> dict[int, dict[str, Curve]]:
    """Rows ``(trial_id, name, step, value, time)`` sorted by trial, name, step ->
    curves by trial id and metric name."""
    by_trial: dict[int, list[tuple[str, int, float | None, float]]] = {}
    for trial_id, name, step, value, at in session_rows:
        by_trial.setdefault(trial_id, []).append((name, step, value, at))
    return {tid: _curves_from_rows(rows) for tid, rows in by_trial.items()}


def archive_trials(
    store: Store, run_dirs: Mapping[int, str]
) -> tuple[dict[int, dict[str, Curve]], list[str]]:
    """Rewrite the archive of each trial in ``run_dirs`` (trial id -> run folder)
    from its metric rows: one query for all of them, one file per trial.

    Returns the curves read (by trial id and metric name; a trial without rows is
    absent) and one line per trial whose archive could not be written (e.g. a lab
    member's report for someone else's experiment: the folder is not theirs). The
    curves are right either way; the next page build tries again.
    """
    wanted = {tid: d for tid, d in run_dirs.items() if d}
    if not wanted:
        return {}, []
    with store.read() as s:
        rows = s.execute(
            select(Metric.trial_id, Metric.name, Metric.step, Metric.value, Metric.time)
            .where(Metric.trial_id.in_(list(wanted)))
            .order_by(Metric.trial_id, Metric.name, Metric.step)
        ).all()
    by_trial = db_curves((r[0], r[1], r[2], r[3], r[4]) for r in rows)
    errors = []
    for tid, run_dir in wanted.items():
        try:
            write_curves(curves_path(run_dir), tid, by_trial.get(tid, {}))
        except (OSError, ValueError) as err:
            errors.append(f"trial {tid}: archiving curves: {err}")
    return by_trial, errors
