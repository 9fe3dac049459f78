"""Tags and the latest note of each experiment and trial, for ``dlhpc status``.

One query per status call, whatever the number of experiments and trials: the tags of
the listed experiments and their trials, and for each target its newest note and how
many it has, as one ``UNION ALL`` read through the ``experiment_id`` indexes of the
lab tables (:mod:`dlhpc.store.lab_tables`). ``--tag`` filters experiments in SQL
(:func:`tagged`), through ``ix_tags_name``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, literal, select, union_all

from dlhpc.report.status_types import LatestNote
from dlhpc.store import Experiment, ModelVersion, Note, Tag

__all__ = ["EMPTY_LAB", "Lab", "lab_of", "lab_stamps", "tagged"]

Target = tuple[str, int]  # (kind, id): ("experiment", 3), ("trial", 12)


@dataclass(frozen=True)
class Lab:
    """Tags (sorted) and the latest note of each target that has any."""

    tags: dict[Target, tuple[str, ...]] = field(default_factory=dict)
    notes: dict[Target, LatestNote] = field(default_factory=dict)
    trials: frozenset[int] = frozenset()  # the trials with a tag or a note

    def trial_tags(self, trial_id: int) -> tuple[str, ...]:
        return self.tags.get(("trial", trial_id), ())

    def trial_note(self, trial_id: int) -> LatestNote | None:
        return self.notes.get(("trial", trial_id))


EMPTY_LAB = Lab()


def lab_of(conn: Any, exp_ids: Sequence[int]) -> Lab:
    """The tags and latest notes of the experiments ``exp_ids`` and of their trials
    (one statement)."""
    if not exp_ids:
        return EMPTY_LAB
    newest = (
        select(func.max(Note.id).label("id"), func.count().label("n"))
        .where(Note.experiment_id.in_(exp_ids))
        .group_by(Note.kind, Note.target_id)
        .subquery()
    )
    tags = select(
        literal(0), Tag.kind, Tag.target_id, Tag.name, Tag.user, Tag.created_at, literal(0)
    ).where(Tag.experiment_id.in_(exp_ids))
    notes = select(
        literal(1), Note.kind, Note.target_id, Note.text, Note.user, Note.created_at, newest.c.n
    ).join(newest, newest.c.id == Note.id)
    found: dict[Target, list[str]] = defaultdict(list)
    latest: dict[Target, LatestNote] = {}
    for what, kind, target, text, user, created, n in conn.execute(union_all(tags, notes)):
        if what == 0:
            found[(kind, target)].append(text)
        else:
            latest[(kind, target)] = LatestNote(text, user, _time(created), int(n))
    trials = frozenset(t for kind, t in [*found, *latest] if kind == "trial")
    return Lab({k: tuple(sorted(v)) for k, v in found.items()}, latest, trials)


def _time(value: Any) -> datetime:
    """A time of the union's rows (a UNION's column may come back as its stored text)."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def tagged(query: Any, tags: Sequence[str]) -> Any:
    """``query`` (of experiments) kept to those carrying every tag of ``tags``."""
    for name in dict.fromkeys(tags):
        query = query.where(
            Experiment.id.in_(
                select(Tag.experiment_id).where(Tag.name == name, Tag.kind == "experiment")
            )
        )
    return query


def lab_stamps(conn: Any, exp_ids: Sequence[int] | None = None) -> dict[int, str]:
    """Per experiment with any lab row, a digest of its tags, notes and model versions
    (of its trials too): a page whose digest differs is out of date even when its
    experiment ended long ago. ``exp_ids`` None: every experiment."""
    queries = (
        select(Tag.experiment_id, Tag.kind, Tag.target_id, Tag.name),
        select(Note.experiment_id, Note.id),
        select(ModelVersion.experiment_id, ModelVersion.id, ModelVersion.name,
               ModelVersion.version, ModelVersion.note),
    )  # fmt: skip
    digests: dict[int, Any] = {}
    for i, query in enumerate(queries):
        table = query.get_final_froms()[0]
        if exp_ids is not None:
            query = query.where(table.c.experiment_id.in_(exp_ids))
        for exp_id, *rest in conn.execute(query.order_by(*query.selected_columns)):
            digest = digests.setdefault(exp_id, hashlib.sha256())
            digest.update(repr((i, *rest)).encode())
    return {exp_id: d.hexdigest()[:16] for exp_id, d in digests.items()}
