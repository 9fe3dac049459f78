"""The job's environment on the real dev cluster: site modules and environment.setup run
in the job script before the worker's Python (set -e), jobs submitted later by a tick
from a stripped environment (cron's: ``env -i`` with PATH and HOME) run with the launch's
environment, the reproducibility record lists the modules really loaded, a failing
``module load`` fails the attempt with that line as its reason, and a scrontab entry
alone drives an experiment to completion.

These tests need no module system (the real Lmod: test_lmod_cluster.py): the site's
first ``modules`` line defines ``module`` as a shell function that "loads" by exporting
``LOADEDMODULES`` (as Lmod and Tcl modules do) and fails for a module named
``nonexistent``, like Lmod's ``module load``.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dlhpc.states import TERMINAL_EXPERIMENT_STATES as TERMINAL
from tests.integration.conftest import REPO, Cli

pytestmark = pytest.mark.cluster

FAKE_MODULE = (
    'module() { [ "$1" = load ] && [ "$2" != nonexistent ]'
    ' && export LOADEDMODULES="${LOADEDMODULES:+$LOADEDMODULES:}$2"; }'
)

# crashes on its first attempt, so that the tick submits the second one
TRAIN = """\
import json, os
from pathlib import Path
import dlhpc

ctx = dlhpc.init()
marks = Path(ctx.checkpoint_dir); marks.mkdir(parents=True, exist_ok=True)
n = len(list(marks.glob("run-*")))
got = {k: os.environ.get(k) for k in ("LAUNCH_MARK", "LOADEDMODULES", "FROM_SETUP")}
(marks / f"run-{n}").write_text(json.dumps(got))
if n == 0:
    raise SystemExit(1)
