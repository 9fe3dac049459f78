"""Checkpoint lifecycle: the keep policy, garbage collection, pins.

The policy (:func:`plan_gc`, pure) keeps the union of

* the experiment's best ``keep_experiment_best`` checkpoints by the searcher metric,
* each trial's best ``keep_best`` by the searcher metric,
* each trial's newest ``keep_latest`` by step,

and always every pinned checkpoint, every checkpoint that a model version names
(``dlhpc model register``: kept as ``model NAME:VERSION``, whatever the policy) and
the newest checkpoint of each trial that a resume or a promotion may still load (a
PENDING, RUNNING or PAUSED trial, or one with a promotion not acted on yet). A
checkpoint whose metric is unknown (none reported since the previous checkpoint, or
NaN) is never "best" but may be "latest". Ties in the metric go to the newer
checkpoint (higher step, then the later row); "newest" is the highest step,
re-saves of one step ordered by row id. The metric is fixed at ingest.

:func:`gc` applies the plan to one experiment under the reconciler lease: each
doomed folder is renamed out of sight and removed, only if it is one of its
trial's own (``<checkpoint.dir>/exp-<id>/trial-<id>/ckpt-<step>[-n]`` with the
row's step, :mod:`dlhpc.store.checkpoint_dirs`), reached from the configured root
without following a symlink and removed through the same descriptor
(:mod:`._contained`); anything else is *refused*: kept, its row left ACTIVE. Its
row then becomes DELETED with ``deleted_at`` and, as its size, the bytes the
removal freed, measured by the login node (never the size a job recorded). A row
whose folder is already gone is marked DELETED too, with 0 bytes (*missing*): the
folder goes before its row, so a crash between the two (or a tick whose database
was full, :func:`dlhpc.orchestrator.tick.tick`) leaves a row found missing later.
The tick runs it for every active experiment after the searcher pass
(:func:`gc_pass`); ``dlhpc gc`` on demand. A row whose folder name a job publishes
again after its deletion becomes ACTIVE again at ingest. Jobs prune nothing but
torn and stale temp folders (see :mod:`dlhpc.protocol.checkpoint`).
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

from sqlalchemy import Select, Table, bindparam, func, select, update
from sqlalchemy.orm import Session

from dlhpc.errors import DlhpcError, NotFoundError, UnsafePathError, UsageError
from dlhpc.orchestrator._contained import remove_own_checkpoint
from dlhpc.states import TERMINAL_TRIAL_STATES, CheckpointState
from dlhpc.store import Checkpoint, Decision, Experiment, Store, Trial, is_disk_full, utcnow
from dlhpc.store.checkpoint_dirs import (
    TrialCheckpointDir,
    checkpoint_config,
    experiment_checkpoint_dir,
    foreign_checkpoint,
    trial_checkpoint_dir,
)
from dlhpc.store.model_registry import registered_checkpoints

__all__ = [
    "CkptInfo",
    "GcPlan",
    "GcPolicy",
    "GcReport",
    "checkpoint_root",
    "experiment_plan",
    "gc",
    "gc_pass",
    "plan_gc",
    "set_pinned",
]

EXPERIMENT_BEST = "experiment-best"
TRIAL_BEST = "trial-best"
TRIAL_LATEST = "trial-latest"
PINNED = "pinned"
LIVE = "live"  # the newest of a trial a resume or promotion loads
MODEL = "model"  # "model NAME:VERSION": a registered model version names it


@dataclass(frozen=True)
class GcPolicy:
    """How many to keep (``checkpoint.keep_experiment_best`` / ``keep_best`` /
    ``keep_latest``); Determined's save_experiment_best / trial_best / trial_latest."""

    experiment_best: int = 0
    trial_best: int = 1
    trial_latest: int = 1

    @classmethod
    def from_config(cls, checkpoint: dict[str, Any]) -> GcPolicy:
        """From the ``checkpoint`` mapping of a stored resolved config (defaults for
        keys an older config lacks)."""
        return cls(
            experiment_best=int(checkpoint.get("keep_experiment_best", 0)),
            trial_best=int(checkpoint.get("keep_best", 1)),
            trial_latest=int(checkpoint.get("keep_latest", 1)),
        )


