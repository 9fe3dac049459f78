"""The crash-and-concurrency stress run (used by test_stress.py).

Writers are forked processes, one per trial ("array tasks in spirit"), each with
its own attempt folder, publishing through the real in-job code
(:class:`dlhpc.harness.context.TrialContext`: metric and log event files, and
checkpoints through :func:`dlhpc.protocol.checkpoint.publish_checkpoint` with their
``checkpoint`` events). Reconcilers are separate processes running the real
``dlhpc tick`` command in a loop (``_reconciler.py``). A killer SIGKILLs writers
and reconcilers at random and restarts the reconcilers. The only fake is the
scheduler backend (``_backend.py``).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from dlhpc.harness.context import TrialContext
from dlhpc.orchestrator import tick
from dlhpc.protocol import TrialSpec
from dlhpc.protocol.checkpoint import Checkpoint, publish_checkpoint
from dlhpc.store import Store
from tests.stress._backend import LEDGER, REPO, TrialRun, launch_stress, stress_pool
from tests.stress._verify import StressResult, check

# --- writers -------------------------------------------------------------------


class _Weights:
    """A Saveable whose checkpoint is one small payload file (no torch)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.step = 0

    def save(self) -> Checkpoint:
        def write(folder: Path) -> None:
            (folder / "weights.bin").write_bytes(os.urandom(2048))

        return publish_checkpoint(self.root, self.step, write, {"step": self.step})


def _ledger(fd: int, line: str) -> None:
    """Append + fsync: only after the publication it records has completed."""
    os.write(fd, (line + "\n").encode())
    os.fsync(fd)


