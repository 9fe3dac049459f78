"""Store: schema version, lease, exactly-once ingest."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from dlhpc.errors import LeaseHeldError, SchemaVersionError
from dlhpc.protocol import EventWriter
from dlhpc.store import (
    Attempt,
    GpuSample,
    IngestedFile,
    LeaseLostError,
    Metric,
    Store,
    Trial,
    utcnow,
)
from dlhpc.store.engine import make_engine, migrate
from dlhpc.store.ingest import ingest_attempt, ingest_attempts
from dlhpc.store.lab_tables import LAB_TABLES
from dlhpc.store.summaries import refresh_metrics
from dlhpc.store.tables import V5_INDEXES, Decision, Lease
from tests.unit._db import exp_and_trial, submitted_attempt


def test_new_db_records_schema_version(tmp_path: Path) -> None:
    Store(tmp_path).close()
    con = sqlite3.connect(tmp_path / "dlhpc.db")
    assert con.execute("select value from meta where key='schema_version'").fetchone() == ("6",)


def _undo_v6(con: sqlite3.Connection) -> None:
    """Turn a v6 schema back into v5's."""
    for table in LAB_TABLES:
        con.execute(f"DROP TABLE {table}")


def _undo_v5(con: sqlite3.Connection) -> None:
    """Turn a v6 schema back into v4's."""
    _undo_v6(con)
    for name in V5_INDEXES:
        con.execute(f"DROP INDEX {name}")


def _undo_v4(con: sqlite3.Connection) -> None:
    """Turn a v6 schema back into v3's."""
    _undo_v5(con)
    con.execute("DROP TRIGGER gpu_samples_summary")
    con.execute("DROP TABLE gpu_summaries")
    con.execute("DROP INDEX ix_trials_ended_at")
    con.execute("DROP INDEX ix_metrics_trial_name_step")
    con.execute("DROP INDEX ix_metrics_name_time")
    con.execute("CREATE INDEX ix_metrics_trial_name ON metrics (trial_id, name)")


