"""The state database schema (SQLAlchemy 2.x declarative models).

Only the reconciler writes these tables (principle 2). Unique constraints carry
the exactly-once guarantees: an attempt's event file is recorded in
``ingested_files`` in the same transaction that applies its records, and a
metric is keyed by (trial, step, name).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    and_,
    event,
    func,
    literal_column,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.sql.elements import ColumnElement

from dlhpc.states import CheckpointState

__all__ = [
    "DECISION_LATENCY_S",
    "V5_INDEXES",
    "Attempt",
    "Base",
    "Checkpoint",
    "Decision",
    "Event",
    "Experiment",
    "GpuSample",
    "GpuSummary",
    "IngestedFile",
    "Lease",
    "Meta",
    "Metric",
    "Submission",
    "Trial",
    "create_gpu_summary_trigger",
    "rebuild_gpu_summaries",
]


class Base(DeclarativeBase):
    pass


class Meta(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Lease(Base):
    """The reconciler lease: one row per lease name, owned until ``expires_at``."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    acquired_at: Mapped[datetime] = mapped_column(DateTime)
    expires_at: Mapped[datetime] = mapped_column(DateTime)


class Experiment(Base):
    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    site: Mapped[str] = mapped_column(String(255))
    searcher: Mapped[str] = mapped_column(String(32))
    metric: Mapped[str] = mapped_column(String(255))
    smaller_is_better: Mapped[bool] = mapped_column(Boolean)
    source_path: Mapped[str] = mapped_column(Text)
    yaml_text: Mapped[str] = mapped_column(Text)
    config_json: Mapped[str] = mapped_column(Text)  # resolved config
    run_dir: Mapped[str] = mapped_column(Text)
    searcher_state: Mapped[str] = mapped_column(Text, default="{}")
    # what launch recorded to reproduce it: code, environment, Slurm, site (v3)
    repro_json: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")
    user: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)

    trials: Mapped[list[Trial]] = relationship(back_populates="experiment", order_by="Trial.id")


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("experiment_id", "request_id"),
        Index("ix_trials_ended_at", "ended_at"),  # trials that ended lately (v4)
        # status (v5): counts by state and the live trials from the index alone (no
        # best_metric here: a tick updates it on every result); the best trials in
        # (metric, id) order. Partial: a join that reads only a trial's id and
        # experiment cannot take it (SQLite would, and walk the trials in metric order).
        Index("ix_trials_experiment_state", "experiment_id", "state"),
        Index(
            "ix_trials_experiment_best",
            "experiment_id",
            "best_metric",
            sqlite_where=text("best_metric IS NOT NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    request_id: Mapped[int] = mapped_column(Integer)  # the searcher's id for this trial
    state: Mapped[str] = mapped_column(String(16), index=True)
    hparams_json: Mapped[str] = mapped_column(Text)
    max_length: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    run_dir: Mapped[str] = mapped_column(Text)
    steps_completed: Mapped[int] = mapped_column(Integer, default=0)
    best_metric: Mapped[float | None] = mapped_column(Float, nullable=True)
    latest_metric: Mapped[float | None] = mapped_column(Float, nullable=True)
    restarts: Mapped[int] = mapped_column(Integer, default=0)  # every new attempt after the first
    # restarts caused by the trial's own failures; only these count toward max_restarts (v2)
    crashes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the latest attempt is over and the trial waits for a new job (v2)
    needs_job: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # the highest metric step already told to the searcher (v3)
    told_step: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the searcher stopped the trial while its job was live; the job must end (v3)
    stop_requested_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)

    experiment: Mapped[Experiment] = relationship(back_populates="trials")
    attempts: Mapped[list[Attempt]] = relationship(back_populates="trial", order_by="Attempt.id")


class Submission(Base):
    """One batch handed to a scheduler; ``name`` is the job name, used to find
    jobs whose ids a crashed launch never recorded."""

    __tablename__ = "submissions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    state: Mapped[str] = mapped_column(String(16))  # SUBMITTING, SUBMITTED, FAILED
    trial_ids_json: Mapped[str] = mapped_column(Text)  # task order
    folder: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    error: Mapped[str] = mapped_column(Text, default="")


class Attempt(Base):
    """One run of a trial by the scheduler (a Slurm job array task run)."""

    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("trial_id", "attempt_key"),
        # status (v5): the live attempts, and the ended ones' hours from the index alone
        Index("ix_attempts_state", "state", "trial_id"),
        Index(
            "ix_attempts_trial_hours",
            "trial_id",
            "state",
            "started_at",
            "ended_at",
            "terminal_seen_at",
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    submission_id: Mapped[int | None] = mapped_column(ForeignKey("submissions.id"), nullable=True)
    attempt_key: Mapped[str] = mapped_column(String(128))
    job_id: Mapped[str] = mapped_column(String(64), index=True)
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    restart_count: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16))  # scheduler JobState value
    raw_state: Mapped[str] = mapped_column(String(32), default="")
    node_list: Mapped[str] = mapped_column(Text, default="")
    host: Mapped[str] = mapped_column(String(255), default="")
    log_path: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the exit record's "reason/SIGNAL", + EXIT_PREEMPTED when a worker said preempted
    exit_reason: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime)
    # first tick that saw the job terminal without its exit record (grace for FS lag)
    terminal_seen_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    # why the attempt ended: completed, crash, setup, preempted, timeout, requeued, lost,
    # cancelled (v2)
    cause: Mapped[str] = mapped_column(String(32), default="", server_default="")
    # steps trained since the last published checkpoint when it was interrupted (v2)
    lost_steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the job's own record: nodes, GPUs, driver, CPU, allowed env, data fingerprint (v3)
    env_json: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")

    trial: Mapped[Trial] = relationship(back_populates="attempts")


