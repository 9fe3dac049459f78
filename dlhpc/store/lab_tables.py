"""The lab tables (schema v6): tags and notes on experiments and trials, and the
model registry's versions.

Written only by the lease holder, like every table (principle 2): ``dlhpc tag``,
``dlhpc note`` and ``dlhpc model register`` take the reconciler lease. A row names
its target by ``kind`` (``experiment`` or ``trial``) and ``target_id``; every row
also carries its ``experiment_id``, so a page loads an experiment's tags and notes,
its trials' included, with one indexed read.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from dlhpc.store.tables import Base

__all__ = ["LAB_TABLES", "TARGET_KINDS", "ModelVersion", "Note", "Tag"]

#: What a tag or note is attached to.
TARGET_KINDS = ("experiment", "trial")


class Tag(Base):
    """A label on an experiment or a trial; unique per target."""

    __tablename__ = "tags"
    __table_args__ = (
        UniqueConstraint("kind", "target_id", "name"),
        Index("ix_tags_name", "name", "kind"),  # status --tag
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # one of TARGET_KINDS
    target_id: Mapped[int] = mapped_column(Integer)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Note(Base):
    """A free-text note on an experiment or a trial; notes accumulate, newest last."""

    __tablename__ = "notes"
    __table_args__ = (Index("ix_notes_target", "kind", "target_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # one of TARGET_KINDS
    target_id: Mapped[int] = mapped_column(Integer)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    text: Mapped[str] = mapped_column(Text)
    user: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime)


class ModelVersion(Base):
    """Version ``version`` of the registered model ``name``: one checkpoint of one
    trial. A checkpoint that a version names is never deleted by checkpoint GC."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("name", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)  # 1, 2, ... per name
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)  # the checkpoint's step
    metric: Mapped[float | None] = mapped_column(Float, nullable=True)  # at that step
    note: Mapped[str] = mapped_column(Text, default="")
    user: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime)


LAB_TABLES = ("tags", "notes", "model_versions")
"""The tables schema v6 added (``_migrations`` creates them from these models)."""
