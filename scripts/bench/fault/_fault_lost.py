"""``bench_fault.py lost``: work lost per SIGTERM, and checkpoint save/restore times.

Runs ``bench_fault_train.py`` as a plain process in a fake trial folder, SIGTERMs it at a
seeded moment after the first epoch checkpoint, then resumes it for one step; the harness
arm (a checkpoint at the stop) and the epoch-only arm side by side (the mode's contract is
in ``bench_fault.py``'s docstring)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _fault_common import GRACE_TIME_S, TRAINER, fake_trial, med, r

LOST_MODELS: dict[str, dict[str, Any]] = {
    # the digits example's defaults (train.py DEFAULTS), 23 steps an epoch
    "digits": {
        "hparams": {"model": "digits", "lr": 1e-2, "hidden": 64, "dropout": 0.1, "batch_size": 64},
        "max_length": 100_000,
    },
    # 1024 -> 4096 -> 4096 -> 4096 -> 10: 37.8 M parameters, 151 MB fp32, +302 MB Adam state
    "synthetic": {
        "hparams": {
            "model": "synthetic",
            "in_dim": 1024,
            "width": 4096,
            "depth": 3,
            "batch_size": 8,
            "lr": 1e-4,
            "steps_per_epoch": 8,
        },
        "max_length": 10_000,
    },
}


def _read_log(path: Path) -> list[dict[str, Any]]:
    """The trainer's JSON-lines log so far (a line being written is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            out.append(json.loads(line))
    return out


def _spawn(
    trial_dir: Path, attempt: str, log: Path, exit_after: int = 0
) -> subprocess.Popen[bytes]:
    """The trainer as a plain process, in attempt ``attempt`` of ``trial_dir``, one thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLHPC_", "SLURM_"))}
    env.update(
        DLHPC_TRIAL_DIR=str(trial_dir),
        DLHPC_ATTEMPT_DIR=str(trial_dir / "attempts" / attempt),
        SLURM_CPUS_PER_TASK="1",
        OMP_NUM_THREADS="1",
        BENCH_FAULT_LOG=str(log),
        BENCH_FAULT_EXIT_AFTER=str(exit_after),
        PYTHONUNBUFFERED="1",
    )
    return subprocess.Popen(
        [sys.executable, str(TRAINER)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log.with_suffix(".err"), "wb"),  # noqa: SIM115
    )


def _kill_run(
    trial_dir: Path, log1: Path, phase: float, timeout: float
) -> tuple[float, float, float, int, float]:
    """The first run: spawned, SIGTERMed ``phase`` epochs after its first epoch checkpoint,
    waited for. Returns (spawn time, epoch seconds, kill time, exit code, exit time)."""
    t_spawn1 = time.time()
    p = _spawn(trial_dir, "1.r0", log1)
    deadline = time.monotonic() + timeout
    first_ckpt = None
    while first_ckpt is None:
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            err = log1.with_suffix(".err").read_text()[-2000:]
            raise RuntimeError(f"trainer exited early ({p.returncode}): {err}")
        time.sleep(0.005)
        first_ckpt = next((e for e in _read_log(log1) if e["ev"] == "ckpt"), None)
    ev = _read_log(log1)
    epoch_s = first_ckpt["t1"] - next(e for e in ev if e["ev"] == "restore")["t1"]
    time.sleep(phase * epoch_s)
    t_kill = time.time()
    os.kill(p.pid, signal.SIGTERM)
    rc1 = p.wait(timeout=timeout)
    t_exit = time.time()
    return t_spawn1, epoch_s, t_kill, rc1, t_exit


def _resume_run(trial_dir: Path, log2: Path, timeout: float) -> tuple[float, int, list[Any]]:
    """The second run, which resumes and exits after its first step. Returns (spawn time,
    exit code, its log); RuntimeError when it exits non-zero or without a step."""
    t_spawn2 = time.time()
    p2 = _spawn(trial_dir, "1.r1", log2, exit_after=1)
    rc2 = p2.wait(timeout=timeout)
    ev2 = _read_log(log2)
    if rc2 != 0 or not any(e["ev"] == "step" for e in ev2):
        err = log2.with_suffix(".err").read_text()[-3000:]
        raise RuntimeError(f"resume exited {rc2} without a step: {err}")
    return t_spawn2, rc2, ev2


def _resume_times(ev2: list[dict[str, Any]], t_spawn2: float) -> dict[str, Any]:
    """The parts of the way from the resume's spawn to its first step, in seconds."""
    start2 = next(e for e in ev2 if e["ev"] == "start")
    setup2 = next(e for e in ev2 if e["ev"] == "setup")
    rest2 = next(e for e in ev2 if e["ev"] == "restore")
    first2 = next(e for e in ev2 if e["ev"] == "step")
    return {
        "spawn_to_first_step_s": r(first2["t"] - t_spawn2),
        "spawn_to_script_s": r(start2["t_start"] - t_spawn2),
        "imports_and_init_s": r(setup2["t"] - start2["t_start"]),
        "restore_s": r(rest2["t1"] - rest2["t0"]),
        "first_step_s": r(first2["t"] - rest2["t1"]),
    }


