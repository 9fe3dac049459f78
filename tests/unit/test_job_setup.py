"""The Slurm job script's environment section: site modules and environment.setup run
before the worker's Python (set -e), a failing line publishes a ``setup`` exit record in
the attempt folder that the reconciler ingests, and sbatch runs in the launch's saved
environment (``--export=ALL``). The rendered script is run by bash here, with a fake
``srun`` (the worker's line) and the ``module`` command a shell function, as on a site
without Lmod."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from dlhpc.config.schema import (
    Environment,
    ExperimentConfig,
    PreemptionConfig,
    Resources,
    SiteConfig,
)
from dlhpc.orchestrator.recovery import judge
from dlhpc.orchestrator.runfiles import (
    entry_script_text,
    launch_environment,
    read_launch_environment,
    setup_sections,
)
from dlhpc.protocol import launch_env_file, read_event_batches
from dlhpc.scheduler import JobRequest, JobState, JobStatus
from dlhpc.scheduler.slurm.sbatch import build_submission, parse_sbatch_args, trial_list_text
from dlhpc.scheduler.slurm.scheduler import SlurmScheduler
from dlhpc.states import TrialState
from dlhpc.store import Attempt, Store, Trial, utcnow
from dlhpc.store.ingest import ingest_attempt
from tests.unit._db import exp_and_trial

FAKE_MODULE = (
    'module() { [ "$1" = load ] && [ "$2" != nonexistent ] && export LOADEDMODULES="$2"; }'
)


def make_experiment(
    tmp_path: Path, site_modules: tuple[str, ...] = (), setup: str = ""
) -> ExperimentConfig:
    return ExperimentConfig(
        name="e",
        entrypoint="python train.py",
        workdir=tmp_path,
        source=tmp_path / "e.yaml",
        site=SiteConfig(name="t", source=None, modules=site_modules),
        environment=Environment(setup=setup),
    )


def request(
    tmp_path: Path, setup: tuple[tuple[str, tuple[str, ...]], ...], **kw: object
) -> JobRequest:
    dirs = [tmp_path / "exp" / "trials" / f"trial-{i:06d}" for i in range(3)]
    fields: dict[str, object] = {
        "experiment_id": 7,
        "name": "dlhpc-e7-abc",
        "folder": tmp_path / "exp" / "jobs",
        "trial_dirs": dirs,
        "resources": Resources(partition="debug"),
        "preemption": PreemptionConfig(),
        "site": SiteConfig(name="t", source=None, max_array_size=100),
        "setup": setup,
        **kw,
    }
    return JobRequest(**fields)  # type: ignore[arg-type]


def render(req: JobRequest) -> str:
    """The script submit would write, and its trial list written as submit writes it."""
    sched = SlurmScheduler(fn=lambda d: None)
    sched._cluster_max_array = 100  # no scontrol
    (text,) = sched.render(req)
    listed = build_submission(req, 0).trial_list
    listed.parent.mkdir(parents=True, exist_ok=True)
    listed.write_text(trial_list_text(req.trial_dirs), encoding="utf-8")
    return text


def run_script(text: str, tmp_path: Path, task: int = 1) -> subprocess.CompletedProcess[str]:
    """Run the job script as Slurm's batch shell would, with a fake srun that prints
    the environment it gets (the worker's)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    srun = bindir / "srun"
    srun.write_text("#!/bin/sh\necho SRUN-RAN\nenv\n", encoding="utf-8")
    srun.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(text, encoding="utf-8")
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "SLURM_ARRAY_JOB_ID": "55",
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_JOB_ID": "56",
    }
    return subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


SECTIONS = (
    ("site modules", (FAKE_MODULE, "module load cuda/12.1")),
    ("environment.setup", ("export FROM_SETUP=yes", "echo setup-ran")),
)


