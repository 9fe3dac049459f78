"""The rows an ingest batch writes (:mod:`dlhpc.store.ingest`), held by table in file
order and written as one executemany per table (Core statements compiled once: the
ORM's per-row bookkeeping cost more than the SQL for files of many records)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from dlhpc.states import CheckpointState
from dlhpc.store.tables import Base, Checkpoint, Event, GpuSample, Metric

__all__ = ["Mark", "Rows", "table"]

# what a re-published checkpoint (a folder name whose row the GC deleted) takes anew
_REPUBLISHED = ("attempt_id", "step", "size_bytes", "state", "created_at", "metric")


def table(model: type[Base]) -> Table:
    """The Core table of an ORM model."""
    return cast(Table, model.__table__)


def _metric_upsert() -> Any:
    ins = sqlite_insert(table(Metric))
    return ins.on_conflict_do_update(
        index_elements=["trial_id", "step", "name"],
        set_={
            "value": ins.excluded.value,
            "attempt_id": ins.excluded.attempt_id,
            "time": ins.excluded.time,
        },
    )


def _checkpoint_upsert() -> Any:
    ins = sqlite_insert(table(Checkpoint))
    # a folder name the GC freed and a job published again: a new checkpoint
    revive = {k: ins.excluded[k] for k in _REPUBLISHED}
    return ins.on_conflict_do_update(
        index_elements=["trial_id", "path"],
        set_={**revive, "pinned": False, "deleted_at": None},
        where=table(Checkpoint).c.state == CheckpointState.DELETED.value,
    )


# Core statements (compiled once, run as executemany): the ORM's per-row bookkeeping
# cost more than the SQL for files of many records
_METRIC_UPSERT = _metric_upsert()
_CHECKPOINT_UPSERT = _checkpoint_upsert()
_GPU_INSERT = sqlite_insert(table(GpuSample)).on_conflict_do_nothing(
    index_elements=["attempt_id", "host", "gpu_index", "time"]
)


@dataclass
class Rows:
    """The rows an ingest batch inserts, by table, in file order."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # log records
    marks: list[dict[str, Any]] = field(default_factory=list)  # ingested_files rows
    pending: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # trial -> metrics

    def _tables(self) -> tuple[list[dict[str, Any]], ...]:
        return (self.metrics, self.checkpoints, self.gpu, self.events)

    def held(self) -> int:
        return sum(map(len, self._tables()))

    def mark(self) -> Mark:
        """Where the rows held end now: :meth:`truncate` goes back to it."""
        return Mark(tuple(map(len, self._tables())), {k: len(v) for k, v in self.pending.items()})

    def truncate(self, mark: Mark) -> None:
        """Let go of the rows added since ``mark`` (not written yet)."""
        for rows, n in zip(self._tables(), mark.held, strict=True):
            del rows[n:]
        for trial_id, rows in self.pending.items():
            del rows[mark.pending.get(trial_id, 0) :]

    def write(self, session: Session, upto: Mark | None = None) -> None:
        """Write the rows held but the marks, in file order, then let go of them (a
        metric no longer pending is found in the table by
        :func:`~dlhpc.store._ingest_checkpoints.checkpoint_metric`); ``upto``: only
        those held at that mark (the rest stay held, pending ones too)."""
        conn = session.connection()
        ends = upto.held if upto is not None else tuple(map(len, self._tables()))
        metrics, checkpoints, gpu, events = (
            rows[:n] for rows, n in zip(self._tables(), ends, strict=True)
        )
        if metrics:  # a later row of a key wins (executemany runs them in order)
            conn.execute(_METRIC_UPSERT, metrics)
        if checkpoints:
            conn.execute(_CHECKPOINT_UPSERT, checkpoints)
        if gpu:  # executemany: no limit on bound parameters however long the file
            conn.execute(_GPU_INSERT, gpu)
        if events:
            conn.execute(insert(table(Event)), events)
        for rows, n in zip(self._tables(), ends, strict=True):
            del rows[:n]
        if upto is None:
            for pending in self.pending.values():
                pending.clear()


@dataclass(frozen=True)
class Mark:
    """How many rows :class:`Rows` held, by table and by trial (pending metrics)."""

    held: tuple[int, ...]
    pending: dict[int, int]
