"""A trial's log on the real dev cluster after a self-requeue at the time limit: the
planned exit leaves no traceback and no srun error; a real failure still shows both."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration._reference import PLANNED_EXIT_NOISE, logs_of
from tests.integration.conftest import Cli

pytestmark = pytest.mark.cluster

# Steps counted in the trial's working folder (every attempt's cwd), so the requeued run
# goes on where the first stopped; MARKER appears once a step is done.
TRAIN = """\
import pathlib, time, dlhpc
ctx = dlhpc.init()
if ctx.hparams["fail"]:
    raise RuntimeError("a real failure")
done = pathlib.Path("steps")
start = int(done.read_text()) if done.exists() else 0
for step in range(start + 1, 21):
    time.sleep(0.1)
    ctx.report(step, {"m": float(step)})
    done.write_text(str(step))
    pathlib.Path(MARKER).touch()
    ctx.step()
"""


def _launch(cli: Cli, tmp_path: Path, marker: Path) -> int:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN.replace("MARKER", repr(str(marker))))
    exp = tmp_path / "usr2.yaml"
    exp.write_text(
        f"name: usr2-logs\nentrypoint: python train.py\nworkdir: {code}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        "hyperparameters:\n  fail: {type: categorical, vals: [false, true]}\n"
        "searcher: {name: grid, metric: m, smaller_is_better: false, max_length: 20}\n"
        "max_restarts: 0\n"
    )
    return int(cli.json("launch", str(exp))["experiment_id"])


def _fails(trial: dict[str, Any]) -> bool:
    hparams = trial["hparams"]
    return bool((json.loads(hparams) if isinstance(hparams, str) else hparams)["fail"])


def test_a_usr2_self_requeue_leaves_a_quiet_log_and_a_failure_a_loud_one(
    cli: Cli, tmp_path: Path
) -> None:
    """USR2 (the time-limit signal, sent as slurmctld sends it: to the job's steps) makes
    the trial checkpoint and exit 75; the job script requeues it once the step has ended,
    Slurm runs it again under its own id, and it completes. The log of that job (both
    runs) has no traceback and no srun error. The failing trial's log has both."""
    marker = tmp_path / "stepped"
    exp_id = _launch(cli, tmp_path, marker)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline, json.dumps(cli.experiment(exp_id), indent=1)
        time.sleep(0.2)
    trials = {_fails(t): t for t in cli.experiment(exp_id)["trials"]}
    job = trials[False]["slurm_job_ids"][-1]
    subprocess.run(["scancel", "--signal=USR2", job], env=cli.env, check=True)
    done = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL, timeout=120)
    by_fail = {_fails(t): t for t in done["trials"]}
    requeued, failed = by_fail[False], by_fail[True]
    first, *rest = requeued["attempts"]
    assert (first["key"], first["exit_code"]) == (f"{job}.r0", 75), requeued["attempts"]
    assert [a["key"] for a in rest] == [f"{job}.r1"], requeued["attempts"]  # Slurm's requeue
    assert requeued["state"] == "COMPLETED" and requeued["steps_completed"] == 20, requeued
    _, err = logs_of(cli, requeued["id"], first["key"])
    assert not [x for x in PLANNED_EXIT_NOISE if x in err] and "srun:" not in err, err
    assert failed["state"] == "FAILED", failed
    _, err = logs_of(cli, failed["id"])
    assert "RuntimeError: a real failure" in err and "Traceback" in err, err
    assert "srun: error" in err, err
