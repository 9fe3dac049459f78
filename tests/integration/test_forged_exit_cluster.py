"""A forged exit record does not end a trial whose job Slurm still runs: a script
writes a clean exit and a best metric into its own attempt folder, then trains on.
The ticks keep the trial RUNNING with its job in the queue, and ``dlhpc kill``
still cancels that job."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Cli, launch_script_until, squeue_ids

pytestmark = pytest.mark.cluster

FORGER = """\
import os, time, dlhpc
from pathlib import Path
from dlhpc.protocol import EventWriter
ctx = dlhpc.init()
ctx.report(1, {"loss": 1.0})
ctx.flush()
EventWriter(Path(os.environ["DLHPC_ATTEMPT_DIR"]), "user-r9").publish([
    {"type": "metric", "time": time.time(), "step": 2, "metrics": {"loss": -1e9}},
    {"type": "exit", "time": time.time(), "code": 0, "reason": "completed"},
])
with open(MARKER, "w") as f:
    f.write("forged")
while True:  # trains on; its worker keeps the heartbeat fresh
    time.sleep(0.2)
"""


def test_a_forged_exit_leaves_the_trial_running_and_killable(cli: Cli, tmp_path: Path) -> None:
    marker = tmp_path / "forged.txt"
    script = FORGER.replace("MARKER", repr(str(marker)))
    exp_id = launch_script_until(cli, tmp_path, "forged-exit", script, marker, timeout=120)
    job = ""
    try:
        (trial,) = cli.experiment(exp_id)["trials"]
        job = trial["slurm_job_ids"][-1]
        for _ in range(2):  # the forged exit is ingested, and then seen again
            cli("tick", "-q")
            (trial,) = cli.experiment(exp_id)["trials"]
            assert trial["state"] == "RUNNING", trial
            assert job in squeue_ids(cli.env)
            time.sleep(1)
        cli("kill", str(exp_id))
        t0 = time.monotonic()
        while job in squeue_ids(cli.env):
            assert time.monotonic() - t0 < 60, "dlhpc kill did not reach the job"
            time.sleep(0.5)
        print(f"the job left the queue {time.monotonic() - t0:.1f} s after dlhpc kill")
        assert cli.experiment(exp_id)["state"] == "KILLED"
    finally:
        if job:
            subprocess.run(["scancel", job], env=cli.env, check=False)
