"""Slurm's daemons stop, and a node is lost, mid-experiment on the dev cluster.

Two trials of a plain script (an epoch line every few seconds, a checkpoint file per
epoch, no framework: they start in a second) run while the test stops a daemon
through its pid file and ticks on: ``slurmctld`` stopped (SIGTERM) for two ticks
with the jobs running (slurmstepd keeps them), then started again; ``slurmdbd``
stopped while the jobs end, then started again. Asserted: each tick in between exits
0 and says what failed in one line; no trial is marked FAILED or restarted; nothing
is submitted twice; every trial ends COMPLETED with its epochs, its cause
``completed`` also once accounting is back. A node set DOWN with the jobs on it:
see :func:`test_node_lost_with_its_jobs`."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration._reference import logs_of
from tests.integration.chaos_cluster import cluster_healthy, restore_cluster, stop_daemon
from tests.integration.conftest import Cli, squeue_ids

pytestmark = [pytest.mark.cluster, pytest.mark.needs("root", "accounting")]

SCRIPT = """\
import os, sys, time
epochs, pause, ckpt, resume = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
start = int(open(resume).read()) if resume else 0
print(f"resumed at epoch {start}" if start else "first run", flush=True)
for epoch in range(start + 1, epochs + 1):
    time.sleep(pause)
    with open(os.path.join(ckpt, f".epoch-{epoch}"), "w") as f:
        f.write(str(epoch))
    os.replace(os.path.join(ckpt, f".epoch-{epoch}"), os.path.join(ckpt, f"epoch-{epoch}"))
    print(f"epoch {epoch} loss={1.0 / epoch}", flush=True)
"""


def _launch(cli: Cli, tmp_path: Path, name: str, epochs: int, pause: float) -> int:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(SCRIPT)
    exp = tmp_path / f"{name}.yaml"
    exp.write_text(
        f"name: {name}\n"
        "entrypoint: python train.py {max_length} {pause} {checkpoint_dir} {checkpoint}\n"
        f"workdir: {code}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        f"hyperparameters: {{pause: {pause}, x: {{type: categorical, vals: [1, 2]}}}}\n"
        f"searcher: {{name: grid, metric: loss, max_length: {epochs}}}\n"
        "script: {metrics: {pattern: 'epoch (?P<step>\\d+) loss=(?P<loss>\\S+)'}}\n"
        "max_restarts: 2\n"
    )
    return int(cli.json("launch", str(exp))["experiment_id"])


def _wait(cli: Cli, exp_id: int, ok: Any, timeout: float = 180) -> dict[str, Any]:
    """Tick until ``ok`` of the experiment's status, every half second (the bound is
    sized for a loaded 2-core machine, where a tick after a daemon's restart is slow)."""
    return cli.tick_until(exp_id, ok, timeout=timeout, poll_s=0.5)


def _soft_ticks(cli: Cli, n: int, expect: str) -> None:
    """``n`` ticks while a daemon is down: each exits 0, prints nothing on stdout
    (``-q``) and one warning line that names what failed."""
    for _ in range(n):
        proc = cli("tick", "-q", check=False)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 0 and proc.stdout == "", proc
        assert len(lines) == 1 and lines[0].startswith("warning: ") and expect in lines[0], lines


def _check_finished(exp: dict[str, Any], epochs: int) -> None:
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    for t in exp["trials"]:
        assert t["state"] == "COMPLETED" and t["steps_completed"] == epochs, t
        assert (t["restarts"], t["crashes"], len(t["attempts"])) == (0, 0, 1), t


def _running(exp: dict[str, Any]) -> bool:
    return all(t["state"] == "RUNNING" for t in exp["trials"])


def _trains(exp: dict[str, Any]) -> bool:
    return all(t["state"] == "RUNNING" and t["steps_completed"] >= 1 for t in exp["trials"])


def _job_ids(exp: dict[str, Any]) -> set[str]:
    return {a["job_id"] for t in exp["trials"] for a in t["attempts"]}