@dataclass(frozen=True)
class CkptInfo:
    """What the policy needs of one ACTIVE checkpoint."""

    id: int
    trial_id: int
    step: int
    metric: float | None = None
    pinned: bool = False
    size_bytes: int = 0
    path: str = ""


class GcPlan(NamedTuple):
    keep: dict[int, tuple[str, ...]]  # checkpoint id -> why it is kept
    delete: list[int]  # checkpoint ids, ascending


def _score(c: CkptInfo) -> float | None:
    return c.metric if c.metric is not None and math.isfinite(c.metric) else None


def _best(cands: Iterable[CkptInfo], n: int, smaller_is_better: bool) -> list[CkptInfo]:
    scored = [(s, c) for c in cands if (s := _score(c)) is not None]
    sign = 1.0 if smaller_is_better else -1.0
    # nsmallest: the same as a stable sort's first n, without sorting all of them
    best = heapq.nsmallest(max(0, n), scored, key=lambda sc: (sign * sc[0], -sc[1].step, -sc[1].id))
    return [c for _, c in best]


def plan_gc(
    checkpoints: Sequence[CkptInfo],
    protected_trials: Collection[int],
    policy: GcPolicy,
    smaller_is_better: bool,
    registered: Mapping[int, Sequence[str]] | None = None,
) -> GcPlan:
    """Split ``checkpoints`` (one experiment's ACTIVE ones) into kept and deleted.

    ``protected_trials``: trials whose newest checkpoint must stay (live ones, or
    ones with a pending promotion). ``registered``: checkpoint id -> the model
    versions (``NAME:VERSION``) naming it; each is kept (``model NAME:VERSION``).
    Every id lands in exactly one of the two.
    """
    reasons: dict[int, list[str]] = defaultdict(list)
    by_trial: dict[int, list[CkptInfo]] = defaultdict(list)
    models = registered or {}
    for c in checkpoints:
        by_trial[c.trial_id].append(c)
        if c.pinned:
            reasons[c.id].append(PINNED)
        reasons[c.id].extend(f"{MODEL} {ref}" for ref in models.get(c.id, ()))
    for c in _best(checkpoints, policy.experiment_best, smaller_is_better):
        reasons[c.id].append(EXPERIMENT_BEST)
    for trial_id, cks in by_trial.items():
        if len(cks) == 1:  # most trials of a long search: the general case's result, fast
            (c,) = cks
            if policy.trial_best > 0 and _score(c) is not None:
                reasons[c.id].append(TRIAL_BEST)
            if policy.trial_latest > 0:
                reasons[c.id].append(TRIAL_LATEST)
            if trial_id in protected_trials:
                reasons[c.id].append(LIVE)
            continue
        for c in _best(cks, policy.trial_best, smaller_is_better):
            reasons[c.id].append(TRIAL_BEST)
        newest = sorted(cks, key=lambda c: (c.step, c.id), reverse=True)
        for c in newest[: max(0, policy.trial_latest)]:
            reasons[c.id].append(TRIAL_LATEST)
        if trial_id in protected_trials:
            reasons[newest[0].id].append(LIVE)
    keep = {c.id: tuple(reasons[c.id]) for c in checkpoints if reasons.get(c.id)}
    return GcPlan(keep, sorted(c.id for c in checkpoints if c.id not in keep))


# -- facts from the store ---------------------------------------------------------


def checkpoint_root(exp: Experiment) -> Path | None:
    """``<checkpoint.dir>/<its run folder's name>``, where this experiment's trials
    checkpoint (``exp-000007-<slug>``, or ``exp-000007`` for older experiments)."""
    return experiment_checkpoint_dir(exp)


def _protected(s: Session, exp_id: int, among: Collection[int] | None = None) -> set[int]:
    """Live trials, and trials with a promotion to a longer grant not acted on yet;
    ``among``: only those of these trials (the ones :func:`plan_gc` asks about: the
    trials of the rows it plans), not the thousands a long search holds live."""
    live = select(Trial.id).where(
        Trial.experiment_id == exp_id, Trial.state.not_in(TERMINAL_TRIAL_STATES)
    )
    if among is not None:
        live = live.where(Trial.id.in_(sorted(among)))
    out = set(s.scalars(live))
    out.update(
        s.scalars(
            select(Decision.trial_id)
            .join(Trial, Trial.id == Decision.trial_id)
            .where(
                Decision.experiment_id == exp_id,
                Decision.kind == "promote",
                Decision.acted_at.is_(None),
                Decision.length > Trial.max_length,
            )
        )
    )
    return out


