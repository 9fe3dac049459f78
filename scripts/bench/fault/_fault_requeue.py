"""``bench_fault.py requeue``: from the interruption of a running trial on the dev cluster
to the first training step of its next attempt, in parts (the mode's contract is in
``bench_fault.py``'s docstring). Each repetition: launch, wait for the first step, train a
seeded while, signal (or preempt), tick as cron would until the next attempt's first
step, then read the records; its jobs are killed and cancelled whatever happened."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _fault_cluster import Cluster, Interrupted, _first_step_files, _ts, _worker_events
from _fault_common import DIGITS, ENTRY, med, r

REQUEUE_EXPERIMENT = """\
name: bench-fault-{mode}
entrypoint: python {entry} train.py
workdir: {digits}
resources: {{cpus_per_task: 1, mem: 1G, time: '00:10:00', sbatch_args: [{sbatch_args}]}}
hyperparameters:
  lr: 0.01
  hidden: 64
  dropout: 0.1
  batch_size: 64
  step_sleep: {sleep}
searcher: {{name: grid, metric: val_accuracy, smaller_is_better: false, max_length: {epochs}}}
environment:
  vars: {{BENCH_FAULT_OUT: '{out}'}}
max_restarts: 2
"""


@dataclass
class _Rep:
    """One repetition under way: its experiment on cluster ``c``, the folder ``out`` where
    the wrapper writes its records, the ``time.monotonic()`` deadline, and every job id
    it has seen (only these are cancelled at its end)."""

    args: argparse.Namespace
    rep: int
    c: Cluster
    exp_id: int
    out: Path
    deadline: float
    job_ids: set[str] = field(default_factory=set)


def _experiment_yaml(args: argparse.Namespace, work: Path, rep: int, home: Path, out: Path) -> Path:
    """The repetition's experiment file; in ``preempt`` mode pinned to a node nobody else
    uses (waits up to 120 s for one, else Interrupted), so only this trial is preempted."""
    exp_yaml = work / f"exp-{rep}.yaml"
    sbatch_args = ""
    if args.mode == "preempt":  # a node nobody else uses, so that only this trial is preempted
        c0 = Cluster(home, args.interval)
        wait_until = time.monotonic() + 120
        while not (free := [n for n in ("node1", "node2") if not c0.squeue_node(n)]):
            if time.monotonic() > wait_until:
                raise Interrupted("no node free of other jobs to preempt on")
            time.sleep(2)
        sbatch_args = f"'--nodelist={free[-1]}'"
    exp_yaml.write_text(
        REQUEUE_EXPERIMENT.format(
            sbatch_args=sbatch_args,
            mode=args.mode,
            entry=ENTRY,
            digits=DIGITS,
            sleep=args.step_sleep,
            epochs=args.epochs,
            out=out,
        )
    )
    return exp_yaml


def _wait_first_step(rp: _Rep) -> dict[str, Any]:
    """Ticks until the first attempt has trained its first step: the wrapper's record."""
    first: dict[str, Any] | None = None
    while first is None:
        if time.monotonic() > rp.deadline:
            raise RuntimeError("timed out waiting for the first attempt")
        rp.c.maybe_tick()
        files = _first_step_files(rp.out)
        if files:
            first = json.loads(files[0].read_text())
        time.sleep(0.1)
    return first


def _check_running(c: Cluster, a0: dict[str, Any]) -> None:
    """Interrupted unless attempt ``a0`` is still running (nothing stopped it yet)."""
    a0_dir = Path(a0["run_dir"]) / "attempts" / a0["attempt_key"]
    if "exit" in _worker_events(a0_dir) or not c.job_state(a0["job_id"]).startswith("RUN"):
        raise Interrupted(f"{a0['job_id']} stopped before the signal: {c.sacct([a0['job_id']])}")


def _preempt(rp: _Rep, a0: dict[str, Any]) -> tuple[float, float]:
    """A ``high`` job on the trial's node (only when no other job runs there: waits up to
    60 s, else Interrupted). Returns the times before its sbatch and after it returned."""
    c = rp.c
    node = c.squeue(a0["job_id"], "%N")
    wait_until = time.monotonic() + 60
    while others := set(c.squeue_node(node)) - {a0["job_id"]}:
        if time.monotonic() > wait_until:  # never preempt someone else's job
            raise Interrupted(f"node {node} also runs {sorted(others)}: not preempting")
        c.maybe_tick()
        time.sleep(1)
    t_sig = time.time()
    hog = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "high",
            "-w",
            node,
            "-N1",
            "--exclusive",
            "-t",
            "2",
            "--job-name=bench-fault-hog",
            "--output=/dev/null",
            "--wrap",
            f"sleep {rp.args.hog_s}",
        ],
        env=c.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    rp.job_ids.add(hog)
    return t_sig, time.time()