def test_setup_runs_before_the_python_line_under_set_e(tmp_path: Path) -> None:
    text = render(request(tmp_path, SECTIONS))
    lines = text.splitlines()
    assert "#SBATCH --export=ALL" in lines
    at = {key: lines.index(key) for key in ("set -e", "module load cuda/12.1", "set +e")}
    (srun,) = [i for i, line in enumerate(lines) if line.startswith("srun ")]
    check = next(i for i, line in enumerate(lines) if "-c 'import dlhpc, submitit'" in line)
    done = lines.index("export DLHPC_JOB_SETUP=done")
    assert at["set -e"] < at["module load cuda/12.1"] < check < at["set +e"] < done < srun
    assert lines.index("export FROM_SETUP=yes") < check
    assert lines.index("trap '_dlhpc_setup_failed' EXIT") < at["set -e"]
    path = next(line for line in lines if line.startswith("export PATH="))
    assert path.startswith(f"export PATH={Path(sys.executable).parent}")  # before the setup
    assert lines.index(path) < at["module load cuda/12.1"]


def test_no_setup_no_section(tmp_path: Path) -> None:
    text = render(request(tmp_path, ()))
    assert "set -e" not in text and "# setup" not in text
    assert "#SBATCH --export=ALL" in text


def test_export_is_reserved() -> None:
    from dlhpc.errors import SchedulerError

    with pytest.raises(SchedulerError, match="--export is set by dlhpc"):
        parse_sbatch_args(["--export=NONE"])


def test_a_good_setup_reaches_the_worker(tmp_path: Path) -> None:
    proc = run_script(render(request(tmp_path, SECTIONS)), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "setup-ran" in proc.stdout and "SRUN-RAN" in proc.stdout
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert env["FROM_SETUP"] == "yes" and env["DLHPC_JOB_SETUP"] == "done"
    assert env["LOADEDMODULES"] == "cuda/12.1"  # the module really in effect
    assert not (tmp_path / "exp" / "trials").exists()  # no marker


def _marker(tmp_path: Path, task: int = 1) -> list[dict[str, object]]:
    adir = tmp_path / "exp" / "trials" / f"trial-{task:06d}" / "attempts" / f"55_{task}.r0"
    (batch,) = read_event_batches(adir)
    assert batch.name == "setup-00000000.jsonl"
    return batch.records


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            (("site modules", (FAKE_MODULE, "module load nonexistent", "module load b")),),
            "setup failed: site modules line 2: module load nonexistent (exit 1)",
        ),
        (  # inside a function defined by the setup: the line that called it
            (("environment.setup", ("f() { false; echo no; }", "echo ok", 'f "a\\"b"')),),
            'setup failed: environment.setup line 3: f "a\\"b" (exit 1)',
        ),
        (  # inside a compound command
            (("environment.setup", ("for x in 1; do", "  ls /nonexistent-dir", "done")),),
            "setup failed: environment.setup line 2: ls /nonexistent-dir (exit 2)",
        ),
    ],
)
def test_a_failing_line_fails_the_attempt_with_its_reason(
    tmp_path: Path, sections: tuple[tuple[str, tuple[str, ...]], ...], message: str
) -> None:
    proc = run_script(render(request(tmp_path, sections)), tmp_path)
    assert proc.returncode != 0 and "SRUN-RAN" not in proc.stdout
    assert f"dlhpc: {json.dumps(message)[1:-1]}" in proc.stderr  # as the JSON holds it
    exit_rec, log_rec = _marker(tmp_path)
    assert exit_rec["type"] == "exit" and exit_rec["reason"] == "setup"
    assert exit_rec["code"] == proc.returncode
    assert log_rec == {**log_rec, "type": "log", "level": "error", "message": message}


def test_a_python_that_cannot_start_fails_the_attempt(tmp_path: Path) -> None:
    req = request(tmp_path, SECTIONS, python="/nonexistent/python3")
    proc = run_script(render(req), tmp_path, task=0)
    assert proc.returncode != 0 and "SRUN-RAN" not in proc.stdout
    _, log_rec = _marker(tmp_path, task=0)
    assert "the worker's Python /nonexistent/python3 cannot start" in str(log_rec["message"])


def test_the_marker_is_ingested_and_judged_as_setup(tmp_path: Path) -> None:
    sections = (("site modules", (FAKE_MODULE, "module load nonexistent")),)
    req = request(tmp_path, sections)
    run_script(render(req), tmp_path)
    store = Store(tmp_path / "home")
    tid = exp_and_trial(store, tmp_path)
    with store.write() as s:
        t = s.get(Trial, tid)
        assert t is not None
        res = ingest_attempt(s, t, req.trial_dirs[1] / "attempts" / "55_1.r0", utcnow())
        (a,) = t.attempts
        assert res.exited and a.exit_code == 1 and a.exit_reason == "setup"
        verdict = judge(a, JobStatus("55_1", JobState.FAILED), None, utcnow())
    assert verdict.cause == "setup" and verdict.counted and verdict.resubmit


