"""A searcher and a backend defined only in the test tree run an experiment end to end.

``tests/plugins`` holds the test-only package ``dlhpc-testplugins`` (see its
README): its ``*.dist-info/entry_points.txt`` registers the searcher ``tpairs``
(group ``dlhpc.searchers``) and the scheduler backend ``toy`` (group
``dlhpc.schedulers``). With that folder on ``PYTHONPATH`` (installed, as far as
Python can tell), the ``dlhpc`` command runs in subprocesses: launch (dry run
and real) of a ``tpairs`` experiment on a ``toy`` site, tick until it ends (the
jobs are real processes that find their job environment through the entry
point), status, report, doctor, and simulate comparing ``tpairs`` with a
built-in on the experiment's own curves. Nothing under ``dlhpc/`` names either.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit._cli import TRAIN

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "plugins"
#: Every name of the plugins that dlhpc's own code would have to use to know them.
PLUGIN_NAMES = ("tpairs", "toy", "TOY_JOB", "dlhpc_testplugins", "PairsSearcher", "ToyScheduler")

EXP = """\
name: plugin-e2e
entrypoint: python train.py
hyperparameters:
  x: {type: double, minval: 0.1, maxval: 0.5}
searcher: {name: tpairs, metric: loss, max_trials: 4, max_length: 2}
"""


def dlhpc(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``dlhpc`` command (a new interpreter, as a user runs it); fails the test on an error."""
    out = subprocess.run(
        [sys.executable, "-m", "dlhpc", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, f"dlhpc {' '.join(args)}: {out.stdout}{out.stderr}"
    return out


def tick_until_over(exp_id: int, timeout: float = 120) -> dict[str, Any]:
    """``dlhpc tick`` until the experiment is no longer ACTIVE; its ``status --json``."""
    deadline = time.monotonic() + timeout
    while True:
        dlhpc("tick", "-q")
        exp: dict[str, Any] = json.loads(dlhpc("status", str(exp_id), "--json").stdout)[
            "experiments"
        ][0]
        if exp["state"] != "ACTIVE":
            return exp
        assert time.monotonic() < deadline, exp
        time.sleep(0.5)


@pytest.fixture
def installed(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The plugin package on ``PYTHONPATH`` (this tree's ``dlhpc`` after it), a ``toy``
    site, and an experiment folder using ``tpairs``; returns the experiment file."""
    path = [str(PLUGINS), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.delenv("DLHPC_SCHEDULERS", raising=False)  # the entry points alone
    site = tmp_path / "toy.yaml"
    site.write_text("name: toy\nbackend: toy\n")
    monkeypatch.setenv("DLHPC_SITE", str(site))
    work = tmp_path / "exp"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "exp.yaml").write_text(EXP)
    return work / "exp.yaml"


def test_no_file_under_dlhpc_names_the_plugins() -> None:
    pattern = [arg for name in PLUGIN_NAMES for arg in ("-e", name)]
    found = subprocess.run(
        ["grep", "-rIlw", "--exclude-dir=__pycache__", *pattern, str(REPO / "dlhpc")],
        capture_output=True,
        text=True,
    )
    assert found.returncode == 1 and found.stdout == "", found.stdout + found.stderr


def test_a_test_only_searcher_and_backend_run_an_experiment_end_to_end(
    installed: Path, home: Path, tmp_path: Path
) -> None:
    dry = dlhpc("launch", str(installed), "--dry-run")
    assert "export TOY_JOB=dlhpc-e1-dryrun" in dry.stdout, dry.stdout
    exp_id = json.loads(dlhpc("launch", str(installed), "--json").stdout)["experiment_id"]

    exp = tick_until_over(exp_id)
    trials = exp["trials"]
    assert exp["state"] == "COMPLETED", exp
    assert [t["state"] for t in trials] == ["COMPLETED"] * 2, trials  # max_trials // 2
    assert all(t["best_metric"] == pytest.approx(t["hparams"]["x"] / 2) for t in trials), trials
    with sqlite3.connect(home / "dlhpc.db") as db:
        searchers = db.execute("SELECT backend, config_json FROM experiments").fetchall()
        envs = [json.loads(e) for (e,) in db.execute("SELECT env_json FROM attempts")]
    assert [(b, json.loads(c)["searcher"]["name"]) for b, c in searchers] == [("toy", "tpairs")]
    # TOY_JOB is recorded only by the toy job environment: each job found it by its entry point
    assert len(envs) == 2 and all(e["env"]["TOY_JOB"].startswith("dlhpc-e1-") for e in envs)

    page = tmp_path / "report.html"
    dlhpc("report", str(exp_id), "-o", str(page))
    html = page.read_text()
    assert "tpairs" in html and all(f"{t['hparams']['x']:.4g}" in html for t in trials)

    doctor = json.loads(dlhpc("doctor", "--json").stdout)
    checks = {c["name"]: c["status"] for c in doctor["checks"]}
    assert checks["toy"] == "ok" and checks["slurm"] == "skip"

    sim = dlhpc(
        "simulate", str(installed), "--curves", f"experiment:{exp_id}",
        "--alternatives", "random", "--reps", "1", "--json",
    )  # fmt: skip
    result = json.loads(sim.stdout)
    label = f"recorded curves of experiment {exp_id} (2 trials, start-up "
    assert result["curves"].startswith(label), result
    assert [r["searcher"] for r in result["searchers"]] == ["tpairs", "random"], result
    ours = result["searchers"][0]
    assert [(r["state"], r["trials"]) for r in ours["runs"]] == [("COMPLETED", 2)], ours
