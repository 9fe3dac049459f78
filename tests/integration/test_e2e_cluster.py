"""End to end on the real dev Slurm cluster: launch, tick, status, bad input, crashes."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration.conftest import REPO, Cli, DevCluster, squeue_ids

pytestmark = pytest.mark.cluster

GRID = REPO / "templates" / "examples" / "digits" / "grid.yaml"
RANDOM = REPO / "templates" / "examples" / "digits" / "random.yaml"


def _done(exp: dict[str, object]) -> bool:
    return exp["state"] in TERMINAL


def _sacct(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["sacct", "-X", "-n", "-P", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False)


@pytest.mark.smoke
def test_grid_example_runs_as_one_job_array_to_completion(
    cli: Cli, dev_cluster: DevCluster
) -> None:
    launched = cli.json("launch", str(GRID))
    exp_id, jobs = launched["experiment_id"], launched["slurm_job_ids"]
    assert len(jobs) == 4 and len({j.split("_")[0] for j in jobs}) == 1  # one sbatch --array
    exp = cli.tick_until(exp_id, _done)
    assert exp["state"] == "COMPLETED", exp
    assert set(exp) >= {"id", "name", "state", "searcher", "metric", "smaller_is_better", "trials"}
    assert exp["searcher"] == "grid" and exp["metric"] == "val_accuracy"
    for t in exp["trials"]:
        assert set(t) >= {
            "id",
            "state",
            "hparams",
            "steps_completed",
            "best_metric",
            "latest_metric",
            "restarts",
            "slurm_job_ids",
        }
        assert t["state"] == "COMPLETED" and t["steps_completed"] == 5
        assert 0.0 <= t["latest_metric"] <= 1.0 and t["best_metric"] >= t["latest_metric"] - 1e-12
        assert set(t["hparams"]) == {"lr", "hidden", "dropout", "batch_size"}
    assert {(t["hparams"]["lr"], t["hparams"]["hidden"]) for t in exp["trials"]} == {
        (0.001, 32),
        (0.001, 64),
        (0.1, 32),
        (0.1, 64),
    }
    best = max(t["best_metric"] for t in exp["trials"])
    assert best > 0.8  # lr=0.1 trains the digits MLP well in 5 epochs
    # Slurm's own accounting agrees; without accounting (profile noacct) there is none
    acct = _sacct(cli.env, "-j", jobs[0].split("_")[0], "--format=JobID,State")
    if dev_cluster.accounting:
        assert acct.returncode == 0 and acct.stdout.count("COMPLETED") == 4, acct
    else:
        assert acct.returncode != 0, acct  # so the run above really went without sacct
    # the terminal view shows every trial and the metric
    text = cli("status", str(exp_id)).stdout
    assert text.count("COMPLETED") >= 4 and "val_accuracy" in text
    # the ticks wrote no curve archive; the first page build writes them, the next reads them
    trials = Path(cli.experiment(exp_id)["run_dir"]) / "trials"
    assert len(list(trials.glob("trial-*"))) == 4
    assert list(trials.glob("trial-*/curves.h5")) == []
    page = cli.home / "page.html"
    cli("report", str(exp_id), "-o", str(page))
    assert "HDF5 archive for 0 trial(s), from the DB for 4" in page.read_text()
    assert len(list(trials.glob("trial-*/curves.h5"))) == 4
    cli("report", str(exp_id), "-o", str(page))
    assert "HDF5 archive for 4 trial(s), from the DB for 0" in page.read_text()


@pytest.mark.smoke
def test_random_example_runs_all_trials_at_most_four_at_a_time(cli: Cli) -> None:
    launched = cli.json("launch", str(RANDOM))
    assert len(launched["slurm_job_ids"]) == 4  # max_concurrent_trials: the rest wait
    running: list[int] = []

    def done(exp: dict[str, object]) -> bool:
        trials = exp["trials"]
        assert isinstance(trials, list)
        running.append(sum(t["state"] == "RUNNING" for t in trials))
        return _done(exp)

    exp = cli.tick_until(launched["experiment_id"], done)
    assert exp["state"] == "COMPLETED" and exp["searcher"] == "random", exp
    assert max(running) <= 4, running
    trials = exp["trials"]
    assert len(trials) == 8 and all(t["state"] == "COMPLETED" for t in trials), trials
    assert all(t["steps_completed"] == 5 for t in trials)
    hp = [t["hparams"] for t in trials]
    assert len({(h["lr"], h["hidden"], h["dropout"]) for h in hp}) == 8  # sampled, not a grid
    assert all(1e-4 <= h["lr"] <= 1e-1 and 16 <= h["hidden"] <= 128 for h in hp), hp
    assert all(0.0 <= h["dropout"] <= 0.5 and h["batch_size"] in (32, 64, 128) for h in hp)
    jobs = {j.split("_")[0] for t in trials for j in t["slurm_job_ids"]}
    assert len(jobs) >= 2  # the last four trials went out in later sbatch calls


def test_dry_run_prints_sbatch_and_submits_nothing(cli: Cli) -> None:
    before = squeue_ids(cli.env)
    out = cli("launch", str(GRID), "--dry-run").stdout
    assert "#SBATCH --array=0-3" in out and "#SBATCH --requeue" in out
    assert "USR2@120" in out and "#SBATCH --partition=debug" in out
    assert "srun" in out and "submitit" in out
    assert squeue_ids(cli.env) == before
    assert not (cli.home / "dlhpc.db").exists()


def test_bad_yaml_exits_2_with_file_line_and_submits_nothing(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        GRID.read_text()
        .replace("name: grid", "name: grid\n  divisor: 1")
        .replace("  cpus_per_task: 1", "  cpus_per_task: 1\n  gpu_per_node: 1")
    )
    (tmp_path / "train.py").write_text("")
    before = squeue_ids(cli.env)
    proc = cli("launch", str(bad), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any("bad.yaml:" in ln and "searcher.divisor" in ln for ln in lines), proc.stderr
    assert any("resources.gpu_per_node" in ln and "gpus_per_node" in ln for ln in lines)
    assert "Traceback" not in proc.stderr
    time.sleep(1)
    assert squeue_ids(cli.env) == before
    assert not (cli.home / "dlhpc.db").exists()


def _metric_rows(home: Path) -> list[tuple[int, int, str]]:
    con = sqlite3.connect(home / "dlhpc.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return con.execute("SELECT trial_id, step, name FROM metrics ORDER BY 1, 2, 3").fetchall()
    finally:
        con.close()


def test_reconciler_killed_mid_tick_loses_nothing_and_duplicates_nothing(cli: Cli) -> None:
    launched = cli.json("launch", str(GRID))
    exp_id, jobs = launched["experiment_id"], set(launched["slurm_job_ids"])
    deadline = time.monotonic() + 240
    while jobs & squeue_ids(cli.env):  # let the jobs finish with no tick: files pile up
        assert time.monotonic() < deadline, "jobs did not finish"
        time.sleep(2)
    for point in ("ingest.before_mark", "tick.after_ingest_batch", "tick.after_ingest"):
        proc = cli.run_process("tick", check=False, DLHPC_FAILPOINTS=point)
        assert proc.returncode == -signal.SIGKILL, (point, proc.returncode, proc.stderr)
    exp = cli.tick_until(exp_id, _done, timeout=60)
    assert exp["state"] == "COMPLETED"
    rows = _metric_rows(cli.home)
    assert len(rows) == len(set(rows)) == 4 * 5 * 3  # 4 trials x 5 epochs x 3 metrics
    # a further tick changes nothing
    cli("tick")
    assert _metric_rows(cli.home) == rows


def test_second_reconciler_exits_quietly(cli: Cli) -> None:
    cli("tick")  # creates the DB
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import time; from dlhpc.store import Store; import os\n"
                "s = Store(__import__('pathlib').Path(os.environ['DLHPC_HOME']))\n"
                "with s.hold_lease():\n print('held', flush=True); time.sleep(30)\n"
            ),
        ],
        env=cli.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = cli("tick")
        assert proc.returncode == 0 and "another reconciler" in proc.stdout
        assert cli("tick", "-q").stdout == ""
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.profile("default", "noacct")  # without sacct too: the noacct matrix part runs it
def test_launch_killed_between_sbatch_and_recording_is_adopted_not_resubmitted(
    cli: Cli, dev_cluster: DevCluster
) -> None:
    proc = cli.run_process("launch", str(GRID), check=False, DLHPC_FAILPOINTS="submit.after_sbatch")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (exp,) = cli.json("status")["experiments"]
    assert exp["state"] == "ACTIVE" and all(not t["slurm_job_ids"] for t in exp["trials"])
    done = cli.tick_until(exp["id"], _done)
    assert done["state"] == "COMPLETED"
    jobs = [j for t in done["trials"] for j in t["slurm_job_ids"]]
    assert len(jobs) == 4 and len({j.split("_")[0] for j in jobs}) == 1
    con = sqlite3.connect(cli.home / "dlhpc.db")
    names = [r[0] for r in con.execute("SELECT name FROM submissions")]
    con.close()
    assert len(names) == 1  # adopted, never submitted a second time
    out = _sacct(cli.env, f"--name={names[0]}", "--format=JobID")
    if dev_cluster.accounting:
        assert out.returncode == 0, out
        assert sorted(out.stdout.split()) == sorted(jobs)  # Slurm saw exactly one array of 4


@pytest.mark.needs("accounting")
def test_doctor_checks_the_dev_cluster(cli: Cli) -> None:
    report = cli.json("doctor")
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status["slurm reachable"] == "ok" and status["accounting (sacct)"] == "ok"
    assert status["site partitions"] == "ok" and status["state folder writable"] == "ok"
    assert "database filesystem" in status
    bad_site = cli.home.parent / "bad-site.yaml"
    bad_site.write_text("backend: slurm\npartition: nosuchpartition\n")
    proc = cli("doctor", "--site", str(bad_site), check=False)
    assert proc.returncode == 1 and "nosuchpartition" in proc.stdout