def _send_signal(rp: _Rep, a0: dict[str, Any]) -> tuple[float, float]:
    """``scancel --signal`` TERM or USR2 to attempt ``a0``'s job (Interrupted when it
    fails). Returns the times before scancel and after it returned."""
    sig = "TERM" if rp.args.mode == "term" else "USR2"
    t_sig = time.time()
    if subprocess.run(["scancel", f"--signal={sig}", a0["job_id"]], env=rp.c.env).returncode:
        raise Interrupted(f"scancel --signal {a0['job_id']}: {rp.c.sacct([a0['job_id']])}")
    return t_sig, time.time()


def _wait_next_attempt(
    rp: _Rep, a0: dict[str, Any]
) -> tuple[dict[str, Any], list[tuple[float, str]], float | None]:
    """Ticks until the next attempt has trained its first step. Returns the wrapper's
    record of it, the last attempt's squeue states as they changed (time, state), and the
    end of the tick that first saw the old attempt's exit code (None: none did)."""
    c = rp.c
    states: list[tuple[float, str]] = []
    seen_exit = None
    nxt: dict[str, Any] | None = None
    while nxt is None:
        if time.monotonic() > rp.deadline:
            raise RuntimeError(f"timed out; attempts: {c.attempts(rp.exp_id)}")
        c.maybe_tick()
        rows = c.attempts(rp.exp_id)
        rp.job_ids.update(x["job_id"] for x in rows)
        if seen_exit is None and rows[0]["exit_code"] is not None:
            seen_exit = c.ticks[-1][1]
        st = c.job_state(rows[-1]["job_id"])
        if not states or states[-1][1] != st:
            states.append((time.time(), st))
        for f in _first_step_files(rp.out):
            if f.stem != a0["attempt_key"]:
                nxt = json.loads(f.read_text())
        time.sleep(0.2)
    return nxt, states, seen_exit


def _signal_parts(
    sig: tuple[float, float],
    nxt: dict[str, Any],
    old_progress: dict[str, Any],
    old_atexit: float | None,
    t_exit: float,
) -> dict[str, Any]:
    """From the signal (``sig``: before and after scancel/sbatch) to the old attempt's exit."""
    t_sig, t_sig_done = sig
    return {
        "scancel_s": r(t_sig_done - t_sig),
        "total_signal_to_first_step_s": r(nxt["first_step"] - t_sig),
        "signal_to_checkpoint_done_s": r(old_progress["time"] - t_sig),
        "signal_to_script_atexit_s": r(old_atexit - t_sig) if old_atexit else None,
        "signal_to_exit_record_s": r(t_exit - t_sig),
        "script_teardown_s": r(t_exit - old_atexit) if old_atexit else None,
    }


def _start_parts(nxt: dict[str, Any], t_exit: float, t_start: float) -> dict[str, Any]:
    """From the old attempt's exit to the next attempt's first step (wrapper's record)."""
    return {
        "exit_to_job_start_s": r(t_start - t_exit),
        "job_start_to_python_s": r(nxt["process_created"] - t_start)
        if nxt.get("process_created")
        else None,
        "python_start_to_wrapper_s": r(nxt["wrapper_start"] - nxt["process_created"])
        if nxt.get("process_created")
        else None,
        "imports_s": r(nxt["imports_done"] - nxt["wrapper_start"]),
        "setup_s": r(nxt["restore_start"] - nxt["imports_done"]),
        "restore_s": r(nxt["restore_end"] - nxt["restore_start"]),
        "first_step_s": r(nxt["first_step"] - nxt["restore_end"]),
        "job_start_to_first_step_s": r(nxt["first_step"] - t_start),
    }


def _old_attempt_files(
    rp: _Rep, run_dir: Path, a0: dict[str, Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any], float | None]:
    """The old attempt's worker events, its progress.json, and the wrapper's atexit time."""
    old = _worker_events(run_dir / "attempts" / a0["attempt_key"])
    old_progress = json.loads(
        (run_dir / "attempts" / a0["attempt_key"] / "progress.json").read_text()
    )
    old_atexit_f = rp.out / f"{a0['attempt_key']}.exit.json"
    old_atexit = json.loads(old_atexit_f.read_text())["atexit"] if old_atexit_f.exists() else None
    return old, old_progress, old_atexit


