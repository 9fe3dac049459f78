"""The whole pipeline on the local backend (no Slurm): launch, tick, status, kill, errors.

Uses the real CLI through click's CliRunner, real processes, real SQLite.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlhpc.cli.main import cli
from tests.unit._cli import local_exp_dir, run, status, until_over

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def exp_dir(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return local_exp_dir(tmp_path, monkeypatch)


def test_grid_on_local_backend_completes_with_metrics(exp_dir: Path) -> None:
    (exp_dir / "exp.yaml").write_text(
        "name: local-grid\nentrypoint: python train.py\n"
        "hyperparameters:\n  x: {type: double, minval: 0.1, maxval: 0.5, count: 3}\n"
        "searcher: {name: grid, metric: loss, max_length: 3, max_concurrent_trials: 2}\n"
    )
    res = run("launch", str(exp_dir / "exp.yaml"), "--json")
    assert res.exit_code == 0, res.output
    exp_id = json.loads(res.output)["experiment_id"]
    exp = until_over(exp_id)
    assert exp["state"] == "COMPLETED"
    assert sorted(t["hparams"]["x"] for t in exp["trials"]) == pytest.approx([0.1, 0.3, 0.5])
    for t in exp["trials"]:
        assert t["state"] == "COMPLETED" and t["steps_completed"] == 3
        assert t["best_metric"] == pytest.approx(t["hparams"]["x"] / 3)
        assert t["latest_metric"] == pytest.approx(t["hparams"]["x"] / 3)
    table = run("status").output
    assert "local-grid" in table and "COMPLETED" in table


def test_failing_trial_is_failed_with_its_error(exp_dir: Path) -> None:
    (exp_dir / "exp.yaml").write_text(
        "name: local-fail\nentrypoint: python train.py\n"
        "hyperparameters:\n  x: 1.0\nsearcher: {name: single, metric: loss, max_length: 1}\n"
    )
    exp_id = json.loads(run("launch", str(exp_dir / "exp.yaml"), "--json").output)["experiment_id"]
    exp = until_over(exp_id)
    assert exp["state"] == "FAILED"
    (trial,) = exp["trials"]
    assert trial["state"] == "FAILED" and "exit code 3" in trial["error"]


def test_kill_experiment_cancels_running_trials(exp_dir: Path) -> None:
    (exp_dir / "slow.py").write_text("import time\ntime.sleep(120)\n")
    (exp_dir / "exp.yaml").write_text(
        "name: local-kill\nentrypoint: python slow.py\n"
        "hyperparameters:\n  x: 1.0\nsearcher: {name: single, metric: loss}\n"
    )
    exp_id = json.loads(run("launch", str(exp_dir / "exp.yaml"), "--json").output)["experiment_id"]
    res = run("kill", str(exp_id))
    assert res.exit_code == 0, res.output
    exp = status(exp_id)
    assert exp["state"] == "KILLED" and exp["trials"][0]["state"] == "KILLED"
    assert run("tick", "-q").exit_code == 0
    assert status(exp_id)["state"] == "KILLED"


def test_kill_trial_marks_it_killed_and_the_searcher_hears_it_exited(exp_dir: Path) -> None:
    (exp_dir / "slow.py").write_text("import time\ntime.sleep(120)\n")
    (exp_dir / "exp.yaml").write_text(
        "name: local-kill-trial\nentrypoint: python slow.py\n"
        "hyperparameters:\n  x: 1.0\nsearcher: {name: single, metric: loss}\n"
    )
    exp_id = json.loads(run("launch", str(exp_dir / "exp.yaml"), "--json").output)["experiment_id"]
    (trial,) = status(exp_id)["trials"]
    res = run("kill", "-t", str(trial["id"]))
    assert res.exit_code == 0, res.output
    exp = status(exp_id)
    assert exp["state"] == "ACTIVE" and exp["trials"][0]["state"] == "KILLED"
    assert run("tick", "-q").exit_code == 0
    # the single searcher was told its trial exited: nothing is left, no trial completed
    assert status(exp_id)["state"] == "FAILED"


def test_bad_input_exits_2_and_writes_nothing(exp_dir: Path, home: Path) -> None:
    (exp_dir / "exp.yaml").write_text(
        "name: bad\nentrypoint: python train.py\nsearcher: {name: grid, divisor: 1, metrc: x}\n"
    )
    res = CliRunner().invoke(cli, ["launch", str(exp_dir / "exp.yaml")])
    assert res.exit_code == 2
    assert "exp.yaml:3: searcher.divisor" in res.output and "did you mean 'metric'" in res.output
    assert not home.exists()
    assert CliRunner().invoke(cli, ["status", "999"]).exit_code == 2  # unknown id
    assert CliRunner().invoke(cli, ["kill", "-t", "999"]).exit_code == 2


def test_dry_run_on_local_backend_writes_nothing(exp_dir: Path, home: Path) -> None:
    shutil.copy(REPO / "templates" / "examples" / "digits" / "grid.yaml", exp_dir / "grid.yaml")
    res = run("launch", str(exp_dir / "grid.yaml"), "--dry-run")
    assert res.exit_code == 0, res.output
    assert "4 trial(s)" in res.output
    assert not home.exists()


def test_doctor_on_a_local_site_skips_slurm(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLHPC_SITE", "local")
    res = run("doctor", "--json")
    assert res.exit_code == 0, res.output
    checks = {c["name"]: c["status"] for c in json.loads(res.output)["checks"]}
    assert checks["slurm"] == "skip" and checks["state folder writable"] == "ok"


def _trial_script(exp_dir: Path, body: str) -> None:
    (exp_dir / "flaky.py").write_text(
        "import os, sys, dlhpc\nfrom pathlib import Path\nctx = dlhpc.init()\n"
        "marks = Path(ctx.checkpoint_dir); marks.mkdir(parents=True, exist_ok=True)\n"
        "n = len(list(marks.glob('run-*'))); (marks / f'run-{n}').touch()\n" + body
    )


def test_crash_is_restarted_and_counted(exp_dir: Path) -> None:
    _trial_script(
        exp_dir, "ctx.report(1, {'loss': 1.0 + n}); ctx.close(); sys.exit(1 if n == 0 else 0)\n"
    )
    (exp_dir / "exp.yaml").write_text(
        "name: flaky\nentrypoint: python flaky.py\nmax_restarts: 2\n"
        "hyperparameters:\n  x: 1\nsearcher: {name: single, metric: loss}\n"
    )
    exp_id = json.loads(run("launch", str(exp_dir / "exp.yaml"), "--json").output)["experiment_id"]
    exp = until_over(exp_id)
    (t,) = exp["trials"]
    assert exp["state"] == "COMPLETED" and t["state"] == "COMPLETED"
    assert t["restarts"] == 1 and t["crashes"] == 1 and len(t["slurm_job_ids"]) == 2
    assert [a["cause"] for a in t["attempts"]] == ["crash", "completed"]
    assert t["latest_metric"] == 2.0  # the second run's value replaced the first's


def test_crashes_past_max_restarts_fail_the_trial_with_its_error(exp_dir: Path) -> None:
    _trial_script(exp_dir, "print('boom: bad batch', file=sys.stderr); sys.exit(4)\n")
    (exp_dir / "exp.yaml").write_text(
        "name: doomed\nentrypoint: python flaky.py\nmax_restarts: 2\n"
        "hyperparameters:\n  x: 1\nsearcher: {name: single, metric: loss}\n"
    )
    exp_id = json.loads(run("launch", str(exp_dir / "exp.yaml"), "--json").output)["experiment_id"]
    exp = until_over(exp_id)
    (t,) = exp["trials"]
    assert exp["state"] == "FAILED" and t["state"] == "FAILED"
    assert t["restarts"] == 2 and t["crashes"] == 2  # 3 attempts in all
    assert "max_restarts 2" in t["error"] and "boom: bad batch" in t["error"]


def test_launch_follow_ticks_until_the_experiment_ends(exp_dir: Path) -> None:
    (exp_dir / "exp.yaml").write_text(
        "name: follow\nentrypoint: python train.py\n"
        "hyperparameters:\n  x: {type: double, minval: 0.1, maxval: 0.2, count: 2}\n"
        "searcher: {name: grid, metric: loss, max_length: 2}\n"
    )
    res = run("launch", str(exp_dir / "exp.yaml"), "--follow", "--interval", "0.3")
    assert res.exit_code == 0, res.output
    assert "experiment 1 launched" in res.output
    assert "[COMPLETED]" in res.output and res.output.count("COMPLETED") >= 3


def test_kill_reaches_a_script_that_ignores_term(exp_dir: Path) -> None:
    """The local runner's SIGKILL after its grace reaches the entrypoint's own process
    group too (the worker starts it in a session of its own), so nothing is left."""
    import os
    import signal
    import time

    (exp_dir / "deaf.py").write_text(
        "import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open('deaf.pid', 'w').write(str(os.getpid()))\ntime.sleep(300)\n"
    )
    (exp_dir / "exp.yaml").write_text(
        "name: local-deaf\nentrypoint: python deaf.py\n"
        "hyperparameters:\n  x: 1.0\nsearcher: {name: single, metric: loss}\n"
    )
    exp_id = json.loads(run("launch", str(exp_dir / "exp.yaml"), "--json").output)["experiment_id"]
    pid_files: list[Path] = []
    deadline = time.monotonic() + 60
    while not pid_files and time.monotonic() < deadline:
        time.sleep(0.2)
        pid_files = list(exp_dir.parent.rglob("deaf.pid"))
    assert pid_files, "the script never started"
    pid = int(pid_files[0].read_text())
    assert run("kill", str(exp_id)).exit_code == 0
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the TERM-ignoring script (pid {pid}) outlived the kill by 40 s")