def _active_ids(exp_id: int) -> Select[Any]:
    return (
        select(Checkpoint.id)
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .where(Trial.experiment_id == exp_id, Checkpoint.state == CheckpointState.ACTIVE.value)
    )


def _active(s: Session, exp_id: int, *, where: Iterable[Any] = ()) -> list[CkptInfo]:
    rows = s.execute(
        _active_ids(exp_id)
        .add_columns(
            Checkpoint.trial_id,
            Checkpoint.step,
            Checkpoint.metric,
            Checkpoint.pinned,
            Checkpoint.size_bytes,
            Checkpoint.path,
        )
        .where(*where)
        .order_by(Checkpoint.id)
    ).all()
    return [CkptInfo(*row) for row in rows]


def experiment_plan(s: Session, exp: Experiment) -> tuple[list[CkptInfo], GcPlan]:
    """The experiment's ACTIVE checkpoints and what the policy does with them now."""
    rows = _active(s, exp.id)
    policy = GcPolicy.from_config(checkpoint_config(exp))
    models = registered_checkpoints(s, exp.id)
    return rows, plan_gc(rows, _protected(s, exp.id), policy, exp.smaller_is_better, models)


def _deciding_rows(s: Session, exp: Experiment, policy: GcPolicy) -> list[CkptInfo]:
    """The ACTIVE rows whose fate :func:`plan_gc` can change: with ``trial_latest``
    >= 1 a trial's only checkpoint is always kept, so only the trials holding
    several, plus the experiment's ``experiment_best`` best (the ranking
    :func:`_best` makes, in SQL); all of them otherwise. :func:`plan_gc` over these
    deletes exactly what it deletes over all of them, without reading a long
    search's ~1 row per trial (most of the rows)."""
    if policy.trial_latest < 1:
        return _active(s, exp.id)
    several = (
        _active_ids(exp.id)
        .with_only_columns(Checkpoint.trial_id)
        .group_by(Checkpoint.trial_id)
        .having(func.count() > 1)
    )
    rows = {c.id: c for c in _active(s, exp.id, where=[Checkpoint.trial_id.in_(several)])}
    if policy.experiment_best > 0:
        metric = Checkpoint.metric.asc() if exp.smaller_is_better else Checkpoint.metric.desc()
        finite = _active_ids(exp.id).where(
            Checkpoint.metric > -math.inf, Checkpoint.metric < math.inf
        )
        best = finite.order_by(metric, Checkpoint.step.desc(), Checkpoint.id.desc()).limit(
            policy.experiment_best
        )
        rows.update((c.id, c) for c in _active(s, exp.id, where=[Checkpoint.id.in_(best)]))
    return sorted(rows.values(), key=lambda c: c.id)


# -- applying it --------------------------------------------------------------------


@dataclass
class GcReport:
    """What one GC did (``dry_run``: what it would do; nothing is touched then)."""

    experiment_id: int
    dry_run: bool
    kept: int = 0
    bytes_freed: int = 0  # measured while removing (dry run: what removing would free)
    deleted: list[str] = field(default_factory=list)  # folders removed
    missing: list[str] = field(default_factory=list)  # already gone: row marked, 0 bytes
    refused: list[str] = field(default_factory=list)  # not the trial's own: kept as they are
    errors: list[str] = field(default_factory=list)


def _own_dirs(exp: Experiment, rows: Iterable[CkptInfo]) -> dict[int, TrialCheckpointDir | None]:
    """Each trial's own checkpoint folder, built from what launch recorded."""
    return {c.trial_id: trial_checkpoint_dir(exp, c.trial_id) for c in rows}


def _delete_one(c: CkptInfo, own: TrialCheckpointDir | None, report: GcReport) -> int | None:
    """Delete one doomed checkpoint's folder into ``report``; the bytes freed when its
    row becomes DELETED (0: already gone), None when it stays ACTIVE (refused, error)."""
    if foreign_checkpoint(own, c.path, c.step) is not None or own is None:
        report.refused.append(c.path)
        return None
    try:
        freed = remove_own_checkpoint(own, Path(c.path).name, report.dry_run)
    except UnsafePathError:
        report.refused.append(c.path)
        return None
    except OSError as err:
        report.errors.append(f"checkpoint {c.id} ({c.path}): {err}")
        return None
    if freed is None:
        report.missing.append(c.path)
        return 0
    report.deleted.append(c.path)
    report.bytes_freed += freed
    return freed


