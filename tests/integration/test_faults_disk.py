"""The filesystem that holds the state database fills up: an experiment's own
checkpoints fill it, then another user's file takes what is left.

A small tmpfs (root only: mounting it) holds ``DLHPC_HOME`` and the checkpoint
folder; a trial's job is played by the test (event files and checkpoints written as
the harness writes them) on an in-process backend. Asserted: the checkpoint that
could not be written replaces no good one; the tick that cannot commit records and
submits nothing, says why in one line, and frees the superseded checkpoints; the
next tick then commits, and every result is ingested exactly once.
"""

from __future__ import annotations

import errno
import importlib
import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlhpc.cli._doctor import checkpoint_space_check
from dlhpc.cli.main import cli
from dlhpc.config import load_experiment
from dlhpc.errors import StoreError
from dlhpc.orchestrator import TickReport, tick
from dlhpc.orchestrator.disk_space import shared_small_filesystem
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.protocol import EventWriter
from dlhpc.protocol.checkpoint import latest_verified, list_checkpoints, publish_checkpoint
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.search import SearcherTable
from dlhpc.store import Store
from tests.unit.test_site_limits import Limited

tick_module = importlib.import_module("dlhpc.orchestrator.tick")  # the module, not the function
checkpoints_module = importlib.import_module("dlhpc.orchestrator.checkpoints")