def test_judge_setup_cause() -> None:
    a = Attempt(job_id="1_0", attempt_key="1_0.r0", state="FAILED", exit_code=3)
    a.exit_reason, a.created_at = "setup", datetime(2026, 1, 1)
    v = judge(a, None, None, datetime(2026, 1, 1))
    assert (v.state, v.cause, v.counted) == (TrialState.PENDING, "setup", True)


def test_sections_and_entry_script_guard(tmp_path: Path) -> None:
    cfg = make_experiment(
        tmp_path,
        site_modules=("module load cuda/12.1",),
        setup="source venv/bin/activate\nexport A=1\n",
    )
    assert setup_sections(cfg) == (
        ("site modules", ("module load cuda/12.1",)),
        ("environment.setup", ("source venv/bin/activate", "export A=1")),
    )
    text = entry_script_text(cfg, 3)
    guard = text.index('if [ "${DLHPC_JOB_SETUP:-}" != done ]; then')
    assert (
        guard
        < text.index("module load cuda/12.1")
        < text.index("fi\n")
        < text.index(cfg.entrypoint)
    )
    for done, ran in (("", True), ("done", False)):
        env = {"PATH": "/usr/bin:/bin", "DLHPC_JOB_SETUP": done}
        script = (
            text.replace("module load cuda/12.1", "echo MODULE")
            .replace("source venv/bin/activate", "true")
            .replace(cfg.entrypoint, "true")
        )
        out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
        assert ("MODULE" in out.stdout) is ran


def test_launch_environment_is_saved_private_and_used_by_sbatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = launch_environment(
        {"PATH": "/opt/v/bin:relative:/usr/bin", "SLURM_CONF": "/c", "SLURM_JOB_ID": "9",
         "SRUN_DEBUG": "1", "HF_TOKEN": "s", "SBATCH_ACCOUNT": "lab"}
    )  # fmt: skip
    assert env == {"PATH": "/opt/v/bin:/usr/bin", "SLURM_CONF": "/c", "HF_TOKEN": "s",
                   "SBATCH_ACCOUNT": "lab"}  # fmt: skip
    exp_dir = tmp_path / "exp"
    assert read_launch_environment(exp_dir) is None  # launched before it was saved
    from dlhpc.orchestrator.runfiles import publish_staging

    monkeypatch.setenv("DLHPC_TEST_MARK", "launch")
    cfg = make_experiment(tmp_path)
    staging = tmp_path / "staging"
    (staging / "code").mkdir(parents=True)
    publish_staging(staging, cfg, tmp_path / "exp-000001", 1)
    saved = launch_env_file(tmp_path / "exp-000001")
    assert saved.stat().st_mode & 0o777 == 0o600  # its owner's alone, whatever the policy
    assert read_launch_environment(tmp_path / "exp-000001")["DLHPC_TEST_MARK"] == "launch"
    # sbatch runs in the saved environment, not the ticking process's
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    sbatch = bindir / "sbatch"
    sbatch.write_text(
        f"#!/bin/sh\nenv > {tmp_path}/sbatch.env\necho Submitted batch job 77\n",
        encoding="utf-8",
    )
    sbatch.chmod(0o755)
    submit_env = {"PATH": f"{bindir}:/usr/bin:/bin", "FROM_LAUNCH": "1"}
    req = request(tmp_path, (), submit_env=submit_env)
    sched = SlurmScheduler(fn=lambda d: None)
    sched._cluster_max_array = 100
    monkeypatch.setenv("FROM_TICK", "1")
    tasks = sched.submit(req)
    assert [t.job_id for t in tasks] == ["77_0", "77_1", "77_2"]
    seen = (tmp_path / "sbatch.env").read_text(encoding="utf-8")
    assert "FROM_LAUNCH=1" in seen and "FROM_TICK" not in seen
    assert json.loads(saved.read_text(encoding="utf-8"))["DLHPC_TEST_MARK"] == "launch"