#: The end of ``Attempt.exit_reason`` when an exit record said ``"preempted": true``.
EXIT_PREEMPTED = "/preempted"


class IngestedFile(Base):
    __tablename__ = "ingested_files"
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    records: Mapped[int] = mapped_column(Integer)
    ingested_at: Mapped[datetime] = mapped_column(DateTime)


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (
        UniqueConstraint("trial_id", "step", "name"),
        # a trial's points of one metric in step order: told, best, latest (v4: + step)
        Index("ix_metrics_trial_name_step", "trial_id", "name", "step"),
        Index("ix_metrics_name_time", "name", "time"),  # the newest result (v4)
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"))
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"))
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))
    value: Mapped[float | None] = mapped_column(Float, nullable=True)  # NaN stored as NULL
    time: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (
        UniqueConstraint("trial_id", "path"),
        # status's disk use from the index alone (v5)
        Index("ix_checkpoints_trial_state_size", "trial_id", "state", "size_bytes"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id"), nullable=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default=CheckpointState.ACTIVE.value)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    # the searcher metric at this step, for keep-best policies (v3)
    metric: Mapped[float | None] = mapped_column(Float, nullable=True)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")  # v3
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)  # v3


class Event(Base):
    """Human-readable history: submissions, state changes, errors."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int | None] = mapped_column(
        ForeignKey("experiments.id"), nullable=True, index=True
    )
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id"), nullable=True)
    time: Mapped[datetime] = mapped_column(DateTime)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


class Decision(Base):
    """A searcher decision acted on (v3): a promotion (``promote``: the trial may
    train to ``length``) or an early stop (``stop``). ``result_time`` is when the
    newest result the searcher had seen was written by its job, so
    ``acted_at - result_time`` is the decision latency."""

    __tablename__ = "decisions"
    # status's decisions by kind from the index alone (v5)
    __table_args__ = (Index("ix_decisions_experiment_kind", "experiment_id", "kind", "acted_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    length: Mapped[int] = mapped_column(Integer)
    result_time: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    decided_at: Mapped[datetime] = mapped_column(DateTime)
    acted_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


DECISION_LATENCY_S: ColumnElement[float] = func.max(
    literal_column("0.0"),
    (func.julianday(Decision.acted_at) - func.julianday(Decision.result_time))
    * literal_column("86400.0"),
)
"""A decision's latency in seconds (``acted_at - result_time``, at least 0), written
with literal constants so that SQLite matches it to ``ix_decisions_latency``: a query
ordering or filtering by exactly this expression reads the index, not the rows."""

# the timed decisions by latency (v5): status's count, median and max without a sort
Index(
    "ix_decisions_latency",
    Decision.experiment_id,
    DECISION_LATENCY_S,
    sqlite_where=and_(Decision.acted_at.is_not(None), Decision.result_time.is_not(None)),
)

V5_INDEXES = (
    "ix_trials_experiment_state",
    "ix_trials_experiment_best",
    "ix_attempts_state",
    "ix_attempts_trial_hours",
    "ix_checkpoints_trial_state_size",
    "ix_decisions_experiment_kind",
    "ix_decisions_latency",
)
"""The indexes schema v5 added (``_migrations`` creates them from these declarations)."""


class GpuSample(Base):
    """One GPU's telemetry sample from an attempt's ``gpu`` records (v3)."""

    __tablename__ = "gpu_samples"
    __table_args__ = (UniqueConstraint("attempt_id", "host", "gpu_index", "time"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), index=True)
    time: Mapped[float] = mapped_column(Float)
    host: Mapped[str] = mapped_column(String(255))
    gpu_index: Mapped[int] = mapped_column(Integer)
    util: Mapped[int | None] = mapped_column(Integer, nullable=True)  # percent
    mem_used: Mapped[int | None] = mapped_column(Integer, nullable=True)  # bytes
    mem_total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)


class GpuSummary(Base):
    """Per (attempt, host, GPU): the count and sum of the utilization samples and the
    first and newest sample time (v4). Kept by a trigger on every ``gpu_samples``
    insert, so ``dlhpc status`` never scans the samples of ended attempts."""

    __tablename__ = "gpu_summaries"
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), primary_key=True)
    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    samples: Mapped[int] = mapped_column(Integer)
    n_util: Mapped[int] = mapped_column(Integer)  # samples with a utilization
    sum_util: Mapped[int] = mapped_column(Integer)
    first: Mapped[float] = mapped_column(Float)
    newest: Mapped[float] = mapped_column(Float)


_SUMMARY_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS gpu_samples_summary AFTER INSERT ON gpu_samples
BEGIN
  INSERT INTO gpu_summaries (attempt_id, host, gpu_index, samples, n_util, sum_util, first, newest)
  VALUES (NEW.attempt_id, NEW.host, NEW.gpu_index, 1, NEW.util IS NOT NULL,
          coalesce(NEW.util, 0), NEW.time, NEW.time)
  ON CONFLICT (attempt_id, host, gpu_index) DO UPDATE SET
    samples = samples + 1,
    n_util = n_util + excluded.n_util,
    sum_util = sum_util + excluded.sum_util,
    first = min(first, excluded.first),
    newest = max(newest, excluded.newest);
END
"""


def create_gpu_summary_trigger(conn: Connection) -> None:
    """The trigger that keeps ``gpu_summaries`` (an ignored duplicate sample, an
    ``ON CONFLICT DO NOTHING`` insert, fires nothing)."""
    conn.execute(text(_SUMMARY_TRIGGER))


def rebuild_gpu_summaries(conn: Connection) -> None:
    """Recompute ``gpu_summaries`` from the samples (migration, bulk loads)."""
    conn.execute(text("DELETE FROM gpu_summaries"))
    conn.execute(
        text(
            "INSERT INTO gpu_summaries"
            " (attempt_id, host, gpu_index, samples, n_util, sum_util, first, newest)"
            " SELECT attempt_id, host, gpu_index, count(*), count(util), coalesce(sum(util), 0),"
            " min(time), max(time) FROM gpu_samples GROUP BY attempt_id, host, gpu_index"
        )
    )


@event.listens_for(Base.metadata, "after_create")
def _after_create(_target: object, conn: Connection, **_kw: object) -> None:
    if "gpu_summaries" in Base.metadata.tables and conn.dialect.name == "sqlite":
        create_gpu_summary_trigger(conn)
