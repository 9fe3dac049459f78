"""The in-job worker: runs entry.sh in the snapshot, records start/exit, hparams by file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlhpc.protocol import REQUEUE_REQUEST_FILE, TrialSpec, read_event_batches, work_dir


def _trial(tmp_path: Path, entry: str, hparams: dict[str, object]) -> Path:
    exp = tmp_path / "exp"
    (exp / "code").mkdir(parents=True)
    (exp / "entry.sh").write_text(entry)
    tdir = exp / "trials" / "trial-000001"
    TrialSpec(
        experiment_id=1,
        trial_id=1,
        hparams=hparams,
        max_length=2,
        seed=3,
        experiment_dir=str(exp),
        code_dir=str(exp / "code"),
        entry_script=str(exp / "entry.sh"),
        checkpoint_dir=str(tmp_path / "ckpt"),
        metric="m",
        smaller_is_better=True,
        env={"FROM_SPEC": "yes"},
    ).write(tdir / "trial.json")
    return tdir


# Starts the worker with TERM ignored, as some batch wrappers and CI runners do; an
# ignored signal stays ignored across exec unless the worker catches it first.
_TERM_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " os.execv(sys.executable, [sys.executable, '-m', 'dlhpc.harness.worker', sys.argv[1]])"
)


def _run(
    tdir: Path, job: str = "local-abc_0", *, term_ignored: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["DLHPC_JOB_ID"] = job
    start = ["-c", _TERM_IGNORED] if term_ignored else ["-m", "dlhpc.harness.worker"]
    return subprocess.run(
        [sys.executable, *start, str(tdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hostile_hparams_reach_the_script_only_through_the_file(tmp_path: Path) -> None:
    evil = "$(touch PWNED); `touch PWNED2`; ' \" \n\\"
    entry = (
        "#!/bin/bash\n"
        "python -c 'import dlhpc, json, os; c = dlhpc.init();"
        ' c.report(1, {"m": 0.5});'
        ' open("out.json", "w").write(json.dumps([c.hparams, os.environ["FROM_SPEC"]]))\'\n'
    )
    tdir = _trial(tmp_path, entry, {"name": evil})
    proc = _run(tdir)
    assert proc.returncode == 0, proc.stderr
    # written where the script ran: the trial's working folder, not the code snapshot
    assert json.loads((work_dir(tdir) / "out.json").read_text()) == [{"name": evil}, "yes"]
    assert not (tmp_path / "exp" / "code" / "out.json").exists()
    assert not list(tmp_path.rglob("PWNED*"))
    adir = tdir / "attempts" / "local-abc_0.r0"
    records = [r for b in read_event_batches(adir) for r in b.records]
    kinds = [r["type"] for r in records]
    assert kinds.count("start") == 1 and kinds.count("exit") == 1 and kinds.count("metric") == 1
    assert next(r for r in records if r["type"] == "exit")["code"] == 0


def test_failing_entrypoint_exit_code_is_recorded(tmp_path: Path) -> None:
    tdir = _trial(tmp_path, "#!/bin/bash\necho boom >&2\nexit 7\n", {})
    proc = _run(tdir)
    assert proc.returncode == 7
    records = [
        r for b in read_event_batches(tdir / "attempts" / "local-abc_0.r0") for r in b.records
    ]
    exit_rec = next(r for r in records if r["type"] == "exit")
    assert exit_rec["code"] == 7 and exit_rec["reason"] == "error"


@pytest.mark.parametrize("term_ignored", [False, True], ids=["default", "term-ignored"])
def test_script_dead_of_a_forwarded_signal_the_worker_never_got_ended_by_it(
    tmp_path: Path, term_ignored: bool
) -> None:
    """The scheduler signals each process of the step: the script can die of its TERM
    before the worker's own copy arrives. That is a signal's end, not a crash. The
    script gets TERM's default action even when the worker was started with TERM
    ignored (before, it inherited the ignore and ran on)."""
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    tdir = _trial(tmp_path, f"#!/bin/bash\npython -c '{kill_self}'\n", {})
    proc = _run(tdir, term_ignored=term_ignored)
    assert proc.returncode == 143, proc.stderr
    records = [
        r for b in read_event_batches(tdir / "attempts" / "local-abc_0.r0") for r in b.records
    ]
    exit_rec = next(r for r in records if r["type"] == "exit")
    assert (exit_rec["code"], exit_rec["reason"], exit_rec["signal"]) == (143, "signal", "TERM")


@pytest.mark.parametrize("code", [0, 75, 3, 143, 137])
def test_submitit_entry_raises_for_a_failure_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A planned exit (75: checkpointed for a requeue, or stopped by the searcher) ends
    the task quietly, as a completion does, and so does a script dead of TERM (143: the
    scheduler's preemption or cancellation came before it could checkpoint); a failure
    (KILL is no scheduler's planned end) raises, for its traceback in the job's log and
    a FAILED job. The exit record holds the code either way."""
    from dlhpc.harness.worker import TrialFailed, run_trial

    # above 128: the script dies of signal code - 128, as the shell reports it
    body = (
        f"python -c 'import os; os.kill(os.getpid(), {code - 128})'"
        if code > 128
        else f"exit {code}"
    )
    tdir = _trial(tmp_path, f"#!/bin/bash\n{body}\n", {})
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("DLHPC_JOB_ID", "local-q_0")
    if code in (3, 137):
        with pytest.raises(TrialFailed, match=f"entrypoint exited with code {code}"):
            run_trial(str(tdir))
    else:
        run_trial(str(tdir))
    records = [r for b in read_event_batches(tdir / "attempts" / "local-q_0.r0") for r in b.records]
    assert next(r for r in records if r["type"] == "exit")["code"] == code


