"""Shared-filesystem behaviour of the state folder: files that show up late,
renames that report failure although they happened (NFS), temp files, and what
``dlhpc doctor`` says about where the DB lives."""

from __future__ import annotations

import errno
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from dlhpc import _perms
from dlhpc.cli import _doctor
from dlhpc.config.schema import SiteConfig
from dlhpc.orchestrator import tick
from dlhpc.protocol import EventWriter, read_event_batches
from dlhpc.protocol.checkpoint import latest_verified, publish_checkpoint
from dlhpc.store import IngestedFile, Metric, Store, Trial
from dlhpc.store.ingest import SETTLE_WINDOW
from tests._clock import LaterClock
from tests.stress._backend import StressBackend, launch_stress, stress_pool
from tests.unit._cli import run

_real_replace = os.replace


def _replace_then_fail(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """An NFS rename whose reply was lost: the retransmit answers ESTALE, yet it happened."""
    _real_replace(src, dst)
    raise OSError(errno.ESTALE, "Stale file handle")


def _fail_without_renaming(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    raise OSError(errno.EIO, "Input/output error")


def _visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- the writer side: event files ------------------------------------------------


def test_event_rename_that_fails_but_happened_is_published_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = EventWriter(tmp_path / "a", "user-r0")
    w.add("metric", step=1, metrics={"loss": 1.0})
    monkeypatch.setattr(os, "replace", _replace_then_fail)
    first = w.flush()
    w.add("metric", step=2, metrics={"loss": 0.5})
    second = w.flush()
    monkeypatch.undo()
    assert first is not None and second is not None and first != second
    assert _visible(tmp_path / "a") == ["user-r0-00000000.jsonl", "user-r0-00000001.jsonl"]
    steps = [r["step"] for b in read_event_batches(tmp_path / "a") for r in b.records]
    assert steps == [1, 2]  # each record once, under one name


def test_event_rename_that_really_failed_is_retried_under_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = EventWriter(tmp_path / "a", "user-r0")
    w.add("metric", step=1, metrics={"loss": 1.0})
    monkeypatch.setattr(os, "replace", _fail_without_renaming)
    with pytest.raises(OSError, match="Input/output"):
        w.flush()
    monkeypatch.undo()
    assert _visible(tmp_path / "a") == []  # the temp file is gone, nothing published
    assert w.flush() == tmp_path / "a" / "user-r0-00000000.jsonl"
    assert [r["step"] for b in read_event_batches(tmp_path / "a") for r in b.records] == [1]


def test_rename_error_with_other_content_at_the_target_is_not_a_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error is swallowed only when the target holds exactly what was written."""

    def someone_else_wrote(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        Path(dst).write_text("other\n")
        os.unlink(src)
        raise OSError(errno.ENOENT, "No such file or directory")

    w = EventWriter(tmp_path / "a", "user-r0")
    w.add("metric", step=1, metrics={"loss": 1.0})
    monkeypatch.setattr(os, "replace", someone_else_wrote)
    with pytest.raises(OSError):
        w.flush()
    assert w.pending() == 1  # kept for a retry


# --- the writer side: checkpoint folders and manifests ---------------------------


def _payload(folder: Path) -> None:
    (folder / "w.bin").write_bytes(b"x" * 1000)


def test_checkpoint_renames_that_fail_but_happened_publish_one_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "replace", _replace_then_fail)  # the folder and the manifest
    ckpt = publish_checkpoint(tmp_path, 7, _payload)
    monkeypatch.undo()
    assert _visible(tmp_path) == ["ckpt-0000000007"]  # no temp folder, no second name
    newest, torn = latest_verified(tmp_path)
    assert newest is not None and newest.path == ckpt.path and torn == []


def test_checkpoint_folder_rename_that_really_failed_leaves_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = publish_checkpoint(tmp_path, 1, _payload)
    monkeypatch.setattr(os, "replace", _fail_without_renaming)
    with pytest.raises(OSError, match="Input/output"):
        publish_checkpoint(tmp_path, 2, _payload)
    monkeypatch.undo()
    assert _visible(tmp_path) == ["ckpt-0000000001"]
    assert latest_verified(tmp_path)[0] == first


# --- the reader side -----------------------------------------------------------


def test_reader_never_reads_temp_files(tmp_path: Path) -> None:
    a = tmp_path / "a"
    w = EventWriter(a, "user-r0")
    w.add("metric", step=1, metrics={"loss": 1.0})
    w.flush()
    for junk in (
        ".user-r0-00000001.jsonl.k2j3h4.tmp",  # atomic_write_bytes' temp name
        "user-r0-00000002.jsonl.tmp",
        ".user-r0-00000003.jsonl",
        "user-r0-00000004.jsonl~",
    ):
        (a / junk).write_text("{not json\n")  # would raise if it were parsed
    assert [b.name for b in read_event_batches(a)] == ["user-r0-00000000.jsonl"]


# --- files that show up late ---------------------------------------------------


def test_files_showing_up_after_the_trial_ended_are_ingested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metric file that the listing shows only after the exit record was seen and the
    trial (and its experiment) ended is ingested by a later tick within SETTLE_WINDOW
    (by its owner's tick only); one that shows up after the window is not looked for
    any more."""
    home, (trial_run,) = launch_stress(tmp_path, 1)
    store = Store(home)
    pool = stress_pool(home)
    user = EventWriter(trial_run.attempt_dir, "user-r0")
    user.add("metric", step=1, metrics={"loss": 3.0})
    user.flush()
    worker = EventWriter(trial_run.attempt_dir, "worker-r0")
    worker.add("exit", code=0, reason="completed", signal=None, step=1, checkpoint_step=None)
    worker.flush()
    backend = pool.get("stress")
    assert isinstance(backend, StressBackend)
    backend.ended.add(trial_run.attempt_dir.name.rsplit(".r", 1)[0])  # the job ended too
    try:
        assert tick(store, pool).finished == [1]  # trial COMPLETED, experiment COMPLETED
        with store.read() as s:
            assert s.scalars(select(Trial.state)).all() == ["COMPLETED"]
        user.add("metric", step=2, metrics={"loss": 2.0})  # late: the listing lagged
        user.flush()
        report = tick(store, pool)
        assert report.ingested_files == 1 and report.metrics == 1
        with store.read() as s:
            assert s.scalars(select(Metric.step).order_by(Metric.step)).all() == [1, 2]
            assert s.scalars(select(Trial.best_metric)).all() == [2.0]
        user.add("metric", step=3, metrics={"loss": 1.0})
        user.flush()
        with monkeypatch.context() as m:  # another user's tick leaves settling trials alone
            m.setattr(_perms, "current_user", lambda: "someone-else")
            assert tick(store, pool).ingested_files == 0
        late = tick(store, pool, LaterClock(SETTLE_WINDOW + timedelta(seconds=5)))
        assert late.ingested_files == 0  # the window is bounded: ended trials are not listed
        with store.read() as s:
            assert len(s.scalars(select(IngestedFile.name)).all()) == 3
    finally:
        store.close()


# --- dlhpc doctor: where the DB should live --------------------------------------

_MOUNTS = """\
/dev/vda1 / ext4 rw,relatime 0 0
srv:/home /home nfs4 rw,relatime,vers=4.2,hard,proto=tcp,local_lock=none 0 0
srv:/old /home/old nfs rw,vers=3,nolock 0 0
srv:/grp /home/grp\\040lab nfs rw,vers=3,local_lock=posix 0 0
mgs@tcp:/fs /lustre lustre rw,flock,lazystatfs 0 0
mgs@tcp:/fs2 /scratch lustre rw,localflock 0 0
mgs@tcp:/fs3 /work lustre rw,lazystatfs 0 0
"""


def test_mount_table_parsing_and_lookup() -> None:
    mounts = _doctor.read_mounts(_MOUNTS)
    assert [m.point for m in mounts][3] == "/home/grp lab"  # \\040 is a space
    assert _doctor.mount_of(Path("/home/me/.dlhpc"), mounts).point == "/home"  # type: ignore[union-attr]
    assert _doctor.mount_of(Path("/home/old/x"), mounts).point == "/home/old"  # type: ignore[union-attr]
    assert _doctor.mount_of(Path("/homework"), mounts).point == "/"  # type: ignore[union-attr]
    problems = {m.point: _doctor.lock_problem(m) for m in mounts}
    assert problems["/home"] is None and problems["/lustre"] is None
    assert "nolock" in str(problems["/home/old"]) and "local_lock" in str(problems["/home/grp lab"])
    assert "localflock" in str(problems["/scratch"]) and "without 'flock'" in str(problems["/work"])


@pytest.mark.parametrize(
    ("home", "journal", "status", "words"),
    [
        ("/home/me/.dlhpc", "delete", "ok", ["nfs4", "lease", "never open it from a compute node"]),
        ("/home/old/me", "delete", "warn", ["nolock", "on one login node"]),
        ("/scratch/me", "delete", "warn", ["localflock", "on one login node"]),
        ("/work/me", "delete", "warn", ["without 'flock'"]),
        ("/home/me/.dlhpc", "wal", "fail", ["journal_mode: delete"]),
        ("/var/dlhpc", "delete", "ok", ["ext4", "not a network filesystem"]),
    ],
)
def test_database_filesystem_advice(home: str, journal: str, status: str, words: list[str]) -> None:
    check = _doctor.db_filesystem_check(Path(home), journal, _doctor.read_mounts(_MOUNTS))
    assert check.status == status, check.detail
    assert all(w in check.detail for w in words), check.detail


def test_database_on_nfs_without_a_mount_table_is_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_doctor, "fs_type", lambda _path: "nfs")  # `stat -f` says nfs
    check = _doctor.db_filesystem_check(Path("/somewhere"), "delete", [])
    assert check.status == "warn" and "mount options are unknown" in check.detail


def test_run_folders_must_be_seen_by_compute_nodes(tmp_path: Path) -> None:
    mounts = _doctor.read_mounts(_MOUNTS)
    site = SiteConfig("s", None, backend="slurm", scratch=Path("/lustre/me"))
    on_local = _doctor.shared_folder_checks(site, Path("/var/dlhpc"), mounts, slurm=True)
    assert [(c.name, c.status) for c in on_local] == [
        ("run folders filesystem", "warn"),
        ("checkpoint folder filesystem", "ok"),
    ]
    assert "state_dir" in on_local[0].detail
    shared = _doctor.shared_folder_checks(site, Path("/home/me/.dlhpc"), mounts, slurm=True)
    assert {c.status for c in shared} == {"ok"}
    local = _doctor.shared_folder_checks(site, Path("/var/dlhpc"), mounts, slurm=False)
    assert {c.status for c in local} == {"ok"}


def test_doctor_reports_the_real_filesystems(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")
    res = run("doctor", "--json")
    assert res.exit_code == 0, res.output
    checks = {c["name"]: c for c in json.loads(res.output)["checks"]}
    real = _doctor.mount_of(home, _doctor.read_mounts())
    assert real is not None  # this machine has /proc/mounts
    assert f"is on {real.fstype}" in checks["database filesystem"]["detail"]
    assert checks["run folders filesystem"]["status"] == "ok"  # the local backend
