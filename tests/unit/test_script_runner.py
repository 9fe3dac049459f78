"""The plain-script runner with a real child process: argv, metrics, checkpoints, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dlhpc.protocol import TrialSpec, read_event_batches, request_stop
from dlhpc.protocol.checkpoint import latest_verified, list_checkpoints

# A plain script (no dlhpc import): records its argv and signals, prints its loss, writes
# JSONL metrics and checkpoints (temp name + rename), resumes from --resume, and with
# --wait blocks after its epochs until a signal (TERM: exit 1; USR2: noted, keeps waiting).
SCRIPT = r"""
import argparse, json, os, signal, sys, time
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
p.add_argument("--name", default="")
p.add_argument("--epochs", type=int)
p.add_argument("--ckpt-dir")
p.add_argument("--resume", default="")
p.add_argument("--wait", action="store_true")
p.add_argument("--fail", type=int, default=0)
a = p.parse_args()
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen")
os.makedirs(out, exist_ok=True)
def note(kind, value):
    with open(os.path.join(out, kind), "a") as f:
        f.write(json.dumps(value) + "\n")
note("argv", sys.argv[1:])
def on(signum, frame):
    note("signals", signal.Signals(signum).name)
    if signum == signal.SIGTERM:
        sys.exit(1)
signal.signal(signal.SIGTERM, on)
signal.signal(signal.SIGUSR2, on)
start = 0
if a.resume:
    start = json.load(open(a.resume))["epoch"]
    print(f"resumed at epoch {start}", flush=True)
for epoch in range(start + 1, a.epochs + 1):
    loss = a.lr / epoch
    print(f"epoch {epoch} val_loss={loss!r}", flush=True)
    with open(os.environ["DLHPC_METRICS_FILE"], "a") as f:
        f.write(json.dumps({"step": epoch, "acc": epoch / 10}) + "\n")
    tmp = os.path.join(a.ckpt_dir, ".epoch.tmp")
    with open(tmp, "w") as f:
        json.dump({"epoch": epoch}, f)
    os.replace(tmp, os.path.join(a.ckpt_dir, f"epoch-{epoch}.json"))
if a.wait:
    note("signals", "WAITING")
    while True:
        time.sleep(0.05)
