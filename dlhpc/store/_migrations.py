"""Schema migrations: ``MIGRATIONS[v]`` brings a database from version v to v + 1.

Each runs inside one write transaction with the version bump, so a migration
that fails half-way leaves the database as it was.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection

__all__ = ["MIGRATIONS"]


def _v1_to_v2(conn: Connection) -> None:
    """Restart bookkeeping: trials.crashes/needs_job, attempts.cause/lost_steps."""
    for stmt in (
        "ALTER TABLE trials ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE trials ADD COLUMN needs_job BOOLEAN NOT NULL DEFAULT 0",
        "ALTER TABLE attempts ADD COLUMN cause VARCHAR(32) NOT NULL DEFAULT ''",
        "ALTER TABLE attempts ADD COLUMN lost_steps INTEGER",
    ):
        conn.exec_driver_sql(stmt)


def _v2_to_v3(conn: Connection) -> None:
    """Adaptive search, telemetry, reproducibility and checkpoint lifecycle:
    trials.told_step/stop_requested_at, experiments.repro_json, attempts.env_json,
    checkpoints.metric/pinned/deleted_at, and the decisions and gpu_samples tables
    (created from the models, so they match)."""
    from dlhpc.store.tables import Decision, GpuSample

    for stmt in (
        "ALTER TABLE trials ADD COLUMN told_step INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE trials ADD COLUMN stop_requested_at DATETIME",
        "ALTER TABLE experiments ADD COLUMN repro_json TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE attempts ADD COLUMN env_json TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE checkpoints ADD COLUMN metric FLOAT",
        "ALTER TABLE checkpoints ADD COLUMN pinned BOOLEAN NOT NULL DEFAULT 0",
        "ALTER TABLE checkpoints ADD COLUMN deleted_at DATETIME",
    ):
        conn.exec_driver_sql(stmt)
    Decision.__table__.create(conn)  # type: ignore[attr-defined]
    GpuSample.__table__.create(conn)  # type: ignore[attr-defined]


def _v3_to_v4(conn: Connection) -> None:
    """Scale: the gpu_summaries table (filled from the samples) and its trigger, an
    index on trials.ended_at, and metrics indexed by (trial, name, step) and (name, time)."""
    from dlhpc.store.tables import (
        GpuSummary,
        create_gpu_summary_trigger,
        rebuild_gpu_summaries,
    )

    GpuSummary.__table__.create(conn)  # type: ignore[attr-defined]
    rebuild_gpu_summaries(conn)
    create_gpu_summary_trigger(conn)
    for stmt in (
        "CREATE INDEX ix_trials_ended_at ON trials (ended_at)",
        "DROP INDEX IF EXISTS ix_metrics_trial_name",
        "CREATE INDEX ix_metrics_trial_name_step ON metrics (trial_id, name, step)",
        "CREATE INDEX ix_metrics_name_time ON metrics (name, time)",
    ):
        conn.exec_driver_sql(stmt)


def _v4_to_v5(conn: Connection) -> None:
    """Scale: the indexes ``dlhpc status`` reads instead of the rows (counts by state,
    the best and live trials, the ended attempts' hours, disk use, decisions and their
    latency), created from the models' declarations so that they match. One that
    exists is skipped: an earlier step may have created its table from today's models."""
    from dlhpc.store.tables import V5_INDEXES, Base

    have = {n for (n,) in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='index'")}
    for table in Base.metadata.sorted_tables:
        for index in table.indexes:
            if index.name in V5_INDEXES and index.name not in have:
                index.create(conn)


def _v5_to_v6(conn: Connection) -> None:
    """The lab: the tags, notes and model_versions tables, created from the models
    (``dlhpc/store/lab_tables.py``) so that they match a new database's."""
    from dlhpc.store.lab_tables import LAB_TABLES
    from dlhpc.store.tables import Base

    for name in LAB_TABLES:
        Base.metadata.tables[name].create(conn)


MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
    5: _v5_to_v6,
}