def _mark_deleted(store: Store, freed: Mapping[int, int]) -> None:
    """Rows DELETED, each with the bytes its deletion freed as its size."""
    table = cast(Table, Checkpoint.__table__)
    stmt = (
        update(table)
        .where(table.c.id == bindparam("cid"), table.c.state == CheckpointState.ACTIVE.value)
        .values(
            state=CheckpointState.DELETED.value, deleted_at=utcnow(), size_bytes=bindparam("freed")
        )
    )
    with store.write() as s:
        s.connection().execute(stmt, [{"cid": i, "freed": n} for i, n in freed.items()])


def gc(store: Store, experiment_id: int, dry_run: bool = False) -> GcReport:
    """Apply the keep policy to one experiment (any state); see the module docstring.

    Holds the reconciler lease unless ``dry_run`` (re-entrant inside a tick);
    raises :class:`~dlhpc.errors.NotFoundError` for an unknown id and
    :class:`~dlhpc.errors.LeaseHeldError` while another reconciler runs. An
    ``OSError`` on one folder is listed in ``errors`` and that row left ACTIVE.
    """
    report = GcReport(experiment_id, dry_run)
    with nullcontext() if dry_run else store.hold_lease():
        with store.read() as s:
            exp = s.get(Experiment, experiment_id)
            if exp is None:
                raise NotFoundError(f"no experiment {experiment_id}")
            policy = GcPolicy.from_config(checkpoint_config(exp))
            rows = _deciding_rows(s, exp, policy)
            models = registered_checkpoints(s, exp.id)
            protected = _protected(s, exp.id, {c.trial_id for c in rows})
            plan = plan_gc(rows, protected, policy, exp.smaller_is_better, models)
            active = s.scalar(select(func.count()).select_from(_active_ids(exp.id).subquery()))
            by_id = {c.id: c for c in rows}
            own = _own_dirs(exp, (by_id[i] for i in plan.delete))
        report.kept = (active or 0) - len(plan.delete)  # every row is kept or deleted
        gone: dict[int, int] = {}
        for cid in plan.delete:
            c = by_id[cid]
            freed = _delete_one(c, own[c.trial_id], report)
            if freed is not None:
                gone[cid] = freed
        if gone and not dry_run:
            _mark_deleted(store, gone)
    return report


class _TickLike(Protocol):
    errors: list[str]
    checkpoint_bytes_freed: int


def gc_pass(store: Store, experiment_id: int, report: _TickLike) -> None:
    """The tick's GC of one experiment: bytes freed and errors go into ``report``
    (refused folders are ``dlhpc gc``'s to show); a full database disk is raised.
    It reads only the rows whose fate can change (:func:`_deciding_rows`)."""
    try:
        result = gc(store, experiment_id)
    except (DlhpcError, OSError, ValueError, TypeError) as err:  # e.g. the lease, a bad config
        if is_disk_full(err):
            raise  # the tick stops, and frees space without committing
        report.errors.append(f"experiment {experiment_id}: checkpoint GC: {err}")
        return
    report.checkpoint_bytes_freed += result.bytes_freed
    report.errors.extend(f"experiment {experiment_id}: GC: {e}" for e in result.errors)


def set_pinned(store: Store, checkpoint_id: int, pinned: bool) -> dict[str, Any]:
    """Pin (GC never deletes it) or unpin one checkpoint, under the reconciler lease.
    A deleted checkpoint cannot be pinned (:class:`~dlhpc.errors.UsageError`)."""
    with store.hold_lease(), store.write() as s:
        c = s.get(Checkpoint, checkpoint_id)
        if c is None:
            raise NotFoundError(f"no checkpoint {checkpoint_id}")
        if pinned and c.state != CheckpointState.ACTIVE.value:
            raise UsageError(
                f"checkpoint {checkpoint_id} was deleted at {c.deleted_at:%Y-%m-%d %H:%M} UTC"
                if c.deleted_at
                else f"checkpoint {checkpoint_id} is {c.state}"
            )
        c.pinned = pinned
        return {"id": c.id, "trial_id": c.trial_id, "path": c.path, "pinned": c.pinned}