def test_exit_reason_of_each_kind_of_end() -> None:
    from dlhpc.harness.worker import exit_reason

    assert exit_reason(0, []) == ("completed", None)
    assert exit_reason(75, ["USR2"]) == ("requeue", "USR2")
    assert exit_reason(1, ["TERM"]) == ("signal", "TERM")  # it got one: the script's exit
    assert exit_reason(1, []) == ("error", None)
    assert exit_reason(128 + 12, []) == ("signal", "USR2")  # died of one it forwards
    assert exit_reason(128 + 2, []) == ("signal", "INT")
    assert exit_reason(128 + 9, []) == ("error", None)  # KILL (OOM killer...): not forwarded
    assert exit_reason(128 + 11, []) == ("error", None)  # a segfault is the script's crash
    assert exit_reason(255, []) == ("error", None)  # 127 is no signal number


def test_worker_without_a_scheduler_identity_refuses(tmp_path: Path) -> None:
    tdir = _trial(tmp_path, "#!/bin/bash\ntrue\n", {})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DLHPC_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "dlhpc.harness.worker", str(tdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1 and "DLHPC_JOB_ID" in proc.stderr


STOPPABLE = """#!/bin/bash
trap ':' TERM USR2 INT  # as in every entry.sh dlhpc writes
python - <<'PY'
import time, dlhpc
ctx = dlhpc.init()
open("ready", "w").close()
for step in range(1, 10_000):
    time.sleep(0.01)
    ctx.report(step, {"m": float(step)})
    ctx.step()
PY
"""


def _start_and_signal(tdir: Path, sig: int, env_extra: dict[str, str]) -> int:
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(env_extra)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlhpc.harness.worker", str(tdir)],
        env=env,
    )
    ready = work_dir(tdir) / "ready"  # the script runs in the trial's working folder
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, "script never started"
        time.sleep(0.05)
    proc.send_signal(sig)  # Slurm signals the worker and the script; the worker forwards
    return proc.wait(timeout=60)


