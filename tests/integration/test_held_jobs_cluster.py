"""A task that Slurm requeued and held after a failed launch is released by the tick, and
its trial resumes from its checkpoint and completes (Slurm 22.05's dev cluster).

How the hold is made for real: the trial's script, told TERM, checkpoints slowly (as a
large model would). Its node set DOWN (``scontrol update State=DOWN``), Slurm requeues
the task (NODE_FAIL) and sends TERM; after the requeue's wait (``cred_expire``, 10 s
here) it launches the task again on the same node, which returned to service
(``ReturnToService=2``) and still runs the old copy: ``Job ... already running, do not
launch second copy``, and the task is held (``launch failed requeued held``, priority
0; the node drained). The cluster's other node is drained meanwhile, so that Slurm
launches the task nowhere else. Without the tick's release the task stays held and
the trial never ends."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration._reference import logs_of
from tests.integration.chaos_cluster import restore_cluster
from tests.integration.conftest import Cli

pytestmark = [pytest.mark.cluster, pytest.mark.needs("root")]

# an epoch every half second, a checkpoint file per epoch; told TERM, it exits 75
# (checkpointed for a requeue) once the test has seen the task held (the file ``seen``),
# at most 180 s later: Slurm launches the requeued task again after 10 s (cred_expire),
# later on a loaded machine
SCRIPT = """\
import os, signal, sys, time
epochs, pause, ckpt, resume = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
seen = sys.argv[5]
told = []
signal.signal(signal.SIGTERM, lambda *_: told.append(time.time()))
start = int(open(resume).read()) if resume else 0
print(f"resumed at epoch {start}" if start else "first run", flush=True)
for epoch in range(start + 1, epochs + 1):
    time.sleep(pause)
    if told:
        print("TERM: checkpointing slowly", flush=True)
        while not os.path.exists(seen) and time.time() < told[0] + 180:
            time.sleep(0.2)
        sys.exit(75)
    with open(os.path.join(ckpt, f".epoch-{epoch}"), "w") as f:
        f.write(str(epoch))
    os.replace(os.path.join(ckpt, f".epoch-{epoch}"), os.path.join(ckpt, f"epoch-{epoch}"))
    print(f"epoch {epoch} loss={1.0 / epoch}", flush=True)
"""
HELD = "launch failed requeued held"


def _launch(cli: Cli, tmp_path: Path, epochs: int, seen: Path) -> int:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    exp = tmp_path / "held.yaml"
    exp.write_text(
        "name: held\n"
        "entrypoint: python train.py {max_length} 0.5 {checkpoint_dir} {checkpoint}"
        f" {seen}\n"
        f"workdir: {code}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        "hyperparameters: {x: 1}\n"
        f"searcher: {{name: grid, metric: loss, max_length: {epochs}}}\n"
        "script: {metrics: {pattern: 'epoch (?P<step>\\d+) loss=(?P<loss>\\S+)'}}\n"
        "max_restarts: 0\n"
    )
    return int(cli.json("launch", str(exp))["experiment_id"])


def _scontrol_node(cli: Cli, node: str, state: str) -> None:
    cmd = ["scontrol", "update", f"NodeName={node}", f"State={state}", "Reason=held-test"]
    if state == "RESUME":
        cmd = cmd[:-1]
    subprocess.run(cmd, env=cli.env, check=True, capture_output=True)


def _queue_line(cli: Cli, job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-r", "-j", job_id, "-o", "%T|%r"],
        env=cli.env,
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def _wait_held(cli: Cli, job_id: str, timeout: float = 150) -> None:
    """Until squeue shows ``job_id`` queued and held by Slurm after its failed launch."""
    deadline = time.monotonic() + timeout
    while (line := _queue_line(cli, job_id)) != f"PENDING|{HELD}":
        assert time.monotonic() < deadline, f"not held: squeue says {line!r}"
        time.sleep(0.5)


def test_a_task_slurm_held_after_a_failed_launch_is_released_and_its_trial_completes(
    cli: Cli, tmp_path: Path
) -> None:
    epochs = 60  # 30 s: the node goes down while it trains, even when a loaded machine's
    # ticks see its first epoch late
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N"], env=cli.env, capture_output=True, text=True, check=True
    ).stdout.split()
    first, others = nodes[0], sorted(set(nodes) - {nodes[0]})
    job = ""
    try:
        for node in others:  # Slurm's new launch can only go where the old copy runs
            _scontrol_node(cli, node, "DRAIN")
        seen = tmp_path / "seen"
        exp_id = _launch(cli, tmp_path, epochs, seen)
        exp = cli.tick_until(exp_id, lambda e: e["trials"][0]["steps_completed"] >= 1, 180, 0.5)
        [attempt] = exp["trials"][0]["attempts"]
        job = attempt["job_id"]
        assert attempt["node_list"] == first, attempt
        _scontrol_node(cli, first, "DOWN")
        _wait_held(cli, job)
        seen.touch()  # the old copy may end now
        for node in others:  # somewhere to run once released (the first node is drained)
            _scontrol_node(cli, node, "RESUME")
        exp = cli.tick_until(exp_id, lambda e: e["state"] != "ACTIVE", 180, 0.5)
    finally:
        if job:  # a task left held (the release failed) must not outlive the test
            subprocess.run(["scancel", job], env=cli.env, capture_output=True, check=False)
        restore_cluster(cli.env)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    [trial] = exp["trials"]
    assert trial["steps_completed"] == epochs and trial["crashes"] == 0, trial
    assert {a["job_id"] for a in trial["attempts"]} == {job}  # released, not submitted again
    assert trial["attempts"][-1]["cause"] == "completed", trial["attempts"]
    [line] = cli.events("jobs.held")
    assert f"({HELD}): released {job} (trial {trial['id']})" in line, line
    out, _err = logs_of(cli, trial["id"])
    assert "first run" in out and "resumed at epoch" in out, out
