"""Build a :class:`~dlhpc.report._page_data.Page` from the state database and the
HDF5 curve archive (a report never writes the DB; it keeps the archives).

Per page: :func:`~dlhpc.report.status.status_data`'s typed experiment status
(trials with their run folders, attempts with their exit reasons, GPU summaries, idle
GPUs, decision stats), plus the page's own small queries (per-trial metric row counts
and names, notable events, the attempts' environments), and
one ``curves.h5`` read per trial. A trial's curve comes from its archive when the
archive is current (its row count and last step match the DB's, or the DB holds
no rows for it any more), else from the DB rows (one query for all such trials).

Stale archives are rewritten from those rows (:func:`_to_refresh`): every ended
trial's, up to :data:`REFRESH_ENDED` a page (an ended trial's archive never goes
stale again), and a running trial's at most every :data:`REFRESH_EVERY`, up to
:data:`REFRESH_RUNNING` a page (it would go stale again at its next metric). A
rewrite that fails (another user's folder) leaves the page as it is.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dlhpc.report._curves import Curve, archive_trials, curves_path, db_curves, read_curves
from dlhpc.report._page_data import (
    AttemptView,
    EventView,
    ModelView,
    NoteView,
    Page,
    TrialView,
    attempt_spans,
    compute_usage,
    hparam_views,
    pick_best,
    rungs_of,
)
from dlhpc.report._record import parse_record, repro_record
from dlhpc.report._redact import redact_text, redact_value
from dlhpc.report._status_lab import lab_stamps
from dlhpc.report.status import status_data
from dlhpc.report.status_types import AttemptStatus, ExperimentStatus, TrialStatus
from dlhpc.states import TERMINAL_TRIAL_STATES
from dlhpc.store import Attempt, Event, Experiment, Metric, ModelVersion, Note, Store, Trial

__all__ = ["MAX_EVENTS", "REFRESH_ENDED", "REFRESH_EVERY", "REFRESH_RUNNING", "load_page"]

MAX_EVENTS = 300  # notable events shown, newest kept
# left out: job log lines below warning, and the routine "trial is running" transitions
_QUIET_EVENTS = ("log.info", "log.debug", "trial.running")
REFRESH_ENDED = 256  # stale archives of ended trials rewritten per page
REFRESH_RUNNING = 16  # ... of running trials (each costs two fsyncs)
REFRESH_EVERY = 600.0  # seconds: a running trial's archive is not rewritten sooner


def _epoch(value: datetime | None) -> float | None:
    """A naive UTC time (the DB's) as epoch seconds."""
    return None if value is None else value.replace(tzinfo=timezone.utc).timestamp()


def _archived(
    run_dirs: Mapping[int, str], counts: Mapping[int, tuple[int, int]], metric: str
) -> tuple[dict[int, Curve], list[int], dict[str, int], set[str]]:
    """Read the archives (no DB session open): curves, the stale trials, the
    sources, and the metric names the archives hold."""
    out: dict[int, Curve] = {}
    sources = {"hdf5": 0, "db": 0, "none": 0}
    stale = []
    names: set[str] = set()
    for tid, run_dir in run_dirs.items():
        archive = read_curves(curves_path(run_dir), only=(metric,)) if run_dir else None
        n, top = counts.get(tid, (0, 0))
        if archive is not None and (n == 0 or (archive.rows, archive.max_step) == (n, top)):
            names.update(archive.names)
            if metric in archive.curves:
                out[tid] = archive.curves[metric]
            sources["hdf5"] += 1
        elif n:
            stale.append(tid)
        else:
            sources["none"] += 1
    sources["db"] = len(stale)
    return out, stale, sources, names


def _to_refresh(stale: list[int], run_dirs: Mapping[int, str], ended: set[int]) -> list[int]:
    """The stale archives this page rewrites (see the module docstring); running
    trials' oldest first, so that a long search's trials take turns. A trial with no
    run folder has no archive."""
    stale = [tid for tid in stale if run_dirs.get(tid)]
    done = [tid for tid in stale if tid in ended][:REFRESH_ENDED]
    age: dict[int, float] = {}
    for tid in stale:
        if tid in ended:
            continue
        try:
            age[tid] = time.time() - os.stat(curves_path(run_dirs[tid])).st_mtime
        except OSError:
            age[tid] = float("inf")  # none yet
    due = sorted((t for t, a in age.items() if a >= REFRESH_EVERY), key=lambda t: -age[t])
    return done + due[:REFRESH_RUNNING]


def _db_curves(session: Session, trial_ids: list[int], metric: str) -> dict[int, Curve]:
    rows = session.execute(
        select(Metric.trial_id, Metric.name, Metric.step, Metric.value, Metric.time)
        .where(Metric.trial_id.in_(trial_ids), Metric.name == metric)
        .order_by(Metric.trial_id, Metric.name, Metric.step)
    ).all()
    by_trial = db_curves((r[0], r[1], r[2], r[3], r[4]) for r in rows)
    return {tid: c[metric] for tid, c in by_trial.items()}


def _events(session: Session, exp_id: int) -> tuple[list[EventView], int]:
    notable = (Event.experiment_id == exp_id) & Event.kind.not_in(_QUIET_EVENTS)
    total = int(session.scalar(select(func.count()).select_from(Event).where(notable)) or 0)
    rows = session.execute(
        select(Event.time, Event.trial_id, Event.kind, Event.message)
        .where(notable)
        .order_by(Event.time.desc(), Event.id.desc())
        .limit(MAX_EVENTS)
    ).all()
    views = [
        EventView(_epoch(t) or 0.0, tid, kind, redact_text(msg or ""))
        for t, tid, kind, msg in reversed(rows)
    ]
    return views, max(0, total - len(views))


def _metric_names(session: Session, trial_ids: list[int]) -> set[str]:
    return set(
        session.scalars(
            select(Metric.name).where(Metric.trial_id.in_(trial_ids)).distinct().limit(50)
        ).all()
    )


@dataclass(frozen=True)
class _Read:
    """What one page reads from the DB (in one short session)."""

    status: ExperimentStatus
    exp: Experiment
    counts: dict[int, tuple[int, int]]  # trial id -> (metric rows, newest step)
    names: set[str]  # metric names in the DB
    events: list[EventView]
    hidden: int  # notable events left out
    envs: list[str]  # the attempts' env_json
    notes: list[NoteView]  # oldest first
    models: list[ModelView]  # by name, then version
    lab_stamp: str  # their digest


def _lab(session: Session, exp_id: int) -> tuple[list[NoteView], list[ModelView]]:
    """Every note of the experiment and its trials, and the model versions made from
    its trials (their user text redacted like the rest of the page)."""
    notes = [
        NoteView(
            None if n.kind == "experiment" else n.target_id,
            redact_text(n.text),
            n.user,
            _epoch(n.created_at) or 0.0,
        )
        for n in session.scalars(select(Note).where(Note.experiment_id == exp_id).order_by(Note.id))
    ]
    models = [
        ModelView(
            m.name,
            m.version,
            m.trial_id,
            m.checkpoint_id,
            m.step,
            m.metric,
            redact_text(m.note),
            m.user,
            _epoch(m.created_at) or 0.0,
        )  # fmt: skip
        for m in session.scalars(
            select(ModelVersion)
            .where(ModelVersion.experiment_id == exp_id)
            .order_by(ModelVersion.name, ModelVersion.version)
        )
    ]
    return notes, models


def _read(store: Store, experiment_id: int) -> _Read:
    """The experiment's status (every trial) and the page's own few queries."""
    with store.read() as s:
        status = status_data(s, experiment_id).experiments[0]
        exp = s.get(Experiment, experiment_id)  # loaded by status_data: no query
        assert exp is not None  # status_data raised otherwise
        ids = [t.id for t in status.trials]
        counts = {
            tid: (n, top)
            for tid, n, top in s.execute(
                select(Metric.trial_id, func.count(), func.max(Metric.step))
                .where(Metric.trial_id.in_(ids))
                .group_by(Metric.trial_id)
            )
        }
        names = _metric_names(s, ids)
        events, hidden = _events(s, experiment_id)
        envs = list(
            s.scalars(
                select(Attempt.env_json).join(Trial).where(Trial.experiment_id == experiment_id)
            )
        )
        notes, models = _lab(s, experiment_id)
        stamp = lab_stamps(s.connection(), [experiment_id]).get(experiment_id, "")
    return _Read(status, exp, counts, names, events, hidden, envs, notes, models, stamp)


def _curves(
    store: Store, status: ExperimentStatus, counts: Mapping[int, tuple[int, int]]
) -> tuple[dict[int, Curve], dict[str, int], set[str]]:
    """Each trial's curve of the experiment's metric (archive, rewritten archive, or DB
    rows; see the module docstring), the sources counted, the archives' metric names."""
    metric = status.metric
    run_dirs = {t.id: t.run_dir for t in status.trials}
    ended = {t.id for t in status.trials if t.state in TERMINAL_TRIAL_STATES}
    curves, stale, sources, names = _archived(run_dirs, counts, metric)
    refresh = _to_refresh(stale, run_dirs, ended)
    rewritten, _ = archive_trials(store, {tid: run_dirs[tid] for tid in refresh})
    curves.update((tid, by_name[metric]) for tid, by_name in rewritten.items() if metric in by_name)
    if rest := [tid for tid in stale if tid not in rewritten]:
        with store.read() as s:
            curves.update(_db_curves(s, rest, metric))
    return curves, sources, names


def _attempt_view(a: AttemptStatus) -> AttemptView:
    return AttemptView(
        key=a.key,
        job_id=a.job_id,
        state=a.state,
        cause=a.cause or "",
        exit_code=a.exit_code,
        exit_reason=a.exit_reason or "",
        lost_steps=a.lost_steps,
        node_list=a.node_list or "",
        terminal_seen=_epoch(a.terminal_seen_at),
        start=_epoch(a.started_at),
        end=_epoch(a.ended_at),
        end_recorded=a.ended_at is not None,
        gpu_util=None if a.gpu is None else a.gpu.util_mean,
        gpus_seen=0 if a.gpu is None else a.gpu.gpus,
    )


def _trial_view(t: TrialStatus, curve: Curve | None, now_s: float) -> TrialView:
    attempts = [_attempt_view(a) for a in t.attempts]
    spans = attempt_spans(attempts, now_s)
    attempts = [
        a if span is None else replace(a, end=span[1])
        for a, span in zip(attempts, spans, strict=True)
    ]
    return TrialView(
        id=t.id,
        state=t.state,
        hparams=redact_value(t.hparams_dict),
        steps=t.steps_completed,
        best=t.best_metric,
        latest=t.latest_metric,
        restarts=t.restarts,
        crashes=t.crashes,
        error=redact_text(t.error or ""),
        attempts=tuple(attempts),
        curve=curve,
        run_s=sum(end - start for start, end in (s for s in spans if s is not None)),
        tags=t.tags,
        note="" if t.note is None else redact_text(t.note.text),
    )


def _config(exp: Experiment) -> dict[str, Any]:
    """The experiment's resolved config, redacted ({} when unreadable)."""
    try:
        config = redact_value(json.loads(exp.config_json or "{}"))
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _repro(exp: Experiment, config: dict[str, Any], envs: list[str]) -> tuple[dict[str, str], ...]:
    """The reproducibility record's items and long texts, redacted."""
    facts = {
        "source_path": exp.source_path,
        "run_dir": exp.run_dir,
        "site": exp.site,
        "backend": exp.backend,
        "user": exp.user,
    }
    items, texts = repro_record(facts, config, parse_record(exp.repro_json), envs)
    return (
        {k: redact_text(v) for k, v in items.items()},
        {k: redact_text(v) for k, v in texts.items()},
    )


def load_page(store: Store, experiment_id: int, now: datetime | None = None) -> Page:
    """The page of one experiment; raises :class:`~dlhpc.errors.NotFoundError`.

    The DB is read in short sessions (a reader holds SQLite's shared lock, which
    would hold up the reconciler's commits); the archives are read between them."""
    now_s = _epoch(now) if now is not None else datetime.now(timezone.utc).timestamp()
    assert now_s is not None
    r = _read(store, experiment_id)
    st, exp = r.status, r.exp
    curves, sources, archived_names = _curves(store, st, r.counts)
    config = _config(exp)
    searcher = config.get("searcher") or {}
    repro, repro_texts = _repro(exp, config, r.envs)
    trials = [_trial_view(t, curves.get(t.id), now_s) for t in sorted(st.trials, key=_by_id)]
    max_length = int(searcher.get("max_length") or max((t.steps for t in trials), default=1))
    created_s = _epoch(st.created_at)
    assert created_s is not None
    return Page(
        id=st.id,
        name=st.name,
        description=redact_text(exp.description),
        state=st.state,
        searcher=st.searcher,
        metric=st.metric,
        smaller_is_better=st.smaller_is_better,
        created=created_s,
        ended=_epoch(st.ended_at),
        generated=now_s,
        trials=tuple(trials),
        best=pick_best(trials, st.smaller_is_better),
        hparams=hparam_views(config.get("hyperparameters") or {}, trials),
        rungs=rungs_of(searcher),
        max_length=max_length,
        usage=compute_usage(
            trials, config.get("resources") or {}, max_length, (st.gpu_hours, st.cpu_hours)
        ),
        events=tuple(r.events),
        events_hidden=r.hidden,
        decisions=st.decisions,
        disk=st.disk,
        idle_gpus=st.idle_gpus,
        repro=repro,
        repro_texts=repro_texts,
        yaml_text=redact_text(exp.yaml_text),
        config_text=json.dumps(config, indent=2, sort_keys=True),
        curve_sources=sources,
        other_metrics=tuple(sorted((r.names | archived_names) - {st.metric})),
        user=st.user,
        tags=st.tags,
        notes=tuple(r.notes),
        models=tuple(r.models),
        lab_stamp=r.lab_stamp,
    )


def _by_id(t: TrialStatus) -> int:
    return t.id