def test_term_makes_the_script_exit_for_requeue_with_its_metrics(tmp_path: Path) -> None:
    import signal

    tdir = _trial(tmp_path, STOPPABLE, {})
    code = _start_and_signal(tdir, signal.SIGTERM, {"DLHPC_JOB_ID": "local-x_0"})
    assert code == 75
    records = [r for b in read_event_batches(tdir / "attempts" / "local-x_0.r0") for r in b.records]
    exit_rec = next(r for r in records if r["type"] == "exit")
    assert (exit_rec["reason"], exit_rec["signal"]) == ("requeue", "TERM")
    steps = [r["step"] for r in records if r["type"] == "metric"]
    assert steps and steps == list(range(1, len(steps) + 1))  # flushed at the stop, no gap


def test_usr2_asks_the_job_script_to_requeue_the_array_task(tmp_path: Path) -> None:
    """After the time-limit signal and exit 75, rank 0 leaves its request in the attempt
    folder for the job script (which asks Slurm once the step has ended) and asks
    nothing itself: a requeue from inside the step would kill it mid-exit."""
    import signal

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/scontrol.args\n')
    (bin_dir / "scontrol").chmod(0o755)
    tdir = _trial(tmp_path, STOPPABLE, {})
    slurm = {
        "SLURM_JOB_ID": "80",
        "SLURM_ARRAY_JOB_ID": "77",
        "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_RESTART_COUNT": "2",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    assert _start_and_signal(tdir, signal.SIGUSR2, slurm) == 75
    assert not (tmp_path / "scontrol.args").exists()
    attempt = tdir / "attempts" / "77_3.r2"
    request = json.loads((attempt / REQUEUE_REQUEST_FILE).read_text())
    assert (request["job_id"], request["restart"]) == ("77_3", 2)
    records = [r for b in read_event_batches(attempt) for r in b.records]
    assert next(r for r in records if r["type"] == "exit")["signal"] == "USR2"


def test_term_or_a_failure_asks_for_no_requeue(tmp_path: Path) -> None:
    """A preemption (Slurm requeues the job itself) and a failure after USR2 leave no
    request."""
    import signal

    slurm = {"SLURM_JOB_ID": "80", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"}
    tdir = _trial(tmp_path / "term", STOPPABLE, {})
    assert _start_and_signal(tdir, signal.SIGTERM, slurm) == 75
    assert not (tdir / "attempts" / "77_3.r0" / REQUEUE_REQUEST_FILE).exists()
    failing = STOPPABLE.replace(
        "    ctx.step()", "    if ctx.should_stop():\n        raise SystemExit(3)"
    )
    assert failing != STOPPABLE
    tdir = _trial(tmp_path / "fail", failing, {})
    assert _start_and_signal(tdir, signal.SIGUSR2, slurm) == 3
    assert not (tdir / "attempts" / "77_3.r0" / REQUEUE_REQUEST_FILE).exists()


def test_searcher_stop_file_ends_the_trial_at_its_next_step(tmp_path: Path) -> None:
    import time

    from dlhpc.protocol import STOP_FILE

    tdir = _trial(tmp_path, STOPPABLE, {})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["DLHPC_JOB_ID"] = "local-s_0"
    proc = subprocess.Popen([sys.executable, "-m", "dlhpc.harness.worker", str(tdir)], env=env)
    ready = work_dir(tdir) / "ready"  # the script runs in the trial's working folder
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, "script never started"
        time.sleep(0.05)
    (tdir / STOP_FILE).write_text("{}")
    t0 = time.monotonic()
    assert proc.wait(timeout=60) == 75
    assert time.monotonic() - t0 < 10  # looked for every 2 s
    records = [r for b in read_event_batches(tdir / "attempts" / "local-s_0.r0") for r in b.records]
    exit_rec = next(r for r in records if r["type"] == "exit")
    assert exit_rec["code"] == 75 and exit_rec.get("signal") is None
