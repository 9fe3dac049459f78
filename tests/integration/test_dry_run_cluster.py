"""``dlhpc launch --dry-run`` prints the sbatch script that the real launch submits.

Both build their request with ``dlhpc.orchestrator.request.job_request`` and the
Slurm backend renders the dry run with the code that writes the submitted script.
The one documented difference: the submission's unique id in the job name
(``dlhpc-e<exp>-<uid>``), drawn at submit time, which the dry run shows as
``dryrun`` (``DRY_RUN_UID``). Everything else (array size and throttle, resources, signal, log
paths, trial folders, the interpreter) must be byte for byte the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlhpc.orchestrator.request import DRY_RUN_UID
from dlhpc.protocol import experiment_dir_name
from tests.integration.conftest import Cli

pytestmark = pytest.mark.cluster

EXPERIMENT = """\
name: dry-run-check
entrypoint: python train.py
resources:
  cpus_per_task: 1
  mem: "500M"
  time: "00:05:00"
hyperparameters:
  x: {type: categorical, vals: [1, 2, 3]}
searcher:
  name: grid
  metric: loss
  max_length: 1
  max_concurrent_trials: 2
"""


def test_dry_run_script_is_the_script_sbatch_got(cli: Cli, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("raise SystemExit(0)\n")
    exp = work / "exp.yaml"
    exp.write_text(EXPERIMENT)

    dry = cli.json("launch", str(exp), "--dry-run")
    assert not cli.home.exists()  # a dry run writes nothing
    real = cli.json("launch", str(exp))
    try:
        assert real["experiment_id"] == dry["experiment_id"] == 1
        arrays = sorted({j.split("_")[0] for j in real["slurm_job_ids"]}, key=int)
        # two of the three grid points (max_concurrent_trials), in one array throttled to 2
        assert len(real["slurm_job_ids"]) == 2 and len(arrays) == len(dry["scripts"]) == 1
        # the script handed to sbatch is kept as <jobs>/<array id>_submission.sh
        jobs = cli.home / "runs" / experiment_dir_name(1, "dry-run-check") / "jobs"
        submitted = [(jobs / f"{a}_submission.sh").read_text(encoding="utf-8") for a in arrays]
        names = {m for s in submitted for m in re.findall(r"dlhpc-e1-[0-9a-f]{8}", s)}
        assert len(names) == 1, names  # one submission, one unique job name
        uid = names.pop().rsplit("-", 1)[1]
        dry_name = f"--job-name=dlhpc-e1-{DRY_RUN_UID}-dry-run-check\n"  # the name's slug
        assert all(dry_name in s for s in dry["scripts"])
        real_name = f"--job-name=dlhpc-e1-{uid}-dry-run-check\n"
        assert [s.replace(dry_name, real_name) for s in dry["scripts"]] == submitted
    finally:
        cli("kill", str(real["experiment_id"]), check=False)
