"""Strict and accounting-free dev clusters: limits respected, no sacct needed.

``scripts/dev-cluster up --profile strict`` gives the unprivileged ``dlhpc-user`` the
QOS ``dlhpc-qos`` (MaxSubmitJobsPerUser=8, MaxJobsPerUser=4, MaxWall=02:00:00);
``--profile noacct`` runs no slurmdbd, so ``sacct`` fails. Each test runs only on its
profile (``DLHPC_DEV_PROFILE``, set by ``scripts/dev-cluster env``) and skips elsewhere.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import time
from pathlib import Path

import pytest

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration.conftest import POLL_S, REPO, Cli

pytestmark = pytest.mark.cluster

PROFILE = os.environ.get("DLHPC_DEV_PROFILE", "default")
GRID = REPO / "templates" / "examples" / "digits" / "grid.yaml"
MAX_SUBMIT = 8  # the strict profile's MaxSubmitJobsPerUser

strict_only = pytest.mark.profile("strict")
noacct_only = pytest.mark.profile("noacct")

TRAIN = """\
import time

import dlhpc

ctx = dlhpc.init()
time.sleep(3)
ctx.report(1, {"loss": float(ctx.hparams["x"])})
ctx.close()
"""

EXPERIMENT = """\
name: limits-{n}
entrypoint: python train.py
resources: {{cpus_per_task: 1, mem: "256M", time: "{time}"}}
hyperparameters:
  x: {{type: int, minval: 1, maxval: {n}, count: {n}}}
searcher: {{name: grid, metric: loss, max_length: 1}}
"""


def _experiment(tmp_path: Path, n: int, time_limit: str = "00:10:00") -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    path = tmp_path / f"limits-{n}.yaml"
    path.write_text(EXPERIMENT.format(n=n, time=time_limit))
    return path


def _held(cli: Cli) -> int:
    """The user's tasks Slurm holds now (queued, running, completing), array tasks each."""
    out = subprocess.run(
        ["squeue", "-h", "-r", f"--user={getpass.getuser()}", "-o", "%i"],
        env=cli.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return len(out.split())


@strict_only
def test_more_trials_than_max_submit_never_hold_more_than_it(cli: Cli, tmp_path: Path) -> None:
    n = 14
    launched = cli.json("launch", str(_experiment(tmp_path, n)))
    exp_id = launched["experiment_id"]
    assert 0 < len(launched["slurm_job_ids"]) <= MAX_SUBMIT
    assert _held(cli) <= MAX_SUBMIT
    deadline = time.monotonic() + 600
    while True:
        cli("tick", "-q")
        assert _held(cli) <= MAX_SUBMIT  # checked after every tick
        exp = cli.experiment(exp_id)
        if exp["state"] in TERMINAL:
            break
        assert time.monotonic() < deadline, exp
        time.sleep(POLL_S)
    assert exp["state"] == "COMPLETED", exp
    assert [t["state"] for t in exp["trials"]] == ["COMPLETED"] * n
    assert all(t["restarts"] == 0 and t["crashes"] == 0 for t in exp["trials"])
    assert cli.events("submit.waiting")  # the rest waited for slots, said so
    assert not cli.events("submit.error")


@strict_only
def test_time_above_the_qos_max_wall_is_a_config_error(cli: Cli, tmp_path: Path) -> None:
    proc = cli("launch", str(_experiment(tmp_path, 2, "03:00:00")), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "resources.time" in proc.stderr and "MaxWall 02:00:00" in proc.stderr
    assert not (cli.home / "dlhpc.db").exists() or not cli.events("submit")


@strict_only
def test_doctor_shows_the_strict_limits(cli: Cli) -> None:
    checks = {c["name"]: c for c in cli.json("doctor")["checks"]}
    line = checks["site limits"]
    assert line["status"] == "ok" and f"MaxSubmitJobs {MAX_SUBMIT}" in line["detail"], line
    assert "MaxJobs 4" in line["detail"] and "MaxWall 02:00:00" in line["detail"]


@noacct_only
def test_grid_runs_to_completion_without_accounting(cli: Cli) -> None:
    assert subprocess.run(["sacct", "-n"], env=cli.env, capture_output=True).returncode != 0
    exp_id = cli.json("launch", str(GRID))["experiment_id"]
    exp = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL)
    assert exp["state"] == "COMPLETED", exp
    assert [t["state"] for t in exp["trials"]] == ["COMPLETED"] * 4
    assert all(t["restarts"] == 0 for t in exp["trials"])
    (told,) = cli.events("scheduler.no_accounting")  # recorded once, not every tick
    assert "sacct" in told
    doctor = {c["name"]: c for c in cli.json("doctor")["checks"]}
    assert doctor["accounting (sacct)"]["status"] == "warn"