def test_v3_to_v4_summarises_existing_gpu_samples_and_keeps_them_current(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store(home)
    tid = exp_and_trial(store, tmp_path)
    with store.write() as s:
        a = Attempt(
            trial_id=tid, attempt_key="1_0.r0", job_id="1_0", state="RUNNING", created_at=utcnow()
        )
        s.add(a)
        s.flush()
        aid = a.id
    store.close()
    con = sqlite3.connect(home / "dlhpc.db")
    _undo_v4(con)
    samples = [(aid, 10.0, "n1", 0, 50), (aid, 20.0, "n1", 0, None), (aid, 30.0, "n1", 1, 90)]
    con.executemany(
        "INSERT INTO gpu_samples (attempt_id, time, host, gpu_index, util) VALUES (?, ?, ?, ?, ?)",
        samples,
    )
    con.execute("update meta set value='3' where key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(SchemaVersionError):
        Store(home)
    assert migrate(make_engine(home / "dlhpc.db", writer=True)) == (3, 6)
    store = Store(home)
    summary = "SELECT host, gpu_index, samples, n_util, sum_util, first, newest FROM gpu_summaries"
    with store.write() as s:
        rows = sorted(s.execute(text(summary)).all())
        assert rows == [("n1", 0, 2, 1, 50, 10.0, 20.0), ("n1", 1, 1, 1, 90, 30.0, 30.0)]
        # the trigger keeps it: a new sample counts, a duplicate (ignored) does not
        s.add(GpuSample(attempt_id=aid, time=40.0, host="n1", gpu_index=0, util=70))
        s.flush()
        s.execute(
            text(
                "INSERT OR IGNORE INTO gpu_samples (attempt_id, time, host, gpu_index, util)"
                " VALUES (:a, 40.0, 'n1', 0, 5)"
            ),
            {"a": aid},
        )
        rows = sorted(s.execute(text(summary)).all())
        assert rows[0] == ("n1", 0, 3, 2, 120, 10.0, 40.0)
        names = {r[0] for r in s.execute(text("SELECT name FROM sqlite_master WHERE type='index'"))}
        assert {"ix_trials_ended_at", "ix_metrics_trial_name_step", "ix_metrics_name_time"} <= names
        assert "ix_metrics_trial_name" not in names


def _index_sql(db: Path) -> dict[str, str]:
    con = sqlite3.connect(db)
    try:
        return dict(con.execute("SELECT name, sql FROM sqlite_master WHERE type='index'"))
    finally:
        con.close()


def test_v4_to_v5_adds_the_status_indexes_as_a_new_db_has_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    Store(home).close()
    fresh = _index_sql(home / "dlhpc.db")
    assert set(V5_INDEXES) <= set(fresh)
    con = sqlite3.connect(home / "dlhpc.db")
    _undo_v5(con)
    con.execute("update meta set value='4' where key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(SchemaVersionError):
        Store(home)
    assert migrate(make_engine(home / "dlhpc.db", writer=True)) == (4, 6)
    assert _index_sql(home / "dlhpc.db") == fresh
    Store(home).close()


def _schema_sql(db: Path) -> dict[str, str]:
    con = sqlite3.connect(db)
    try:
        return dict(con.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"))
    finally:
        con.close()


def test_v5_to_v6_adds_the_lab_tables_as_a_new_db_has_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store(home)
    exp_and_trial(store, tmp_path)
    store.close()
    fresh = _schema_sql(home / "dlhpc.db")
    assert set(LAB_TABLES) <= set(fresh)
    con = sqlite3.connect(home / "dlhpc.db")
    _undo_v6(con)
    con.execute("update meta set value='5' where key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(SchemaVersionError, match="needs v6"):
        Store(home)
    assert migrate(make_engine(home / "dlhpc.db", writer=True)) == (5, 6)
    assert _schema_sql(home / "dlhpc.db") == fresh
    store = Store(home)
    with store.read() as s:  # the rows from before are still there
        assert s.scalar(select(Trial)) is not None
    store.close()


def _make_v1_db(home: Path) -> None:
    """A database as schema v1 made it (v2 added four columns, v3 two and two tables,
    v4 a table, its trigger and two indexes)."""
    Store(home).close()
    con = sqlite3.connect(home / "dlhpc.db")
    _undo_v4(con)
    con.execute("DROP TABLE decisions")
    con.execute("DROP TABLE gpu_samples")
    for table, column in (
        ("trials", "told_step"),
        ("trials", "stop_requested_at"),
        ("experiments", "repro_json"),
        ("attempts", "env_json"),
        ("checkpoints", "metric"),
        ("checkpoints", "pinned"),
        ("checkpoints", "deleted_at"),
        ("trials", "crashes"),
        ("trials", "needs_job"),
        ("attempts", "cause"),
        ("attempts", "lost_steps"),
    ):
        con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    con.execute("update meta set value='1' where key='schema_version'")
    con.commit()
    con.close()


def test_old_schema_gets_clear_message_and_migrates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from dlhpc.cli.main import cli

    home = tmp_path / "home"
    _make_v1_db(home)
    with pytest.raises(SchemaVersionError, match="dlhpc db migrate"):
        Store(home)
    monkeypatch.setenv("DLHPC_HOME", str(home))
    monkeypatch.setenv("DLHPC_SITE", "local")
    res = CliRunner().invoke(cli, ["status"])
    assert res.exit_code == 1 and "dlhpc db migrate" in res.output
    res = CliRunner().invoke(cli, ["db", "migrate"])
    assert res.exit_code == 0, res.output
    assert "v1 -> v6" in res.output and (home / "dlhpc.db.v1.bak").exists()
    store = Store(home)  # opens without complaint now
    exp_and_trial(store, tmp_path)
    with store.read() as s:
        t = s.scalar(select(Trial))
        assert t is not None and t.crashes == 0 and t.needs_job is False
        assert t.told_step == 0 and t.stop_requested_at is None
        assert s.scalar(select(func.count()).select_from(Decision)) == 0
    res = CliRunner().invoke(cli, ["db", "migrate"])
    assert res.exit_code == 0 and "nothing to do" in res.output


def test_second_reconciler_is_refused_then_takes_expired_lease(tmp_path: Path) -> None:
    a, b = Store(tmp_path), Store(tmp_path)
    with a.hold_lease():
        with pytest.raises(LeaseHeldError), b.hold_lease():
            pass
        # a stalls past its expiry: b may take over, and a's next write is fenced off
        with a.write() as s:
            row = s.get(Lease, "reconciler")
            assert row is not None
            row.expires_at = utcnow() - timedelta(seconds=1)
        a_owner = a._owner
        a._owner = None  # let the expiry write above through without renewing
        with b.hold_lease():
            a._owner = a_owner
            with pytest.raises(LeaseLostError), a.write():
                pass
        a._owner = None
    with b.hold_lease():
        pass


def test_ingest_is_exactly_once_and_keeps_latest_value_per_step(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    adir = tmp_path / "t" / "attempts" / "123_4.r0"
    w = EventWriter(adir, "user-r0")
    w.add("metric", step=1, metrics={"val_loss": 0.9})
    w.add("metric", step=2, metrics={"val_loss": 0.5, "acc": float("nan")})
    w.flush()
    for _ in range(3):  # repeated passes ingest nothing new
        with store.write() as s:
            t = s.get(Trial, tid)
            assert t is not None
            ingest_attempt(s, t, adir, utcnow())
            refresh_metrics(s, [t])
    w.add("metric", step=2, metrics={"val_loss": 0.4})  # re-reported step (after a restart)
    w.add("exit", code=0, reason="completed")
    w.flush()
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        res = ingest_attempt(s, t, adir, utcnow())
        refresh_metrics(s, [t])
    assert res.files == 1 and res.exited
    with store.read() as s:
        rows = s.execute(
            select(Metric.step, Metric.name, Metric.value).order_by(Metric.step, Metric.name)
        ).all()
        assert [(r.step, r.name) for r in rows] == [(1, "val_loss"), (2, "acc"), (2, "val_loss")]
        assert rows[1].value is None and rows[2].value == 0.4
        assert s.scalar(select(func.count()).select_from(IngestedFile)) == 2
        t = s.get(Trial, tid)
        assert t is not None and t.best_metric == 0.4 and t.latest_metric == 0.4
        assert t.steps_completed == 2
        a = s.scalar(select(Attempt))
        assert a is not None and a.job_id == "123_4" and a.array_index == 4 and a.exit_code == 0


def test_a_restart_of_a_job_under_its_own_id_is_recorded_with_the_job_log(
    tmp_path: Path,
) -> None:
    """Slurm's requeue (preemption, ``scontrol requeue``, a self-requeue at the time
    limit) runs the task again under its id, appending to the same log file: the new
    attempt found in the files takes the job's log and submission; another job's
    attempt found before its submission is recorded has neither (adopt fills them in)."""
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    submitted_attempt(store, tid, "55_0.r0", "/jobs", "/jobs/55_0_0_log.out")
    attempts = tmp_path / "t" / "attempts"
    for key in ("55_0.r0", "55_0.r1", "55_0.r2", "56_0.r0"):
        w = EventWriter(attempts / key, "worker-r0")
        w.add("start", host="n")
        w.flush()
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        ingest_attempts(
            s, [(t, attempts / k) for k in sorted(p.name for p in attempts.iterdir())], utcnow()
        )
    with store.read() as s:
        rows = s.execute(
            select(Attempt.attempt_key, Attempt.submission_id, Attempt.log_path).order_by(
                Attempt.attempt_key
            )
        ).all()
    log = "/jobs/55_0_0_log.out"
    assert [tuple(r) for r in rows] == [
        ("55_0.r0", 1, log),
        ("55_0.r1", 1, log),
        ("55_0.r2", 1, log),
        ("56_0.r0", None, ""),
    ]


def test_ingest_rolls_back_whole_file_on_failure(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    adir = tmp_path / "t" / "attempts" / "9.r0"
    w = EventWriter(adir, "user-r0")
    w.add("metric", step=1, metrics={"val_loss": 1.0})
    w.flush()
    with pytest.raises(RuntimeError), store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        ingest_attempt(s, t, adir, utcnow())
        raise RuntimeError("killed mid-transaction")
    with store.read() as s:
        assert s.scalar(select(func.count()).select_from(Metric)) == 0
        assert s.scalar(select(func.count()).select_from(IngestedFile)) == 0
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        assert ingest_attempt(s, t, adir, utcnow()).metrics == 1


def test_temp_files_are_never_read(tmp_path: Path) -> None:
    adir = tmp_path / "a"
    adir.mkdir()
    (adir / ".user-r0-00000000.jsonl.x.tmp").write_text("{not json")
    from dlhpc.protocol import read_event_batches

    assert read_event_batches(adir) == []


def test_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path: Path) -> None:
    import socket

    store = Store(tmp_path)
    with store.write() as s:
        s.add(
            Lease(
                name="reconciler",
                owner=f"{socket.gethostname()}:{2**22 + 7}:deadbeef",  # above pid_max: never alive,
                acquired_at=utcnow(),
                expires_at=utcnow() + timedelta(hours=1),
            )
        )
    with store.hold_lease():
        assert store.holds_lease
    with store.write() as s:
        s.add(
            Lease(
                name="reconciler",
                owner="some-other-host:1:cafe",
                acquired_at=utcnow(),
                expires_at=utcnow() + timedelta(hours=1),
            )
        )
    with pytest.raises(LeaseHeldError), store.hold_lease():
        pass


def test_readers_work_while_a_writer_holds_its_transaction(tmp_path: Path) -> None:
    import threading

    store = Store(tmp_path)
    exp_and_trial(store, tmp_path)
    inside, release = threading.Event(), threading.Event()

    def writer() -> None:
        with store.write() as s:
            t = s.scalar(select(Trial))
            assert t is not None
            t.state = "COMPLETED"
            s.flush()  # the change is written to the DB file's pages, not yet committed
            inside.set()
            release.wait(10)

    th = threading.Thread(target=writer)
    th.start()
    assert inside.wait(10)
    reader = Store(tmp_path)  # another connection, as `dlhpc status` would open
    with reader.read() as s:
        assert s.scalar(select(Trial.state)) == "RUNNING"  # sees the last committed state
    release.set()
    th.join()
    with reader.read() as s:
        assert s.scalar(select(Trial.state)) == "COMPLETED"