def writer_main(run: TrialRun, events: int, ckpt_every: int, seed: int) -> None:
    """Publish ``events`` steps (a metric and a log line each) in random batches,
    a checkpoint every ``ckpt_every`` steps; ledger lines: ``m N`` (everything up
    to step N is published) and ``c N`` (the checkpoint of step N is published)."""
    rng = random.Random(seed)
    spec = TrialSpec.read(run.trial_dir / "trial.json")
    ctx = TrialContext(spec, run.attempt_dir, spec.hparams, 10**9, 1e9, run.trial_dir)
    weights = _Weights(Path(spec.checkpoint_dir))
    fd = os.open(run.trial_dir / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for step in range(1, events + 1):
        ctx.report(step, {"loss": run.trial_id + step / 1000})
        ctx.log("info", f"trial {run.trial_id} step {step}")
        if step % ckpt_every == 0:
            weights.step = step
            ctx.checkpoint(weights)  # flushes the metrics first, then the checkpoint event
            _ledger(fd, f"m {step}")
            _ledger(fd, f"c {step}")
        elif rng.random() < 0.4 or step == events:
            ctx.flush()
            _ledger(fd, f"m {step}")
        time.sleep(rng.uniform(0.0, 0.3))
    os.close(fd)


def _writer_entry(run: TrialRun, events: int, ckpt_every: int, seed: int, gate: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # the context echoes log lines to stderr
    # compute nodes do not take CPU from the login node: here they must not starve the
    # reconcilers either, or the killer would only ever hit them starting up
    os.nice(19)
    os.read(gate, 1)  # every writer starts at once
    writer_main(run, events, ckpt_every, seed)
    os._exit(0)  # skip atexit (the context's flush): only what the ledger says is published


# --- reconcilers ---------------------------------------------------------------


def report_file(logs: Path, n: int) -> Path:
    """Where the ``n``-th reconciler started writes its reports."""
    return logs / f"reconciler-{n}.log"


def start_reconciler(home: Path, logs: Path, n: int, loop_s: float) -> subprocess.Popen[bytes]:
    """``dlhpc tick --json --loop LOOP_S`` (its reports go to :func:`report_file`)."""
    env = {
        **os.environ,
        "DLHPC_HOME": str(home),
        "DLHPC_SITE": "local",
        "PYTHONPATH": str(REPO),
        "STRESS_READY_DIR": str(logs),
    }
    args = ["tick", "--json", "--loop", str(loop_s)]
    with open(report_file(logs, n), "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.stress._reconciler", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def read_reconciler_log(text: str, res: StressResult) -> None:
    """Count a reconciler's passes from its JSON reports; anything else is a problem
    (the last report may be cut short by the kill)."""
    dec = json.JSONDecoder()
    pos = 0
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        try:
            report, pos = dec.raw_decode(text, pos)
        except ValueError:
            if text[pos] != "{":
                res.problems.append(f"reconciler said: {text[pos : pos + 2000]}")
            break  # else: the report the kill cut short
        res.reconciler_passes += 1
        res.passes_lease_held += bool(report["lease_held_elsewhere"])
        if report["errors"]:
            res.problems.append(f"reconciler errors: {report['errors']}")


# --- the run -------------------------------------------------------------------


def run_stress(
    root: Path,
    *,
    writers: int = 256,
    events: int = 12,
    ckpt_every: int = 5,
    reconcilers: int = 3,
    kill_writers: float = 0.25,
    reconciler_life_s: float = 4.0,
    loop_s: float = 0.2,
    seed: int = 0,
) -> StressResult:
    """Run the writers, reconcilers and killer; then one clean tick and the checks."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    home, runs = launch_stress(root, writers)
    logs = root / "logs"
    logs.mkdir()
    res = StressResult(writers=writers, reconcilers=reconcilers)
    recs = [start_reconciler(home, logs, i, loop_s) for i in range(reconcilers)]
    res.reconciler_starts = reconcilers
    report_of = {r.pid: report_file(logs, i) for i, r in enumerate(recs)}
    gate, release = os.pipe()
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_writer_entry, args=(run, events, ckpt_every, seed * 100_003 + i, gate))
        for i, run in enumerate(runs)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 60
    while not all((logs / str(r.pid)).exists() for r in recs) and time.monotonic() < deadline:
        time.sleep(0.05)  # the reconcilers are up before the writers start
    os.write(release, b"x" * writers)
    os.close(gate)
    os.close(release)
    t_writers = time.monotonic()
    # each victim dies at a random moment of its expected life (0.15 s of sleep per step)
    doomed = {
        i: t_writers + rng.uniform(0.0, events * 0.15)
        for i in rng.sample(range(writers), int(writers * kill_writers))
    }
    # reconciler pid -> when: a random moment once its first pass has ended (its first
    # report), so that each one ingests while the writers write however loaded the machine
    # is; later kills land anywhere in a pass
    kill_at: dict[int, float] = {}
    while any(p.is_alive() for p in procs):
        now = time.monotonic()
        for i in [i for i, at in doomed.items() if now >= at]:
            del doomed[i]
            if procs[i].is_alive() and procs[i].pid is not None:
                os.kill(procs[i].pid, signal.SIGKILL)
                res.writers_killed += 1
        for k, r in enumerate(recs):
            if r.pid not in kill_at and report_of[r.pid].stat().st_size > 0:
                kill_at[r.pid] = now + rng.uniform(0.0, reconciler_life_s)
            if now >= kill_at.get(r.pid, math.inf):
                r.kill()
                r.wait()  # reaped: a zombie would still look alive to the lease
                res.reconcilers_killed += 1
                recs[k] = start_reconciler(home, logs, res.reconciler_starts, loop_s)
                report_of[recs[k].pid] = report_file(logs, res.reconciler_starts)
                res.reconciler_starts += 1
        time.sleep(0.02)
    res.writer_phase_s = time.monotonic() - t_writers
    for p in procs:
        p.join()
        if p.exitcode not in (0, -signal.SIGKILL):
            res.problems.append(f"writer pid {p.pid} exited {p.exitcode}")
    time.sleep(rng.uniform(0.0, 2 * loop_s))  # the last kills land anywhere in a pass
    for r in recs:
        r.kill()
        r.wait()
        res.reconcilers_killed += 1
    for log in sorted(logs.glob("reconciler-*.log")):
        read_reconciler_log(log.read_text(errors="replace"), res)
    final_tick(home, res)
    check(home, runs, res)
    res.files_by_reconcilers = res.files_published - res.files_by_final_tick
    res.seconds = time.monotonic() - t0
    return res


def final_tick(home: Path, res: StressResult) -> None:
    store = Store(home)
    try:
        report = tick(store, stress_pool(home))
    finally:
        store.close()
    res.files_by_final_tick = report.ingested_files
    if report.lease_held_elsewhere or report.errors:
        res.problems.append(
            f"final tick: lease held {report.lease_held_elsewhere}, {report.errors}"
        )
