"""An experiment launched before job scripts ran the setup (its ``entry.sh`` runs the
site modules and ``environment.setup`` unconditionally, and it has no launch-env.json)
runs its setup once when the new code resubmits it, as a new experiment does."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from dlhpc.config.schema import ExperimentConfig
from dlhpc.orchestrator.request import job_request
from dlhpc.orchestrator.runfiles import entry_runs_setup, entry_script_text
from dlhpc.protocol import entry_script, launch_env_file
from tests.unit.test_job_setup import make_experiment, render, run_script

COUNT = "echo ran >> {count}"


def _old_entry_text(cfg: ExperimentConfig) -> str:
    """``entry.sh`` as dlhpc wrote it before the setup-before-Python change (dd26a0e^)."""
    lines = ["#!/bin/bash", "trap ':' TERM USR2 INT"]
    lines += ["", "# site modules", *cfg.site.modules]
    lines += ["", "# environment.setup", cfg.environment.setup.rstrip("\n")]
    lines += ["", "# entrypoint", cfg.entrypoint, ""]
    return "\n".join(lines)


@pytest.mark.parametrize("old", [True, False], ids=["launched-before", "launched-now"])
def test_a_resubmitted_experiment_runs_its_setup_once(tmp_path: Path, old: bool) -> None:
    count = tmp_path / "count"
    cfg = make_experiment(tmp_path, (COUNT.format(count=count),), "export FROM_SETUP=yes")
    cfg = ExperimentConfig(**{**cfg.__dict__, "entrypoint": "echo entrypoint-ran"})
    exp_dir = tmp_path / "exp"
    exp_dir.mkdir()
    text = _old_entry_text(cfg) if old else entry_script_text(cfg, 1)
    entry_script(exp_dir).write_text(text, encoding="utf-8")
    if not old:
        launch_env_file(exp_dir).write_text(json.dumps({"PATH": "/usr/bin:/bin"}))
    assert entry_runs_setup(exp_dir) is old
    dirs = [exp_dir / "trials" / f"trial-{i:06d}" for i in range(3)]
    req = job_request(cfg, 1, exp_dir, dirs, "abc")
    assert bool(req.setup) is not old
    # the job script (a fake srun prints the worker's environment), then entry.sh in it
    job = run_script(render(req), tmp_path)
    assert job.returncode == 0, job.stderr
    worker_env = dict(
        line.split("=", 1) for line in job.stdout.splitlines() if re.match(r"^\w+=", line)
    )
    entry = subprocess.run(
        ["bash", str(entry_script(exp_dir))],
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert entry.returncode == 0 and "entrypoint-ran" in entry.stdout, entry.stderr
    assert count.read_text().splitlines() == ["ran"]  # once, in the script or in entry.sh


def test_a_dry_run_has_no_entry_script_yet_and_gets_the_setup(tmp_path: Path) -> None:
    cfg = make_experiment(tmp_path, ("true",))
    assert not entry_runs_setup(tmp_path / "nothing")
    assert job_request(cfg, 1, tmp_path / "nothing", [tmp_path / "t"], "dryrun").setup