MIB = 1 << 20
CKPT_BYTES = 300 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs, unmounted afterwards."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Write ``path`` until the filesystem is full (unbuffered: each write reaches it)."""
    with pytest.raises(OSError) as full, path.open("wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC


def _payload(folder: Path) -> None:
    (folder / "w.bin").write_bytes(b"\1" * CKPT_BYTES)


def _counts(db: Path) -> tuple[int, int, int, str]:
    with sqlite3.connect(db) as con:
        metrics = con.execute("SELECT count(*) FROM metrics").fetchone()[0]
        files = con.execute("SELECT count(*) FROM ingested_files").fetchone()[0]
        subs = con.execute("SELECT count(*) FROM submissions").fetchone()[0]
        ok = con.execute("PRAGMA integrity_check").fetchone()[0]
    return metrics, files, subs, ok


def _launched(tmp_path: Path, fs: Path) -> tuple[Store, SchedulerPool, Limited, Path]:
    """One trial launched on an in-process backend, ``DLHPC_HOME`` and the checkpoint
    folder on ``fs`` (keep only each trial's newest checkpoint); its trial folder."""
    (tmp_path / "train.py").write_text("")
    yaml = tmp_path / "exp.yaml"
    yaml.write_text(_yaml(fs))
    store = Store(fs / "home")
    backend = Limited()
    pool = SchedulerPool(
        local_root=tmp_path / "local", backends=BackendTable([Backend("local", lambda _r: backend)])
    )
    launch(load_experiment(yaml, site="local", searchers=SearcherTable()), store, pool, record={})
    (trial_dir,) = store.runs_root.glob("*/trials/trial-*")
    return store, pool, backend, trial_dir


def _yaml(fs: Path) -> str:
    return (
        "name: full\nentrypoint: python train.py\n"
        'resources: {cpus_per_task: 1, mem: "1G", time: "01:00:00"}\n'
        "searcher: {name: single, metric: loss, max_length: 40}\n"
        f"checkpoint: {{dir: {fs / 'ckpt'}, keep_best: 0, keep_latest: 1}}\n"
    )


@pytest.mark.needs("root")
def test_full_database_disk_frees_superseded_checkpoints_and_ingests_once(
    small_fs: Path, tmp_path: Path
) -> None:
    store, pool, backend, trial_dir = _launched(tmp_path, small_fs)
    own = Path(json.loads((trial_dir / "trial.json").read_text())["checkpoint_dir"])
    writer = EventWriter(trial_dir / "attempts" / "40_0.r0", "user-r0")

    # the job: a metric and a checkpoint per epoch, until a checkpoint does not fit
    good = 0
    with pytest.raises(OSError) as full:
        for epoch in range(1, 40):
            ck = publish_checkpoint(own, epoch, _payload)
            writer.add("metric", step=epoch, metrics={"loss": 1.0 / epoch})
            writer.add(
                "checkpoint", step=epoch, path=str(ck.path), size=CKPT_BYTES, metric=1.0 / epoch
            )
            writer.flush()
            good = epoch
    assert full.value.errno == errno.ENOSPC and good >= 4
    newest, torn = latest_verified(own)
    assert newest is not None and newest.step == good and not torn  # it replaced no good one
    assert sorted(c.step for c in list_checkpoints(own)) == list(range(1, good + 1))
    assert not [p for p in own.iterdir() if p.name.startswith(".tmp")]
    _fill(small_fs / "someone-elses-file")  # and what is left goes to another user
    before = _counts(store.db_path)

    stalled = tick(store, pool)
    assert stalled.stalled is not None and "\n" not in stalled.stalled
    assert "database or disk is full" in stalled.stalled and "nothing recorded" in stalled.stalled
    assert _counts(store.db_path) == before and len(backend.submitted) == 1
    assert stalled.checkpoint_bytes_freed >= (good - 1) * CKPT_BYTES
    assert [c.step for c in list_checkpoints(own)] == [good]  # the newest stays

    recovered = tick(store, pool)  # the space dlhpc freed is enough to commit
    assert recovered.stalled is None, recovered.stalled
    metrics, files, subs, ok = _counts(store.db_path)
    assert (metrics, files, subs, ok) == (good, good, 1, "ok")
    with sqlite3.connect(store.db_path) as con:
        rows = con.execute("SELECT step, state FROM checkpoints ORDER BY step").fetchall()
    assert rows == [(s, "DELETED") for s in range(1, good)] + [(good, "ACTIVE")]

    again = tick(store, pool)
    assert (again.stalled, again.ingested_files) == (None, 0)
    assert _counts(store.db_path) == (good, good, 1, "ok")  # exactly once
    store.close()


def _full() -> StoreError:
    """The error a commit on a full disk raises, as the store wraps it."""
    try:
        raise sqlite3.OperationalError("database or disk is full")
    except sqlite3.OperationalError as err:
        wrapped = StoreError(f"state database dlhpc.db: {err}")
        wrapped.__cause__ = err
        return wrapped


@pytest.mark.parametrize("where", ["decide", "keep policy"])
def test_a_pass_that_cannot_commit_midway_stops_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """An experiment's step that hits the full disk stops the pass (the next experiments
    would hit it too): it is not one experiment's error the pass goes on past."""
    store, pool, _backend, _trial_dir = _launched(tmp_path, tmp_path)

    def full(*_args: object, **_kw: object) -> None:
        raise _full()

    if where == "decide":
        monkeypatch.setattr(tick_module, "reconcile_experiment", full)
    else:
        monkeypatch.setattr(checkpoints_module, "gc", full)
    report = tick(store, pool)
    assert report.stalled is not None and "database or disk is full" in report.stalled
    assert not [e for e in report.errors if "full" in e]  # the one line says it
    store.close()


@pytest.mark.needs("root")
def test_doctor_and_launch_warn_when_checkpoints_share_a_small_database_disk(
    small_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, ckpt = small_fs / "home", small_fs / "ckpt"
    warning = shared_small_filesystem(home, ckpt)
    assert warning is not None and "3 MiB" in warning and str(ckpt) in warning
    assert shared_small_filesystem(home, ckpt, small=1 << 20) is None  # not small
    assert shared_small_filesystem(home, tmp_path / "ckpt") is None  # not shared
    assert checkpoint_space_check(home, ckpt).status == "warn"
    assert checkpoint_space_check(home, tmp_path / "ckpt").status == "ok"
    (tmp_path / "train.py").write_text("")
    (tmp_path / "exp.yaml").write_text(_yaml(small_fs))
    monkeypatch.setenv("DLHPC_HOME", str(home))
    result = CliRunner().invoke(
        cli, ["launch", str(tmp_path / "exp.yaml"), "--site", "local", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert f"warning: the checkpoint folder {ckpt} is on the state database's" in result.stderr


def test_tick_command_says_why_in_one_line_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    why = "state database dlhpc.db: database or disk is full; nothing recorded"

    def stalled(*_args: object) -> TickReport:
        return TickReport(stalled=why, errors=["not printed: the pass stopped"])

    monkeypatch.setattr(importlib.import_module("dlhpc.cli._tick"), "do_tick", stalled)
    monkeypatch.setenv("DLHPC_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(cli, ["tick", "--site", "local"])
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"error: {why}\n")