sys.exit(a.fail)
"""
PATTERN = r"epoch (?P<step>\d+) val_loss=(?P<val_loss>\S+)"
TEMPLATE = [
    "{python}",
    "train.py",
    "--lr={lr}",
    "--name",
    "{name}",
    "--epochs",
    "{max_length}",
    "--ckpt-dir",
    "{checkpoint_dir}",
    "--resume",
    "{checkpoint}",
]


def _trial(tmp_path: Path, hparams: dict[str, Any], max_length: int = 3) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(SCRIPT)
    tdir = tmp_path / "trial"
    TrialSpec(
        experiment_id=1,
        trial_id=7,
        hparams={"python": sys.executable, **hparams},
        max_length=max_length,
        seed=3,
        experiment_dir=str(tmp_path),
        code_dir=str(code),
        entry_script="",
        checkpoint_dir=str(tmp_path / "ckpt"),
        metric="val_loss",
        smaller_is_better=True,
    ).write(tdir / "trial.json")
    return tdir


def _start(tmp_path: Path, tdir: Path, attempt: str, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(DLHPC_TRIAL_DIR=str(tdir), DLHPC_ATTEMPT_DIR=str(tdir / attempt))
    argv = [sys.executable, "-m", "dlhpc.integrations.script", "--metrics-pattern", PATTERN]
    return subprocess.Popen(
        [*argv, "--", *TEMPLATE, *extra],
        cwd=tmp_path / "code",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _records(attempt: Path, kind: str) -> list[dict[str, Any]]:
    return [r for b in read_event_batches(attempt) for r in b.records if r["type"] == kind]


def _seen(tmp_path: Path, kind: str) -> list[Any]:
    path = tmp_path / "code" / "seen" / kind
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wait_for(tmp_path: Path, kind: str, value: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while value not in _seen(tmp_path, kind):
        assert time.monotonic() < deadline, f"{kind}: {_seen(tmp_path, kind)}"
        time.sleep(0.05)


def test_hostile_values_reach_the_script_as_single_argv_items(tmp_path: Path) -> None:
    evil = "a b; $(touch PWNED) `touch PWNED2` 'q' \"d\" > x | y"
    tdir = _trial(tmp_path, {"lr": 0.5, "name": evil}, max_length=1)
    proc = _start(tmp_path, tdir, "a1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    (argv,) = _seen(tmp_path, "argv")
    ckpt_dir = str(tmp_path / "ckpt" / "script")
    assert argv == [
        "--lr=0.5",
        "--name",
        evil,
        "--epochs",
        "1",
        "--ckpt-dir",
        ckpt_dir,
        "--resume",
        "",
    ]
    assert not list(tmp_path.rglob("PWNED*"))
    assert "epoch 1 val_loss=0.5\n" in out  # stdout is echoed through


def test_metrics_from_stdout_and_jsonl_and_checkpoints_then_resume(tmp_path: Path) -> None:
    tdir = _trial(tmp_path, {"lr": 0.5, "name": "x"}, max_length=3)
    proc = _start(tmp_path, tdir, "a1")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    metrics = _records(tdir / "a1", "metric")
    by_step: dict[int, dict[str, float]] = {}
    for r in metrics:
        by_step.setdefault(r["step"], {}).update(r["metrics"])
    assert by_step == {e: {"val_loss": 0.5 / e, "acc": e / 10} for e in (1, 2, 3)}
    steps = sorted(r["step"] for r in _records(tdir / "a1", "checkpoint"))
    assert steps == [1, 2, 3]  # each epoch's file, registered once, step from its name
    newest, torn = latest_verified(tmp_path / "ckpt")
    assert newest is not None and not torn and newest.metadata == {"script_entry": "epoch-3.json"}
    # a promotion to 5 epochs resumes from the registered epoch 3
    tdir = _trial(tmp_path, {"lr": 0.5, "name": "x"}, max_length=5)
    proc = _start(tmp_path, tdir, "a2")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "resumed at epoch 3" in out
    assert _seen(tmp_path, "argv")[-1][-1] == str(newest.path / "epoch-3.json")
    assert sorted(r["step"] for r in _records(tdir / "a2", "metric")) == [4, 4, 5, 5]
    assert [c.step for c in list_checkpoints(tmp_path / "ckpt")] == [5, 4, 3, 2, 1]


def test_term_and_usr2_are_forwarded_and_the_runner_exits_for_requeue(tmp_path: Path) -> None:
    tdir = _trial(tmp_path, {"lr": 0.5, "name": "x"}, max_length=2)
    proc = _start(tmp_path, tdir, "a1", "--wait")
    _wait_for(tmp_path, "signals", "WAITING")
    time.sleep(2.5)  # two looks a second apart: the checkpoints are complete
    proc.send_signal(signal.SIGUSR2)
    _wait_for(tmp_path, "signals", "SIGUSR2")
    assert proc.poll() is None  # USR2 is the script's to handle
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert _seen(tmp_path, "signals") == ["WAITING", "SIGUSR2", "SIGTERM"]
    assert proc.returncode == 75, err  # the script exited 1 after TERM: requeue
    assert "the script ended with 1 after USR2" in err
    assert [r["step"] for r in _records(tdir / "a1", "checkpoint")] == [1, 2]


def test_a_stop_decision_is_a_term_to_the_script(tmp_path: Path) -> None:
    tdir = _trial(tmp_path, {"lr": 0.5, "name": "x"}, max_length=1)
    proc = _start(tmp_path, tdir, "a1", "--wait")
    _wait_for(tmp_path, "signals", "WAITING")
    request_stop(tdir)
    _, err = proc.communicate(timeout=30)
    assert _seen(tmp_path, "signals") == ["WAITING", "SIGTERM"]
    assert proc.returncode == 75, err
    assert "the searcher stopped this trial" in err


def test_a_failing_script_keeps_its_code_and_an_unconfirmed_checkpoint_is_not_registered(
    tmp_path: Path,
) -> None:
    tdir = _trial(tmp_path, {"lr": 0.5, "name": "x"}, max_length=1)
    (tmp_path / "ckpt" / "script").mkdir(parents=True)
    proc = _start(tmp_path, tdir, "a1", "--fail", "3")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    # it failed before a second look: its checkpoint is not known to be complete
    assert _records(tdir / "a1", "checkpoint") == []
    assert (tmp_path / "ckpt" / "script" / "epoch-1.json").exists()


def test_outside_a_job_the_runner_says_so_and_exits_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLHPC_")}
    proc = subprocess.run(
        [sys.executable, "-m", "dlhpc.integrations.script", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "not inside a dlhpc job" in proc.stderr


def test_a_child_holding_stdout_does_not_keep_the_runner_after_the_script_exits(
    tmp_path: Path,
) -> None:
    tdir = _trial(tmp_path, {"lr": 0.5, "name": "x"}, max_length=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(DLHPC_TRIAL_DIR=str(tdir), DLHPC_ATTEMPT_DIR=str(tdir / "a1"))
    pgid = tmp_path / "pgid"
    shell = f"echo $$ > {pgid}; sleep 120 & echo 'epoch 1 val_loss=0.5'"
    argv = [sys.executable, "-m", "dlhpc.integrations.script", "--metrics-pattern", PATTERN]
    proc = subprocess.Popen(
        [*argv, "--", "sh", "-c", shell], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        out, _ = proc.communicate(timeout=60)  # the sleep would hold it for 120 s
    finally:
        os.killpg(int(pgid.read_text()), signal.SIGKILL)
    assert proc.returncode == 0 and "epoch 1 val_loss=0.5" in out
    assert [r["metrics"] for r in _records(tdir / "a1", "metric")] == [{"val_loss": 0.5}]