def _result(
    rp: _Rep,
    a0: dict[str, Any],
    first: dict[str, Any],
    nxt: dict[str, Any],
    sig: tuple[float, float],
    states: list[tuple[float, str]],
    seen_exit: float | None,
) -> dict[str, Any]:
    """The repetition's JSON record, read from the database, the attempts' folders and the
    wrapper's records once the next attempt has trained its first step."""
    c, args, t_sig = rp.c, rp.args, sig[0]
    rows = c.attempts(rp.exp_id)
    run_dir = Path(rows[0]["run_dir"])
    old, old_progress, old_atexit = _old_attempt_files(rp, run_dir, a0)
    new = _worker_events(run_dir / "attempts" / nxt["attempt"])
    t_exit = old["exit"]["time"]
    t_start = new["start"]["time"]
    res: dict[str, Any] = {
        "rep": rp.rep,
        "experiment_id": rp.exp_id,
        "jobs": sorted(rp.job_ids),
        "old_attempt": a0["attempt_key"],
        "new_attempt": nxt["attempt"],
        "old_exit": {
            k: old["exit"].get(k) for k in ("code", "reason", "signal", "step", "checkpoint_step")
        },
        "restored_step": nxt.get("restored_step"),
        "first_new_step": nxt.get("first_step_no"),
        **_signal_parts(sig, nxt, old_progress, old_atexit, t_exit),
        **_start_parts(nxt, t_exit, t_start),
        "squeue_states": [(r(t - t_sig, 1), s) for t, s in states],
        "attempt_rows": len(rows),
        # the reconciler's accounting of the interrupted attempt
        "db_old_attempt": {k: rows[0].get(k) for k in ("cause", "lost_steps", "exit_reason")},
        # nothing else (e.g. someone's preemption) interrupted this rep
        "clean": old["exit"].get("signal") == ("USR2" if args.mode == "usr2" else "TERM")
        and old["exit"]["time"] > t_sig
        and len(rows) <= 2
        and nxt.get("restored_step") == old["exit"].get("checkpoint_step"),
    }
    first_start = _worker_events(run_dir / "attempts" / a0["attempt_key"]).get("start")
    if first_start and first:
        res["first_attempt_job_start_to_first_step_s"] = r(
            first["first_step"] - first_start["time"]
        )
        res["first_attempt_imports_s"] = r(first["imports_done"] - first["wrapper_start"])
    res["sacct"] = c.sacct(sorted(rp.job_ids))
    if args.mode != "usr2":
        t_resubmit = _ts(rows[-1]["created_at"])  # recorded right after sbatch returned
        res["exit_to_reconciler_notice_s"] = r(seen_exit - t_exit) if seen_exit else None
        res["exit_to_resubmit_s"] = r(t_resubmit - t_exit) if t_resubmit else None
        res["resubmit_to_job_start_s"] = r(t_start - t_resubmit) if t_resubmit else None
    return res


def _requeue_rep(args: argparse.Namespace, work: Path, rep: int) -> dict[str, Any]:
    """One repetition (Interrupted when something else stopped the trial); whatever
    happens, its experiment is killed and its jobs cancelled."""
    home, out = work / f"home-{rep}", work / f"out-{rep}"
    out.mkdir(parents=True)
    exp_yaml = _experiment_yaml(args, work, rep, home, out)
    c = Cluster(home, args.interval)
    exp_id = json.loads(c.dlhpc("launch", str(exp_yaml), "--json"))["experiment_id"]
    rp = _Rep(args, rep, c, exp_id, out, deadline=time.monotonic() + args.timeout)
    try:
        # 1. wait for the first attempt's first step, then a seeded random part of an epoch
        first = _wait_first_step(rp)
        a0 = c.attempts(exp_id)[0]
        rp.job_ids.add(a0["job_id"])
        time.sleep(args.delay + random.Random(args.seed * 1000 + rep).uniform(0, 1.0))
        _check_running(c, a0)
        # 2. the signal
        sig = _preempt(rp, a0) if args.mode == "preempt" else _send_signal(rp, a0)
        # the reconciler's phase relative to the signal is random, as with cron
        phase_rng = random.Random(args.seed * 7919 + rep)
        c.next_tick_in(phase_rng.uniform(0.0, args.interval))
        # 3. tick until the next attempt has trained its first step
        nxt, states, seen_exit = _wait_next_attempt(rp, a0)
        return _result(rp, a0, first, nxt, sig, states, seen_exit)
    finally:
        try:
            c.dlhpc("kill", str(exp_id))
        except RuntimeError as err:
            print(f"kill {exp_id}: {err}", file=sys.stderr)
        ids = sorted({j for j in rp.job_ids if j})
        if ids:  # only this rep's jobs
            subprocess.run(["scancel", *ids], env=c.env, check=False)


def cmd_requeue(args: argparse.Namespace) -> dict[str, Any]:
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit('requeue needs the dev cluster: eval "$(scripts/dev-cluster env)"')
    work = Path(tempfile.mkdtemp(prefix="dlhpc-bench-requeue-"))
    reps: list[dict[str, Any]] = []
    discarded: list[str] = []
    tries = 0
    while len(reps) < args.reps and tries < 3 * args.reps:
        try:
            res = _requeue_rep(args, work, tries)
        except Interrupted as err:  # someone else's preemption or cancel hit this rep
            discarded.append(str(err))
            print(f"rep {tries} discarded: {err}", file=sys.stderr, flush=True)
        else:
            print(json.dumps(res), file=sys.stderr, flush=True)
            if res["clean"]:
                reps.append(res)
            else:
                discarded.append(json.dumps(res))
        tries += 1
    if not reps:
        raise SystemExit(f"no clean repetition in {tries} tries: {discarded}")
    keys = [k for k, v in reps[0].items() if k.endswith("_s") and isinstance(v, (int, float))]
    return {
        "mode": args.mode,
        "interval_s": args.interval,
        "step_sleep": args.step_sleep,
        "medians": {k: r(med([x[k] for x in reps if x.get(k) is not None])) for k in keys},
        "reps": reps,
        "discarded": discarded,
        "work_dir": str(work),  # DLHPC_HOMEs (database, run folders, job logs) of each repetition
    }
