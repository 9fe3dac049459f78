"""The signal trap is gone: a script that calls ``dlhpc.init()`` and never polls
still ends promptly on SIGTERM or a stop decision (real processes, real signals),
while a script that polls keeps checkpointing and exiting for requeue itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dlhpc.protocol import STOP_FILE, TrialSpec, read_event_batches

# after init(), report 3 metrics, say "ready", then never poll (the body of the loop varies)
NON_POLLING = """
import sys, time, dlhpc
ctx = dlhpc.init()
for i in range(1, 4):
    ctx.report(i, {"m": float(i)})
open("ready", "w").close()
while True:
    LOOP
"""
BUSY = "sum(range(1000))"  # pure Python: the main thread runs bytecode
SLEEP = "time.sleep(3600)"  # one long C call: only a real signal interrupts it
SWALLOW = "try:\n        time.sleep(3600)\n    except SystemExit:\n        pass"
GRACE_1S = ("dlhpc.init()", "dlhpc.init(poll_grace_s=1.0)")

POLLING = """
import time, dlhpc
ctx = dlhpc.init(poll_grace_s=1.0)
class State:
    step = 0
    def save(self):
        open("saved", "w").write(str(self.step))
state = State()
open("ready", "w").close()
while True:
    time.sleep(STEP_S)  # one training step
    state.step += 1
    ctx.report(state.step, {"m": 1.0})
    ctx.step(state)
"""


def _trial(tmp_path: Path) -> tuple[Path, Path]:
    tdir = tmp_path / "trial"
    TrialSpec(
        experiment_id=1,
        trial_id=1,
        hparams={},
        max_length=2,
        seed=0,
        experiment_dir=str(tmp_path),
        code_dir=str(tmp_path),
        entry_script=str(tmp_path / "entry.sh"),
        checkpoint_dir=str(tmp_path / "ckpt"),
        metric="m",
        smaller_is_better=True,
    ).write(tdir / "trial.json")
    return tdir, tdir / "attempts" / "local-1_0.r0"


def _start(tmp_path: Path, source: str) -> tuple[subprocess.Popen[str], Path]:
    tdir, attempt = _trial(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(DLHPC_TRIAL_DIR=str(tdir), DLHPC_ATTEMPT_DIR=str(attempt))
    proc = subprocess.Popen(
        [sys.executable, "-c", source],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "script never started"
        time.sleep(0.05)
    return proc, attempt


def _finish(proc: subprocess.Popen[str], within_s: float) -> tuple[int, str, float]:
    """Exit code, stderr and seconds until the process ended (killed after within_s)."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"still running {within_s}s after the stop request:\n{err}") from None
    return proc.returncode, err, time.monotonic() - t0


def _records(attempt: Path) -> list[dict[str, object]]:
    return [r for b in read_event_batches(attempt) for r in b.records]


def _assert_ended_for_requeue(
    code: int, err: str, attempt: Path, what: str, grace: str = "5s"
) -> None:
    line = (
        f"[dlhpc] {what} and the script did not poll within {grace}: exiting"
        if what.startswith("the searcher")
        else f"[dlhpc] {what} and the script did not poll within {grace}: exiting for requeue"
    )
    assert code == 75, err
    assert line in err and "call ctx.step()/should_stop() to checkpoint first" in err, err
    records = _records(attempt)
    assert [r["step"] for r in records if r["type"] == "metric"] == [1, 2, 3]
    logs = [str(r["message"]) for r in records if r["type"] == "log"]
    assert any(line.removeprefix("[dlhpc] ") in m for m in logs), logs


def test_a_script_that_never_polls_ends_soon_after_term(tmp_path: Path) -> None:
    proc, attempt = _start(tmp_path, NON_POLLING.replace("LOOP", BUSY))
    proc.send_signal(signal.SIGTERM)
    code, err, _ = _finish(proc, within_s=20)  # Slurm's KillWait is 30 s by default
    _assert_ended_for_requeue(code, err, attempt, "received TERM")
    assert "did not exit within" not in err  # the main thread exited (SystemExit)


def test_a_script_asleep_in_one_long_call_ends_too(tmp_path: Path) -> None:
    proc, attempt = _start(tmp_path, NON_POLLING.replace("LOOP", SLEEP))
    proc.send_signal(signal.SIGUSR2)
    code, err, _ = _finish(proc, within_s=20)
    _assert_ended_for_requeue(code, err, attempt, "received USR2")


def test_a_script_that_swallows_the_exit_is_ended_anyway(tmp_path: Path) -> None:
    # a grace of 1 s (the default's 5 s is the two tests above): 1 s, then 5 s to exit
    proc, attempt = _start(tmp_path, NON_POLLING.replace("LOOP", SWALLOW).replace(*GRACE_1S))
    proc.send_signal(signal.SIGTERM)
    code, err, _ = _finish(proc, within_s=25)
    _assert_ended_for_requeue(code, err, attempt, "received TERM", grace="1s")
    assert "did not exit within 5s: ending the process" in err


def test_a_stop_decision_ends_a_script_that_never_polls(tmp_path: Path) -> None:
    # busy all the while: a grace of 1 s keeps that short
    proc, attempt = _start(tmp_path, NON_POLLING.replace("LOOP", BUSY).replace(*GRACE_1S))
    (attempt.parent.parent / STOP_FILE).write_text("{}")
    code, err, _ = _finish(proc, within_s=20)  # looked for every 2 s, then 1 s of grace
    _assert_ended_for_requeue(code, err, attempt, "the searcher stopped this trial", grace="1s")


def test_a_polling_script_checkpoints_and_exits_itself(tmp_path: Path) -> None:
    # a step (1.5 s) longer than the grace (1 s): the watchdog waits for twice the
    # longest gap between polls, so the script's own poll comes first
    proc, attempt = _start(tmp_path, POLLING.replace("STEP_S", "1.5"))
    time.sleep(3.5)  # two polls, so that the gap between them is known
    proc.send_signal(signal.SIGTERM)
    code, err, _ = _finish(proc, within_s=20)
    assert code == 75, err
    assert "did not poll" not in err
    saved = int((tmp_path / "saved").read_text())
    records = _records(attempt)
    assert max(int(str(r["step"])) for r in records if r["type"] == "metric") == saved


def test_code_that_replaced_the_handler_handles_stops_itself(tmp_path: Path) -> None:
    # as the plain-script runner does: it reads the stop file and signals its child itself
    source = NON_POLLING.replace(*GRACE_1S)
    source = source.replace(
        'open("ready"',
        'import signal; signal.signal(signal.SIGTERM, lambda *a: None)\nopen("ready"',
    )
    proc, attempt = _start(tmp_path, source.replace("LOOP", BUSY))
    (attempt.parent.parent / STOP_FILE).write_text("{}")
    time.sleep(4.5)  # the stop file is looked for every 2 s, then 1 s of grace
    try:
        assert proc.poll() is None, proc.communicate()[1]
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert "did not poll" not in err, err  # the watchdog stood aside: not a word
