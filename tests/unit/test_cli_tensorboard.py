"""``dlhpc tensorboard``: the export it runs and the lines it prints (CliRunner)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from dlhpc._perms import current_user
from dlhpc.cli import _tensorboard
from dlhpc.cli.main import cli
from dlhpc.store import Store
from tests.unit._tb import LOSS, add_points, assert_same_as_db, make_experiment


@pytest.fixture
def store(home: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("DLHPC_SITE", "local")
    monkeypatch.setenv("DLHPC_LOGIN_HOST", "login1.example.org")
    return Store(home)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["tensorboard", *args], catch_exceptions=False)


def test_one_experiment_prints_the_command_and_the_ssh_line(store: Store) -> None:
    exp_id, (t1,) = make_experiment(store, [{"lr": 0.1}])
    add_points(store, t1, "val_loss", LOSS)
    res = run(str(exp_id), "--port", "7007")
    assert res.exit_code == 0, res.output
    logdir = store.runs_root / "exp-000001-tb" / "tensorboard"
    assert res.output.splitlines() == [
        f"experiment {exp_id}: 3 new point(s) of 1 trial(s) in {logdir}",
        f"on the login node:  tensorboard --logdir {logdir} --port 7007",
        f"from your laptop:   ssh -N -L 7007:localhost:7007 {current_user()}@login1.example.org",
        "then open           http://localhost:7007",
    ]
    assert_same_as_db(store, [t1])
    again = run(str(exp_id), "--port", "7007")
    assert (
        again.output.splitlines()[0]
        == f"experiment {exp_id}: 0 new point(s) of 1 trial(s) in {logdir}"
    )


def test_without_an_experiment_every_one_is_exported_under_the_runs_folder(
    store: Store,
) -> None:
    a, (ta,) = make_experiment(store, [{"lr": 0.1}], folder="exp-000001-a")
    b, (tb1, tb2) = make_experiment(store, [{"lr": 0.1}, {"lr": 0.2}], folder="exp-000002-b")
    c, _ = make_experiment(store, [{"lr": 0.3}], folder="exp-000003-c", user="someone-else")
    for t in (ta, tb1, tb2):
        add_points(store, t, "val_loss", LOSS)
    res = run("--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["logdir"] == str(store.runs_root)
    assert out["command"] == f"tensorboard --logdir {store.runs_root} --port 6006"
    assert [(e["experiment_id"], e["trials"], e["points_written"]) for e in out["experiments"]] == [
        (a, 1, 3),
        (b, 2, 6),
    ]
    assert out["skipped"] == [
        f"experiment {c}: not exported, it is someone-else's (its files are as"
        " someone-else's last export left them)"
    ]
    assert not (store.runs_root / "exp-000003-c" / "tensorboard").exists()
    assert_same_as_db(store, [ta], "exp-000001-a")
    assert_same_as_db(store, [tb1, tb2], "exp-000002-b")


def test_the_host_is_this_machines_name_without_dlhpc_login_host(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DLHPC_LOGIN_HOST")
    exp_id, _ = make_experiment(store, [{"lr": 0.1}])
    out = json.loads(run(str(exp_id), "--json").output)
    assert out["ssh"] == f"ssh -N -L 6006:localhost:6006 {current_user()}@{socket.getfqdn()}"
    assert out["url"] == "http://localhost:6006"


def test_a_quoted_logdir_stays_one_argument(store: Store) -> None:
    exp_id, _ = make_experiment(store, [{"lr": 0.1}], folder="exp-000001-a b")
    out = json.loads(run(str(exp_id), "--json").output)
    assert (
        out["command"]
        == f"tensorboard --logdir '{store.runs_root}/exp-000001-a b/tensorboard' --port 6006"
    )


def test_run_replaces_the_process_with_tensorboard(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp_id, _ = make_experiment(store, [{"lr": 0.1}])
    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(_tensorboard.os, "execv", lambda path, argv: calls.append((path, argv)))
    res = run(str(exp_id), "--run", "--port", "6123")
    assert res.exit_code == 0, res.output
    logdir = str(store.runs_root / "exp-000001-tb" / "tensorboard")
    argv = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--port", "6123"]
    assert calls == [(sys.executable, argv)]
    # that command is TensorBoard's own entry point in this interpreter
    version = subprocess.run(
        [*argv[:3], "--version_tb"], capture_output=True, text=True, timeout=120
    )
    assert version.returncode == 0 and version.stdout.strip()[0].isdigit(), version


def test_bad_input_exits_2_and_writes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp_id, _ = make_experiment(store, [{"lr": 0.1}])
    res = CliRunner().invoke(cli, ["tensorboard", "99"])
    assert (res.exit_code, res.output) == (2, "error: no experiment 99\n")
    assert not (store.runs_root / "exp-000001-tb" / "tensorboard").exists()
    find_spec = importlib.util.find_spec

    def no_tensorboard(name: str, *args: Any) -> Any:
        return None if name == "tensorboard" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_tensorboard)
    res = CliRunner().invoke(cli, ["tensorboard", str(exp_id), "--run"])
    assert res.exit_code == 2
    assert "pip install 'dlhpc[tensorboard]'" in res.output
    assert not (store.runs_root / "exp-000001-tb" / "tensorboard").exists()