def test_slurmctld_stopped_for_two_ticks_then_started_with_jobs_running(
    cli: Cli, tmp_path: Path
) -> None:
    """Each tick while slurmctld is down waits out squeue's retries (about 10 s), so
    two ticks are an outage of about 20 s; the jobs (60 s of epochs: the outage and the
    restart take twice as long on a loaded machine) outlive it and its restart."""
    epochs = 30
    exp_id = _launch(cli, tmp_path, "ctld", epochs, pause=2.0)
    jobs = _job_ids(_wait(cli, exp_id, _running))
    stop_daemon(cli.env, "slurmctld", signal.SIGTERM)
    try:
        _soft_ticks(cli, 2, "poll slurm: squeue failed")
        during = cli.experiment(exp_id)
    finally:
        restore_cluster(cli.env)
    assert [t["state"] for t in during["trials"]] == ["RUNNING", "RUNNING"], during
    assert jobs <= squeue_ids(cli.env)  # still running after the restart
    exp = _wait(cli, exp_id, lambda e: e["state"] != "ACTIVE")
    _check_finished(exp, epochs)
    assert _job_ids(exp) == jobs  # nothing submitted again


def test_slurmdbd_stopped_while_jobs_end(cli: Cli, tmp_path: Path) -> None:
    """The jobs end while sacct fails: squeue and their exit files tell how; once
    slurmdbd is back, a tick changes nothing of it."""
    epochs = 6  # 2 s an epoch: both trials train for a few ticks, even on a loaded machine
    exp_id = _launch(cli, tmp_path, "dbd", epochs, pause=2.0)
    jobs = _job_ids(_wait(cli, exp_id, _trains))
    stop_daemon(cli.env, "slurmdbd", signal.SIGTERM)
    try:
        exp = _wait(cli, exp_id, lambda e: e["state"] != "ACTIVE")
        accounting = subprocess.run(["sacct", "-X", "-n"], env=cli.env, capture_output=True)
        assert accounting.returncode != 0  # the jobs ended while accounting was down
    finally:
        restore_cluster(cli.env)
    _check_finished(exp, epochs)
    assert {a["cause"] for t in exp["trials"] for a in t["attempts"]} == {"completed"}
    cli("tick", "-q")
    assert cli.experiment(exp_id)["trials"] == exp["trials"]
    assert _job_ids(exp) == jobs
    assert cluster_healthy(cli.env)


def test_node_lost_with_its_jobs(cli: Cli, tmp_path: Path) -> None:
    """``scontrol update State=DOWN`` of the node running both tasks: their attempts
    end NODE_FAIL, the trials resume from their checkpoints (Slurm requeues them; on
    this cluster the node returns to service as soon as its slurmd registers again),
    and no restart counts as a crash."""
    epochs = 20  # 2 s an epoch: the node goes down while both trials still train, even
    # when a loaded machine's ticks see their second epoch late
    exp_id = _launch(cli, tmp_path, "node", epochs, pause=2.0)
    exp = _wait(cli, exp_id, lambda e: all(t["steps_completed"] >= 2 for t in e["trials"]))
    nodes = {a["node_list"] for t in exp["trials"] for a in t["attempts"]}
    (node,) = nodes  # the dev cluster packs both tasks onto one node
    down = ["scontrol", "update", f"NodeName={node}", "State=DOWN", "Reason=chaos"]
    subprocess.run(down, env=cli.env, check=True)
    try:
        exp = _wait(cli, exp_id, lambda e: e["state"] != "ACTIVE")
    finally:
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=cli.env, check=False
        )
        restore_cluster(cli.env)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    for t in exp["trials"]:
        causes = [a["cause"] for a in t["attempts"]]
        assert t["steps_completed"] == epochs and t["crashes"] == 0, t
        assert causes[0] == "node_fail" and causes[-1] == "completed", causes
        out, _err = logs_of(cli, t["id"])  # both runs of the task: the second resumed
        assert "first run" in out and "resumed at epoch" in out, out
