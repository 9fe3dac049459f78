"""A backend defined only in the test tree runs an experiment end to end through the CLI:
launch (dry run and real), tick, status, report, doctor; its job environment is found
inside the job. Nothing under ``dlhpc/`` names it (see ``tests/unit/_toy_backend.py``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.unit._cli import TRAIN, run, until_over

REPO = Path(__file__).resolve().parents[2]


def test_a_test_only_backend_runs_an_experiment_end_to_end(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLHPC_SCHEDULERS", "toy=tests.unit._toy_backend:BACKEND")
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the jobs import the toy module too
    site = tmp_path / "toy.yaml"
    site.write_text("name: toy\nbackend: toy\n")
    monkeypatch.setenv("DLHPC_SITE", str(site))
    work = tmp_path / "exp"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "exp.yaml").write_text(
        "name: toy-grid\nentrypoint: python train.py\n"
        "hyperparameters:\n  x: {type: double, minval: 0.1, maxval: 0.5, count: 2}\n"
        "searcher: {name: grid, metric: loss, max_length: 2}\n"
    )
    dry = run("launch", str(work / "exp.yaml"), "--dry-run")
    assert dry.exit_code == 0 and "export TOY_JOB=dlhpc-e1-dryrun" in dry.output, dry.output
    res = run("launch", str(work / "exp.yaml"), "--json")
    assert res.exit_code == 0, res.output
    exp_id = json.loads(res.output)["experiment_id"]
    exp = until_over(exp_id)
    assert exp["state"] == "COMPLETED" and [t["state"] for t in exp["trials"]] == ["COMPLETED"] * 2
    with sqlite3.connect(home / "dlhpc.db") as db:
        backends = db.execute("SELECT backend FROM experiments").fetchall()
        envs = [json.loads(e) for (e,) in db.execute("SELECT env_json FROM attempts")]
    assert backends == [("toy",)]
    assert len(envs) == 2 and all(e["env"]["TOY_JOB"].startswith("dlhpc-e1-") for e in envs)
    page = tmp_path / "report.html"
    assert run("report", str(exp_id), "-o", str(page)).exit_code == 0 and page.is_file()
    doctor = run("doctor", "--json")
    checks = {c["name"]: c["status"] for c in json.loads(doctor.output)["checks"]}
    assert checks["toy"] == "ok" and checks["slurm"] == "skip"
