"""A trial whose script never polls ends promptly when it is cancelled on the
real dev cluster, instead of at Slurm's KillWait (30 s on the dev cluster)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from dlhpc.protocol import read_event_batches
from tests.integration.conftest import Cli, launch_script_until, squeue_ids

pytestmark = pytest.mark.cluster

KILL_WAIT_S = 30  # the dev cluster's KillWait: when Slurm would SIGKILL a script that stays

NON_POLLING = """\
import os, time, dlhpc
ctx = dlhpc.init()
ctx.report(1, {"loss": 1.0})
ctx.flush()
with open(MARKER, "w") as f:
    f.write(os.environ["DLHPC_ATTEMPT_DIR"])
while True:  # trains without ever calling ctx.step() or ctx.should_stop()
    time.sleep(0.05)
"""


def test_a_cancelled_trial_that_never_polls_ends_before_kill_wait(cli: Cli, tmp_path: Path) -> None:
    marker = tmp_path / "attempt.txt"
    script = NON_POLLING.replace("MARKER", repr(str(marker)))
    exp_id = launch_script_until(cli, tmp_path, "nopoll", script, marker, timeout=180)
    job = ""
    try:
        job = cli.experiment(exp_id)["trials"][0]["slurm_job_ids"][-1]
        t0 = time.monotonic()
        subprocess.run(["scancel", job], env=cli.env, check=True)  # TERM, KILL after KillWait
        while job in squeue_ids(cli.env):
            assert time.monotonic() - t0 < KILL_WAIT_S + 30, "the job never ended"
            time.sleep(0.2)
        ended_s = time.monotonic() - t0
    finally:
        if job:
            subprocess.run(["scancel", job], env=cli.env, check=False)
    print(f"the job ended {ended_s:.1f} s after the cancel")
    assert ended_s < KILL_WAIT_S * 2 / 3, f"ended {ended_s:.1f} s after the cancel"
    records = [r for b in read_event_batches(Path(marker.read_text())) for r in b.records]
    exit_rec = next(r for r in records if r["type"] == "exit")
    assert (exit_rec["code"], exit_rec["reason"], exit_rec["signal"]) == (75, "requeue", "TERM")
    logs = [r["message"] for r in records if r["type"] == "log"]
    assert any("received TERM and the script did not poll within 5s" in m for m in logs), logs
    assert [r["step"] for r in records if r["type"] == "metric"] == [1]