ctx.report(1, {"loss": 0.5})
ctx.close()
"""

QUICK = """\
import dlhpc
ctx = dlhpc.init()
ctx.report(1, {"loss": 0.5})
ctx.close()
"""


def _site(tmp_path: Path, *modules: str) -> Path:
    text = (REPO / "site-configs" / "dev-cluster.yaml").read_text(encoding="utf-8")
    lines = "".join(f"  - {json.dumps(m)}\n" for m in (FAKE_MODULE, *modules))
    site = tmp_path / "envsite.yaml"
    site.write_text(text.replace("name: dev-cluster", "name: envsite") + "modules:\n" + lines)
    return site


def _experiment(tmp_path: Path, train: str, max_restarts: int) -> Path:
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "train.py").write_text(train, encoding="utf-8")
    exp = folder / "exp.yaml"
    exp.write_text(
        "name: envtest\nentrypoint: python train.py\n"
        "resources: {cpus_per_task: 1, mem: 500M, time: '00:05:00'}\n"
        f"max_restarts: {max_restarts}\n"
        "environment:\n  setup: |\n    export FROM_SETUP=yes\n",
        encoding="utf-8",
    )
    return exp


def _stripped(cli: Cli, site: Path) -> tuple[str, dict[str, str]]:
    """The cron line's command and cron's environment (no LAUNCH_MARK, no venv)."""
    out = cli("cron", "--site", str(site), DLHPC_SITE=str(site)).stdout
    line = next(x for x in out.splitlines() if x.strip() and not x.startswith("#"))
    command = line.split(None, 5)[5]
    assert "%" not in command  # cron's % rule does not apply to this test's paths
    return command, {"HOME": str(cli.home.parent), "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh"}


def _tick_stripped_until_over(cli: Cli, site: Path, exp_id: int, timeout: float = 300) -> Any:
    command, env = _stripped(cli, site)
    deadline = time.monotonic() + timeout
    while True:
        proc = subprocess.run(
            ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "/bin/sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        exp = cli.experiment(exp_id)
        if exp["state"] in TERMINAL:
            return exp
        assert time.monotonic() < deadline, exp
        time.sleep(2)


def _attempt_rows(home: Path) -> list[tuple[str, str, str, str]]:
    with sqlite3.connect(home / "dlhpc.db") as db:
        return db.execute(
            "SELECT attempt_key, exit_reason, cause, env_json FROM attempts ORDER BY id"
        ).fetchall()


def test_a_tick_from_a_stripped_environment_submits_jobs_that_run_like_the_launch(
    cli: Cli, tmp_path: Path
) -> None:
    site = _site(tmp_path, "module load fake/1.0")
    exp = _experiment(tmp_path, TRAIN, max_restarts=2)
    out = cli("launch", str(exp), "--site", str(site), "--json", LAUNCH_MARK="from-launch")
    exp_id = json.loads(out.stdout)["experiment_id"]
    run_dir = Path(cli.experiment(exp_id)["run_dir"])
    assert (run_dir / "launch-env.json").stat().st_mode & 0o77 == 0
    done = _tick_stripped_until_over(cli, site, exp_id)
    assert done["state"] == "COMPLETED", done
    (trial,) = done["trials"]
    assert trial["state"] == "COMPLETED" and trial["restarts"] == 1
    marks = sorted((cli.home / "scratch").rglob("run-*"))
    assert [m.name for m in marks] == ["run-0", "run-1"]
    for mark in marks:  # the launch's job and the job the stripped tick submitted
        got = json.loads(mark.read_text(encoding="utf-8"))
        assert got == {
            "LAUNCH_MARK": "from-launch",
            "LOADEDMODULES": "fake/1.0",
            "FROM_SETUP": "yes",
        }
    rows = _attempt_rows(cli.home)
    assert len(rows) == 2
    for _, _, _, env_json in rows:  # the modules in effect in the job, in the repro record
        assert json.loads(env_json)["modules"]["loaded"] == ["fake/1.0"]
    # the crash keeps its traceback and srun's error in its job's log (a planned exit has none)
    err = cli("logs", str(trial["id"]), "--attempt", rows[0][0], "--stderr").stdout
    for line in ("Traceback", "TrialFailed: entrypoint exited with code 1", "srun: error"):
        assert line in err, err


def test_a_failing_module_load_fails_the_attempt_with_that_line(cli: Cli, tmp_path: Path) -> None:
    site = _site(tmp_path, "module load fake/1.0", "module load nonexistent")
    exp = _experiment(tmp_path, QUICK, max_restarts=0)
    exp_id = cli.json("launch", str(exp), "--site", str(site))["experiment_id"]
    done = cli.tick_until(exp_id, lambda e: e["state"] in TERMINAL)
    (trial,) = done["trials"]
    assert trial["state"] == "FAILED", done
    ((_, reason, cause, _),) = _attempt_rows(cli.home)
    assert (reason, cause) == ("setup", "setup")
    with sqlite3.connect(cli.home / "dlhpc.db") as db:
        (error,) = db.execute("SELECT error FROM trials").fetchone()
        logs = [m for (m,) in db.execute("SELECT message FROM events WHERE kind = 'log.error'")]
    line = "setup failed: site modules line 3: module load nonexistent (exit 1)"
    assert line in error and line in logs


def _scrontab_enabled(env: dict[str, str]) -> str | None:
    """Why scrontab cannot be used here, or None."""
    out = subprocess.run(
        ["scontrol", "show", "config"], env=env, capture_output=True, text=True, check=False
    ).stdout
    line = next((x for x in out.splitlines() if x.startswith("ScronParameters")), None)
    if line is None:
        return "this Slurm has no ScronParameters"
    if "enable" not in line.split("=", 1)[1]:
        return f"scrontab is disabled on the dev cluster ({line.strip()})"
    return None


@pytest.mark.needs("scrontab")
@pytest.mark.profile("default")  # in the 24.11 and 26.05 matrix parts
def test_a_scrontab_entry_alone_drives_an_experiment_to_completion(
    cli: Cli, tmp_path: Path
) -> None:
    why = _scrontab_enabled(cli.env)
    if why is not None:
        pytest.skip(why)
    site = _site(tmp_path)
    env = {**cli.env, "DLHPC_SITE": str(site)}
    before = subprocess.run(["scrontab", "-l"], env=env, capture_output=True, text=True)
    entry = cli("cron", "--scrontab", "--site", str(site), DLHPC_SITE=str(site)).stdout
    assert "#SCRON --partition=debug" in entry
    file = tmp_path / "scrontab.txt"
    file.write_text(entry, encoding="utf-8")
    exp = _experiment(tmp_path, QUICK, max_restarts=0)
    exp_id = cli.json("launch", str(exp), "--site", str(site))["experiment_id"]
    subprocess.run(["scrontab", str(file)], env=env, check=True, capture_output=True, text=True)
    try:
        deadline = time.monotonic() + 420  # runs start on minute boundaries
        while (state := cli.experiment(exp_id)["state"]) not in TERMINAL:  # no tick here
            assert time.monotonic() < deadline, f"still {state}"
            time.sleep(2)
        assert state == "COMPLETED"
        assert (cli.home / "cron" / "scrontab.log").exists()
    finally:
        if before.returncode == 0 and before.stdout.strip():
            restore = tmp_path / "scrontab.before"
            restore.write_text(before.stdout, encoding="utf-8")
            subprocess.run(["scrontab", str(restore)], env=env, check=False)
        else:
            subprocess.run(["scrontab", "-r"], env=env, check=False, input="y\n", text=True)
