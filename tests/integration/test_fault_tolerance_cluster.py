"""Trials survive preemption and time limits on the real dev cluster, resuming exactly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration._reference import (
    DIGITS,
    PLANNED_EXIT_NOISE,
    References,
    final_sha,
    hog_argv,
    logs_of,
    seed_of,
    start_references,
)
from tests.integration.conftest import Cli

pytestmark = pytest.mark.cluster


def _experiment(
    tmp_path: Path, name: str, extra: str = "", epochs: int = 6, sleep: float = 0.08
) -> Path:
    exp = tmp_path / f"{name}.yaml"
    exp.write_text(
        f"name: {name}\nentrypoint: python train.py\nworkdir: {DIGITS}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        "hyperparameters:\n"
        "  lr: {type: log, minval: -2, maxval: -1, count: 2}\n"
        "  hidden: 32\n  dropout: 0.2\n  batch_size: 64\n"
        f"  step_sleep: {sleep}\n"
        "searcher: {name: grid, metric: val_accuracy, smaller_is_better: false,"
        f" max_length: {epochs}}}\n"
        "reproducibility: {seed: 7, deterministic: true}\n"
        "max_restarts: 2\n" + extra
    )
    return exp


def _wait_running_with_progress(cli: Cli, exp_id: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cli("tick", "-q")
        exp = cli.experiment(exp_id)
        running = [t for t in exp["trials"] if t["state"] == "RUNNING"]
        if len(running) == len(exp["trials"]) and all(t["steps_completed"] >= 1 for t in running):
            return
        time.sleep(1)
    raise AssertionError(json.dumps(cli.experiment(exp_id), indent=1))


def _check_logs(cli: Cli, exp: dict[str, Any]) -> None:
    """``dlhpc logs`` of each trial (its latest attempt) prints the digits script's own
    lines: its resume after the interruption and its final weights; the planned exits
    it went through left no traceback and no srun error in that log."""
    for t in exp["trials"]:
        out, err = logs_of(cli, t["id"])
        sha = final_sha(cli, exp["id"], t["id"])
        assert "resumed at epoch" in out and f"weights_sha256={sha}" in out, out
        assert not [x for x in PLANNED_EXIT_NOISE if x in err], err


def _start_exact(cli: Cli, tmp_path: Path, exp_id: int, epochs: int) -> References:
    """The uninterrupted runs of the experiment's trials, started beside their jobs while
    these wait or sleep (at the same priority: a niced run starves on a busy machine);
    :func:`_check_exact` waits for them."""
    trials = cli.experiment(exp_id)["trials"]
    seeds = {t["id"]: seed_of(cli, t["id"]) for t in trials}
    return start_references(tmp_path, trials, epochs, seeds)


def _check_exact(cli: Cli, exp: dict[str, Any], epochs: int, refs: References) -> None:
    """Every trial completed all ``epochs`` with the weights of its uninterrupted run."""
    for t in exp["trials"]:
        assert t["state"] == "COMPLETED" and t["steps_completed"] == epochs, t
    shas = refs.wait()
    assert set(shas) == {t["id"] for t in exp["trials"]}, shas
    for t in exp["trials"]:
        assert final_sha(cli, exp["id"], t["id"]) == shas[t["id"]], (
            f"trial {t['id']} weights differ"
        )


@pytest.mark.smoke
@pytest.mark.every_part  # 24.11+ requeue a preempted job; without sacct the label needs scontrol
def test_preempted_trials_checkpoint_requeue_and_finish_bitwise_identical(
    cli: Cli, tmp_path: Path
) -> None:
    epochs = 6
    exp_id = cli.json("launch", str(_experiment(tmp_path, "ft-preempt", epochs=epochs)))[
        "experiment_id"
    ]
    # wait until they are mid-training (an epoch done)
    _wait_running_with_progress(cli, exp_id)
    # a high-priority job that needs both whole nodes preempts (requeues) them; the
    # trials start again once it ends
    hog = subprocess.run(
        hog_argv(5),
        env=cli.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    refs = _start_exact(cli, tmp_path, exp_id, epochs)  # while the trials wait for the nodes
    try:
        exp = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL, timeout=400)
    finally:
        subprocess.run(["scancel", hog], env=cli.env, check=False)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    for t in exp["trials"]:
        causes = [a["cause"] for a in t["attempts"]]
        # every interrupted attempt was preempted, whichever way it came back: resubmitted
        # (22.05) or requeued by Slurm under its own id (24.11+), labelled from sacct -D
        # or, without accounting, from the worker's exit record (never "requeued")
        assert t["restarts"] >= 1 and causes[-1] == "completed", causes
        assert set(causes[:-1]) == {"preempted"}, causes
        assert t["crashes"] == 0
    _check_logs(cli, exp)
    _check_exact(cli, exp, epochs, refs)
    # metrics exactly once per (step, name), with no gap
    import sqlite3

    con = sqlite3.connect(cli.home / "dlhpc.db")
    rows = con.execute("SELECT trial_id, step, name FROM metrics").fetchall()
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()
    assert len(rows) == len(set(rows)) == 2 * epochs * 3
    assert {r[1] for r in rows} == set(range(1, epochs + 1))


def _job_pids(cli: Cli, task: str) -> list[int]:
    """Pids of a running array task's processes (batch shell, srun, worker, training).

    `scontrol listpids` cannot be used: it asks the local slurmd, and the dev
    cluster's nodes are not this host's name. Every process of the job carries
    SLURM_JOB_ID in its environment; slurmstepd, which does not, stays alive.
    """
    raw = subprocess.run(
        ["squeue", "-h", "-j", task, "-o", "%A"],
        env=cli.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    marker = f"SLURM_JOB_ID={raw}\0".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_hung_job_is_found_by_its_stale_heartbeat_cancelled_and_resumed(
    cli: Cli, tmp_path: Path
) -> None:
    """A frozen job (as on a dead or hung node: Slurm still says RUNNING, nothing moves)."""
    epochs = 4
    path = _experiment(tmp_path, "ft-hung", epochs=epochs, sleep=0.1)
    exp_id = cli.json("launch", str(path))["experiment_id"]
    _wait_running_with_progress(cli, exp_id)
    victim = cli.experiment(exp_id)["trials"][0]
    job = victim["slurm_job_ids"][-1]
    frozen = _job_pids(cli, job)
    assert frozen, f"no processes found for job {job}"
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        refs = _start_exact(cli, tmp_path, exp_id, epochs)  # while the job is frozen
        stale = {"DLHPC_HEARTBEAT_STALE_S": "40"}
        deadline = time.monotonic() + 240
        while True:
            cli("tick", "-q", check=True, **stale)
            exp = cli.experiment(exp_id)
            if exp["state"] in TERMINAL:
                break
            assert time.monotonic() < deadline, json.dumps(exp, indent=1)
            time.sleep(3)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    t = next(t for t in exp["trials"] if t["id"] == victim["id"])
    assert [a["cause"] for a in t["attempts"]][0] == "lost" and t["crashes"] == 0
    _check_exact(cli, exp, epochs, refs)


def _worker_logs(cli: Cli, key: str) -> list[str]:
    """The log messages the workers of attempt ``key`` published (any trial)."""
    messages = []
    pattern = f"runs/exp-*/trials/trial-*/attempts/{key}/worker-r*-*.jsonl"
    for path in sorted(cli.home.glob(pattern)):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("type") == "log":
                messages.append(str(rec["message"]))
    return messages


@pytest.mark.profile("strict")
def test_requeue_refused_by_slurm_is_resubmitted_and_resumes_bitwise(
    cli: Cli, tmp_path: Path
) -> None:
    """A site where the job's owner may not requeue it: the strict profile's job_submit.lua
    makes a job whose comment holds ``dlhpc-site-no-requeue`` not requeueable (Slurm then
    refuses the owner's ``scontrol requeue``: "Requested operation is presently
    disabled"). The trial gets its time-limit signal (USR2 ``lead_time`` before the limit,
    which the test shortens as any owner may), checkpoints and exits 75; the worker's
    requeue is refused, the job ends, and the reconciler submits the trial again as a new
    job, which resumes and finishes with the weights of an uninterrupted run.

    slurmctld sends a due signal when it next checks time limits (every 30 s), so the
    training lasts about 45 s: it is still running when the signal comes, whenever in
    those 30 s it comes."""
    epochs = 20  # 23 steps of 0.1 s each: the first is done about 2.5 s into training
    exp = tmp_path / "ft-norequeue.yaml"
    exp.write_text(
        f"name: ft-norequeue\nentrypoint: python train.py\nworkdir: {DIGITS}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00',"
        " sbatch_args: ['--comment=dlhpc-site-no-requeue']}\n"
        "preemption: {lead_time: '175s'}\n"
        "hyperparameters: {lr: 0.05, hidden: 32, dropout: 0.2, batch_size: 64, step_sleep: 0.1}\n"
        "searcher: {name: grid, metric: val_accuracy, smaller_is_better: false,"
        f" max_length: {epochs}}}\n"
        "reproducibility: {seed: 7, deterministic: true}\nmax_restarts: 0\n"
    )
    exp_id = cli.json("launch", str(exp))["experiment_id"]
    _wait_running_with_progress(cli, exp_id)
    (trial,) = cli.experiment(exp_id)["trials"]
    first_job = trial["slurm_job_ids"][-1]
    # 3 minutes: USR2 is due 5 s into the run, already past, so slurmctld sends it at its
    # next time-limit check, within 30 s
    subprocess.run(
        ["scontrol", "update", f"JobId={first_job}", "TimeLimit=3"], env=cli.env, check=True
    )
    refs = _start_exact(cli, tmp_path, exp_id, epochs)  # while the trial trains and sleeps
    done = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL, timeout=420)
    assert done["state"] == "COMPLETED", json.dumps(done, indent=1)
    (t,) = done["trials"]
    first, *rest = t["attempts"]
    assert first["job_id"] == first_job and first["exit_code"] == 75, first
    assert first["cause"] == "timeout" and t["crashes"] == 0, t["attempts"]
    # not Slurm's requeue (the same job id, key .r1): a new job from the reconciler
    assert rest and all(a["job_id"] != first_job for a in rest), t["attempts"]
    assert first["key"] == f"{first_job}.r0" and rest[-1]["cause"] == "completed"
    refused = [m for m in _worker_logs(cli, first["key"]) if "scontrol requeue" in m]
    assert refused and "presently disabled" in refused[0], refused
    _check_logs(cli, done)  # the new job's log
    # the first job's: its run ended as planned (exit 75, the requeue refused), quietly
    _, err = logs_of(cli, t["id"], first["key"])
    assert not [x for x in PLANNED_EXIT_NOISE if x in err], err
    _check_exact(cli, done, epochs, refs)