def _lost_run(
    root: Path, model: str, stop_ckpt: bool, phase: float, timeout: float
) -> dict[str, Any]:
    """One kill and one resume; ``phase`` in epochs after the first epoch checkpoint."""
    spec = LOST_MODELS[model]
    trial_dir = fake_trial(
        root, {**spec["hparams"], "stop_checkpoint": stop_ckpt}, spec["max_length"]
    )
    log1, log2 = root / "run1.jsonl", root / "run2.jsonl"
    t_spawn1, epoch_s, t_kill, rc1, t_exit = _kill_run(trial_dir, log1, phase, timeout)

    ev = _read_log(log1)
    steps = [e for e in ev if e["ev"] == "step"]
    ckpts = [e for e in ev if e["ev"] == "ckpt"]
    last = steps[-1]
    done_at_kill = max((e["step"] for e in steps if e["t"] <= t_kill), default=0)
    stop_seen = next((e for e in ev if e["ev"] == "stop_seen"), None)
    stop_ck = next((c for c in ckpts if c["stop"]), None)
    at_exit = next((e for e in ev if e["ev"] == "atexit_last"), None)  # then interpreter teardown

    t_spawn2, rc2, ev2 = _resume_run(trial_dir, log2, timeout)
    restored = next(e for e in ev2 if e["ev"] == "restore")["step"]
    first_step_no = next(e for e in ev2 if e["ev"] == "step")["step"]
    lost_steps = max(0, last["step"] - restored)
    src = next((c for c in reversed(ckpts) if c["step"] == restored), None)
    lost_s = (
        max(0.0, last["t"] - src["t1"])
        if (src and lost_steps)
        else (last["t"] - t_spawn1 if lost_steps else 0.0)
    )
    return {
        "arm": "harness" if stop_ckpt else "epoch_only",
        "phase_epochs": round(phase, 3),
        "epoch_s": r(epoch_s),
        "exit_code": rc1,
        "steps_done_at_signal": done_at_kill,
        "last_step_trained": last["step"],
        "restored_step": restored,
        "steps_lost": lost_steps,
        "seconds_lost": r(lost_s),
        "signal_to_exit_s": r(t_exit - t_kill),
        "signal_to_step_end_s": r(stop_seen["t"] - t_kill) if stop_seen else None,
        "stop_checkpoint_s": r(stop_ck["t1"] - stop_ck["t0"]) if stop_ck else None,
        "atexit_to_exit_s": r(t_exit - at_exit["t"]) if at_exit else None,
        "checkpoint_bytes": (stop_ck or ckpts[-1])["bytes"],
        "epoch_checkpoint_s": [r(c["t1"] - c["t0"]) for c in ckpts if not c["stop"]],
        "resume_exit_code": rc2,
        "resume": _resume_times(ev2, t_spawn2),
        "resume_correct": first_step_no == restored + 1,
    }


def _arm_summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs ``rs`` of one arm: medians and the values behind them."""
    return {
        "runs": len(rs),
        "steps_lost_median": med([x["steps_lost"] for x in rs]),
        "steps_lost": [x["steps_lost"] for x in rs],
        "seconds_lost_median": r(med([x["seconds_lost"] for x in rs])),
        "seconds_lost": [x["seconds_lost"] for x in rs],
        "signal_to_exit_s_median": r(med([x["signal_to_exit_s"] for x in rs])),
        "signal_to_exit_s": [x["signal_to_exit_s"] for x in rs],
        "stop_checkpoint_s_median": r(med([x["stop_checkpoint_s"] for x in rs])),
        "restart_to_first_step_s_median": r(
            med([x["resume"]["spawn_to_first_step_s"] for x in rs])
        ),
        "restore_s_median": r(med([x["resume"]["restore_s"] for x in rs])),
        "exit_codes": sorted({x["exit_code"] for x in rs}),
        "resumed_at_next_step": all(x["resume_correct"] for x in rs),
    }


def _model_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One model's result: checkpoint save/restore times, each arm's summary, the runs."""
    summary = {
        arm: _arm_summary([x for x in runs if x["arm"] == arm]) for arm in ("harness", "epoch_only")
    }
    saves = [s for x in runs for s in x["epoch_checkpoint_s"]] + [
        x["stop_checkpoint_s"] for x in runs if x["stop_checkpoint_s"] is not None
    ]
    size = runs[0]["checkpoint_bytes"]
    return {
        "checkpoint_bytes": size,
        "save_s_median": r(med(saves), 4),
        "saves_timed": len(saves),
        "save_MB_per_s": r(size / 1e6 / med(saves), 1) if saves and med(saves) else None,
        "restore_s_median": r(med([x["resume"]["restore_s"] for x in runs]), 4),
        "epoch_s_median": r(med([x["epoch_s"] for x in runs])),
        "harness_exit_within_grace": all(
            x["signal_to_exit_s"] < GRACE_TIME_S for x in runs if x["arm"] == "harness"
        ),
        **summary,
        "runs": runs,
    }


def cmd_lost(args: argparse.Namespace) -> dict[str, Any]:
    """The ``lost`` mode (``--models``, ``--reps``, ``--reps-synthetic``, ``--seed``,
    ``--timeout``): its JSON result, without the fields every mode shares; each run is
    also printed to stderr as it ends."""
    rng = random.Random(args.seed)
    out: dict[str, Any] = {"seed": args.seed, "grace_time_s": GRACE_TIME_S, "models": {}}
    for model in args.models:
        reps = args.reps if model == "digits" else args.reps_synthetic
        runs = []
        for rep in range(reps):
            phase = rng.uniform(0.0, 2.0)  # the same moment (in epochs) for both arms
            arms = (True, False) if rep % 2 == 0 else (False, True)
            for stop_ckpt in arms:
                with tempfile.TemporaryDirectory(prefix="dlhpc-bench-fault-") as tmp:
                    run = _lost_run(Path(tmp), model, stop_ckpt, phase, args.timeout)
                run["rep"] = rep
                runs.append(run)
                print(json.dumps({"model": model, **run}), file=sys.stderr, flush=True)
        out["models"][model] = _model_summary(runs)
    return out
