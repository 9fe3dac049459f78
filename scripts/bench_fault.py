#!/usr/bin/env python3
"""Benchmark: fault tolerance of the in-job harness (issue 3). Prints a JSON summary.

    . .venv/bin/activate
    python scripts/bench_fault.py overhead            # harness step overhead vs the bare loop
    python scripts/bench_fault.py lost                # work lost per SIGTERM, checkpoint times
    eval "$(scripts/dev-cluster env)"
    python scripts/bench_fault.py requeue             # signal -> first step of the next attempt

``overhead`` runs in this process, one torch thread: a bare training loop and the same loop
with ``ctx.report(step, ...)`` and ``ctx.step(state)`` every step (in a fake trial folder), for
a tiny model (the per-call cost shows) and a digits-sized MLP. Interleaved two ways: blocks of
``--block`` steps (A/B, then B/A; block medians, means and thread-CPU means, paired by round)
and single steps in turn (medians per arm: robust on a noisy machine). Plus the cost per call
of each API alone, and of one flush of 1000 buffered records; ``estimate`` = the alternating
steps' median difference + that flush spread over its 1000 steps.

``lost`` runs ``scripts/bench_fault_train.py`` as a plain process in a fake trial folder,
SIGTERMs it at a seeded random moment (uniform over two epochs, after the first epoch
checkpoint), waits for the exit, then runs it again to resume (and stop after its first
step). Two arms side by side, with the same moments: the harness (``ctx.step(state)``: a
checkpoint at the stop) and a baseline that checkpoints only at epoch ends
(``ctx.step(None)``: exits without one). For the digits example and a synthetic ~38 M
parameter MLP with Adam (a ~450 MB checkpoint).

``requeue`` needs the dev cluster: launches the digits example (one trial, through
``dlhpc launch``; the entrypoint runs train.py under ``scripts/bench_fault_entry.py``, which
only timestamps it), ticks (``dlhpc tick`` every ``--interval`` s at a random phase, as cron
would), interrupts the running job (``--mode term|usr2``: ``scancel --signal``; ``preempt``: a
``high`` job on the trial's node, only when no other job runs there) and times the way to the
first training step of the next attempt, in parts. Repetitions that something else
interrupted (a shared cluster) are discarded and replaced (``discarded`` in the JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "templates" / "examples" / "digits"
TRAINER = REPO / "scripts" / "bench_fault_train.py"
ENTRY = REPO / "scripts" / "bench_fault_entry.py"
GRACE_TIME_S = 30.0  # the dev cluster's debug partition (PreemptMode=REQUEUE)


def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def fake_trial(root: Path, hparams: dict[str, Any], max_length: int, seed: int = 0) -> Path:
    """A trial folder with trial.json, as ``dlhpc launch`` writes it; returns the folder."""
    from dlhpc.protocol import TrialSpec

    trial_dir = root / "trial"
    TrialSpec(
        experiment_id=1,
        trial_id=1,
        hparams=hparams,
        max_length=max_length,
        seed=seed,
        experiment_dir=str(root),
        code_dir=str(root),
        entry_script=str(root / "entry.sh"),
        checkpoint_dir=str(root / "ckpt"),
        metric="train_loss",
        smaller_is_better=True,
    ).write(trial_dir / "trial.json")
    return trial_dir


# ------------------------------------------------------------------ overhead ---


class _Loop:
    """One training loop; ``block`` runs n steps bare or with the harness calls."""

    def __init__(self, kind: str, ctx: Any) -> None:
        import torch
        from torch import nn

        g = torch.Generator().manual_seed(0)
        self.model: nn.Module
        if kind == "tiny":  # the smallest real step: the harness's cost shows most
            self.model, n, d, classes, self.bs = nn.Linear(4, 2), 256, 4, 2, 4
        else:  # the digits example's model and batch (64 -> 64 -> 10, batch 64, 1437 samples)
            d, classes, self.bs, n = 64, 10, 64, 1437
            self.model = nn.Sequential(
                nn.Linear(d, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, classes)
            )
        self.x = torch.rand(n, d, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loss_fn = nn.CrossEntropyLoss()
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
        self.batches = list(torch.split(perm, self.bs))
        self.ctx = ctx
        self.state = ctx.train_state(model=self.model, optimizer=self.opt)
        self.bare = SimpleNamespace(batch=0, step=0)

    def block(self, harness: bool, n: int) -> list[int]:
        """Step times (ns) of n steps; the harness arm adds report() and step() each step."""
        perf, ctx, model, opt, loss_fn = (
            time.perf_counter_ns,
            self.ctx,
            self.model,
            self.opt,
            self.loss_fn,
        )
        x, y, batches = self.x, self.y, self.batches
        st = self.state if harness else self.bare
        times = []
        for _ in range(n):
            t0 = perf()
            i = st.batch % len(batches)
            idx = batches[i]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            st.batch, st.step = i + 1, st.step + 1
            if harness:
                ctx.report(st.step, {"train_loss": value})
                ctx.step(st)
            times.append(perf() - t0)
        return times

    def report_timed(self, n: int) -> dict[str, list[int]]:
        """n harness steps (report() and step() every step) with the report() call
        timed on its own: ns of each step and of each report() call, flush included."""
        perf, ctx, model, opt, loss_fn = (
            time.perf_counter_ns,
            self.ctx,
            self.model,
            self.opt,
            self.loss_fn,
        )
        x, y, batches, st = self.x, self.y, self.batches, self.state
        out: dict[str, list[int]] = {"step": [], "report": []}
        for _ in range(n):
            t0 = perf()
            i = st.batch % len(batches)
            idx = batches[i]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            st.batch, st.step = i + 1, st.step + 1
            r0 = perf()
            ctx.report(st.step, {"train_loss": value})
            r1 = perf()
            ctx.step(st)
            out["step"].append(perf() - t0)
            out["report"].append(r1 - r0)
        return out

    def timed_on_cpu(self, harness: bool, n: int) -> dict[str, list[Any]]:
        """n steps (the harness arm: report() and step() every step): wall ns of each
        (``t``), whether the scheduler preempted this thread during it (``pre``: an
        involuntary context switch, the machine's load, not the code; a wait for the
        disk, a lock or the GIL is voluntary and stays in), and in the harness arm the
        ns of the report() call (``rep``) and whether it handed over or wrote a batch
        (``flush``: the buffer shrank)."""
        import resource

        perf, ctx, model, opt, loss_fn = (
            time.perf_counter_ns,
            self.ctx,
            self.model,
            self.opt,
            self.loss_fn,
        )
        usage, who = resource.getrusage, resource.RUSAGE_THREAD
        x, y, batches = self.x, self.y, self.batches
        st = self.state if harness else self.bare
        buf = ctx._writer  # the context's buffer (old: EventWriter; new: its publisher)
        out: dict[str, list[Any]] = {"t": [], "pre": [], "rep": [], "flush": []}
        for _ in range(n):
            iv0 = usage(who).ru_nivcsw
            t0 = perf()
            i = st.batch % len(batches)
            idx = batches[i]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            st.batch, st.step = i + 1, st.step + 1
            if harness:
                before = buf.pending()
                r0 = perf()
                ctx.report(st.step, {"train_loss": value})
                r1 = perf()
                ctx.step(st)
                out["rep"].append(r1 - r0)
                out["flush"].append(buf.pending() <= before)
            out["t"].append(perf() - t0)
            out["pre"].append(usage(who).ru_nivcsw != iv0)
        return out

    def alternate(self, n: int) -> dict[str, dict[str, list[int]]]:
        """n pairs of steps, bare and harness in turn (finest interleaving): wall and
        thread-CPU ns of each step, per arm."""
        perf, cpu, ctx, model, opt, loss_fn = (
            time.perf_counter_ns,
            time.thread_time_ns,
            self.ctx,
            self.model,
            self.opt,
            self.loss_fn,
        )
        x, y, batches = self.x, self.y, self.batches
        out: dict[str, dict[str, list[int]]] = {
            a: {"wall": [], "cpu": []} for a in ("bare", "harness")
        }
        for k in range(2 * n):
            harness = bool(k % 2)
            st = self.state if harness else self.bare
            t0, c0 = perf(), cpu()
            i = st.batch % len(batches)
            idx = batches[i]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            value = loss.item()
            st.batch, st.step = i + 1, st.step + 1
            if harness:
                ctx.report(st.step, {"train_loss": value})
                ctx.step(st)
            c1, t1 = cpu(), perf()
            arm = out["harness" if harness else "bare"]
            arm["wall"].append(t1 - t0)
            arm["cpu"].append(c1 - c0)
        return out


def _publisher_cpu_ns() -> int:
    """CPU time so far of the thread that publishes report() records off the training
    thread (``dlhpc-events``; 0 with the code before it existed)."""
    import threading

    for t in threading.enumerate():
        if t.name == "dlhpc-events" and t.ident is not None:
            return time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
    return 0


def _report_on_cpu(loop: _Loop, steps: int, block: int) -> dict[str, Any]:
    """report() and step() every step against the bare loop, in alternating blocks of
    ``block`` steps (ABBA), on steps the scheduler did not preempt: the mean step of
    each arm (flushes, disk waits and GIL waits included, wherever the flush runs)."""
    arms: dict[str, dict[str, list[Any]]] = {
        a: {"t": [], "pre": [], "rep": [], "flush": []} for a in ("bare", "harness")
    }
    cpu0 = _publisher_cpu_ns()
    for k in range(steps // block):
        order = (False, True) if k % 2 == 0 else (True, False)
        for harness in order:
            got = loop.timed_on_cpu(harness, block)
            for key, values in got.items():
                arms["harness" if harness else "bare"][key].extend(values)
    loop.ctx.flush()
    bg_us = (_publisher_cpu_ns() - cpu0) / len(arms["harness"]["t"]) / 1e3
    out: dict[str, Any] = {"steps_per_arm": steps // block * block, "block": block}
    means = {}
    for a, d in arms.items():
        kept = [t for t, pre in zip(d["t"], d["pre"], strict=True) if not pre]
        means[a] = statistics.fmean(kept) / 1e3
        out[a] = {
            "kept_steps": len(kept),
            "mean_us": r(means[a], 2),
            "median_us": r(statistics.median(kept) / 1e3, 2),
            "mean_all_steps_us": r(statistics.fmean(d["t"]) / 1e3, 2),
        }
    bare_median = statistics.median(
        t for t, pre in zip(arms["bare"]["t"], arms["bare"]["pre"], strict=True) if not pre
    )
    # the robust estimate: medians only (a preempted call is rejected by them)
    h = arms["harness"]
    calls = [x for x, f in zip(h["rep"], h["flush"], strict=True) if not f]
    flushes = [x for x, f in zip(h["rep"], h["flush"], strict=True) if f]
    call_us = statistics.median(calls) / 1e3
    flush_us = statistics.median(flushes) / 1e3 if flushes else call_us
    per_step = call_us + (flush_us - call_us) * len(flushes) / len(h["rep"]) + bg_us
    out["estimate"] = {
        "report_call_median_us": r(call_us, 3),
        "flush_calls": len(flushes),
        "flush_call_median_us": r(flush_us, 1),
        "flush_calls_us": [r(x / 1e3, 1) for x in flushes],
        "publisher_thread_cpu_us_per_step": r(bg_us, 3),
        "report_us_per_step": r(per_step, 3),
        "pct_of_step": r(100 * per_step / (bare_median / 1e3), 3),
        "pct_of_step_without_publisher_cpu": r(100 * (per_step - bg_us) / (bare_median / 1e3), 3),
        "how": "(median report() call + (median flushing call - median call) x flushes /"
        " steps + publishing thread CPU per step) / bare step median",
    }
    out["diff_us"] = r(means["harness"] - means["bare"], 2)
    out["pct_of_step"] = r(100 * (means["harness"] - means["bare"]) / (bare_median / 1e3), 3)
    out["how"] = (
        "(mean harness step - mean bare step, steps without an involuntary context switch)"
        " / bare median"
    )
    return out


def _report_every_step(loop: _Loop, n: int, alt: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    """What report() every step costs the training thread, for any code version: the
    mean report() call in the loop (its flushes included, in this thread or not), plus
    the CPU time of the publishing thread (if any) per step, which on a busy machine
    may come out of the training thread's share; as % of the bare step's median."""
    cpu0 = _publisher_cpu_ns()
    timed = loop.report_timed(n)
    loop.ctx.flush()  # what the steps handed over is published (and its CPU counted)
    bg_us = (_publisher_cpu_ns() - cpu0) / n / 1e3
    bare = statistics.median(alt["bare"]["wall"]) / 1e3
    call_mean = statistics.fmean(timed["report"]) / 1e3
    slowest = sorted(timed["report"])[-10:]
    return {
        "steps": n,
        "report_call_mean_us": r(call_mean, 3),
        "report_call_median_us": r(statistics.median(timed["report"]) / 1e3, 3),
        "report_call_slowest_10_us": [r(v / 1e3, 1) for v in slowest],
        "publisher_thread_cpu_us_per_step": r(bg_us, 3),
        "bare_step_median_us": r(bare, 2),
        "pct_of_step": r(100 * (call_mean + bg_us) / bare, 3),
        "how": "(mean report() call in the loop + publishing thread CPU per step)"
        " / bare step median",
    }


def cmd_overhead(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="dlhpc-bench-fault-"))
    trial_dir = fake_trial(root, {}, max_length=1)
    attempt = trial_dir / "attempts" / "bench.r0"
    os.environ["DLHPC_TRIAL_DIR"], os.environ["DLHPC_ATTEMPT_DIR"] = str(trial_dir), str(attempt)
    import dlhpc

    ctx = dlhpc.init()  # defaults: flush every 1000 records or 30 s, progress every 5 s
    perf = time.perf_counter_ns
    out: dict[str, Any] = {"rounds": args.rounds, "block_steps": args.block, "models": {}}

    for kind in args.models:
        loop = _Loop(kind, ctx)
        if args.report_on_cpu:  # only the measure of issue 16's second protocol
            loop.timed_on_cpu(False, args.block)
            loop.timed_on_cpu(True, args.block)  # warm-up
            out["models"][kind] = {
                "report_on_cpu": _report_on_cpu(loop, args.rounds * args.block, 100)
            }
            continue
        block, model, bs = loop.block, loop.model, loop.bs
        block(False, args.block)
        block(True, args.block)  # warm-up, both arms
        # per block: the median step (wall), the mean step (wall) and the mean CPU time of
        # this thread per step (not counting time the machine gave to other processes, nor
        # waits for fsync)
        stats: dict[str, dict[str, list[float]]] = {
            a: {"median": [], "mean": [], "cpu": []} for a in ("bare", "harness")
        }
        for rnd in range(args.rounds):
            order = (False, True) if rnd % 2 == 0 else (True, False)
            for harness in order:
                c0 = time.thread_time_ns()
                t = block(harness, args.block)
                cpu = (time.thread_time_ns() - c0) / len(t) / 1e3
                arm = stats["harness" if harness else "bare"]
                arm["median"].append(statistics.median(t) / 1e3)
                arm["mean"].append(statistics.fmean(t) / 1e3)
                arm["cpu"].append(cpu)
        row: dict[str, Any] = {
            "params": sum(p.numel() for p in model.parameters()),
            "batch": bs,
        }
        for what in ("median", "mean", "cpu"):
            b, h = stats["bare"][what], stats["harness"][what]
            paired = [y - x for x, y in zip(b, h, strict=True)]
            q = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
            row[what] = {
                "bare_us": r(statistics.median(b), 2),
                "harness_us": r(statistics.median(h), 2),
                "paired_diff_us": r(statistics.median(paired), 2),
                "paired_diff_iqr_us": [r(q[0], 2), r(q[2], 2)],
                "paired_diff_pct": r(100 * statistics.median(paired) / statistics.median(b), 2),
            }
        # the finest interleaving: bare and harness steps in turn, medians per arm
        alt = loop.alternate(args.rounds * args.block)
        row["alternating_steps"] = {
            "steps_per_arm": args.rounds * args.block,
            **{
                f"{kind_}_median_us": {a: r(statistics.median(alt[a][kind_]) / 1e3, 2) for a in alt}
                for kind_ in ("wall", "cpu")
            },
            **{
                f"{kind_}_mean_us": {a: r(statistics.fmean(alt[a][kind_]) / 1e3, 2) for a in alt}
                for kind_ in ("wall", "cpu")
            },
        }
        for kind_ in ("wall", "cpu"):
            mb = statistics.median(alt["bare"][kind_]) / 1e3
            mh = statistics.median(alt["harness"][kind_]) / 1e3
            row["alternating_steps"][f"{kind_}_median_diff_us"] = r(mh - mb, 2)
            row["alternating_steps"][f"{kind_}_median_diff_pct"] = r(100 * (mh - mb) / mb, 2)
        row["report_every_step"] = _report_every_step(loop, args.rounds * args.block, alt)
        row["blocks"] = {
            a: {k: [r(v, 1) for v in vs] for k, vs in d.items()} for a, d in stats.items()
        }
        out["models"][kind] = row
    if args.report_on_cpu:
        ctx.close()
        out["event_files_written"] = len(list(attempt.glob("user-r0-*.jsonl")))
        shutil.rmtree(root, ignore_errors=True)
        return out

    # the cost of each call alone, in the same process: blocks of 1000 calls (= flush_every,
    # so each block of report() calls holds exactly one flush), median of the blocks
    def per_call(fn: Any, n: int = 1000) -> float:
        res = []
        for _ in range(args.rounds):
            t0 = perf()
            for i in range(n):
                fn(i)
            res.append((perf() - t0) / n / 1e3)
        return statistics.median(res)

    st = SimpleNamespace(step=0)
    e = per_call(lambda i: None)
    report = per_call(lambda i: ctx.report(i, {"train_loss": 0.5})) - e
    step = per_call(lambda i: ctx.step(st)) - e
    # report() split into its two parts: buffering a record, and the flush of 1000 records
    os.environ["DLHPC_ATTEMPT_DIR"] = str(trial_dir / "attempts" / "bench-split.r0")
    ctx2 = dlhpc.init(flush_every=10**9, flush_interval_s=1e9)
    add, flush = [], []
    for _ in range(args.rounds):
        t0 = perf()
        for i in range(1000):
            ctx2.report(i, {"train_loss": 0.5})
        t1 = perf()
        ctx2.flush()
        add.append((t1 - t0) / 1000 / 1e3 - e)
        flush.append((perf() - t1) / 1e6)
    out["per_call_us"] = {
        "report": r(report, 3),
        "report_buffer_only": r(statistics.median(add), 3),
        "flush_of_1000_records_ms": r(statistics.median(flush), 3),
        "step": r(step, 3),
        "empty_loop": r(e, 3),
        "note": "report(): flushes (json + write + fsync of one file) every 1000 records or "
        "30 s, in the calling thread; step(): rewrites progress.json (fsynced) every 5 s",
    }
    ctx2.close()
    # The estimate: the median step's difference (every call, without the rare flush) plus
    # the flush of 1000 records spread over the 1000 steps that filled it (ms -> us per step).
    flush_us_per_step = statistics.median(flush)
    for row in out["models"].values():
        alt = row["alternating_steps"]
        est = alt["wall_median_diff_us"] + flush_us_per_step
        row["estimate"] = {
            "overhead_us_per_step": r(est, 2),
            "overhead_pct": r(100 * est / alt["wall_median_us"]["bare"], 2),
            "how": "alternating steps' median wall difference + flush_of_1000_records_ms"
            " / 1000 steps",
        }
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    ctx.close()
    out["event_files_written"] = len(list(attempt.glob("user-r0-*.jsonl")))
    shutil.rmtree(root, ignore_errors=True)
    return out


# ---------------------------------------------------------------------- lost ---

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


def _lost_run(
    root: Path, model: str, stop_ckpt: bool, phase: float, timeout: float
) -> dict[str, Any]:
    """One kill and one resume; ``phase`` in epochs after the first epoch checkpoint."""
    spec = LOST_MODELS[model]
    trial_dir = fake_trial(
        root, {**spec["hparams"], "stop_checkpoint": stop_ckpt}, spec["max_length"]
    )
    log1, log2 = root / "run1.jsonl", root / "run2.jsonl"
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
    steps = [e for e in ev if e["ev"] == "step"]
    epoch_s = first_ckpt["t1"] - next(e for e in ev if e["ev"] == "restore")["t1"]
    time.sleep(phase * epoch_s)
    t_kill = time.time()
    os.kill(p.pid, signal.SIGTERM)
    rc1 = p.wait(timeout=timeout)
    t_exit = time.time()

    ev = _read_log(log1)
    steps = [e for e in ev if e["ev"] == "step"]
    ckpts = [e for e in ev if e["ev"] == "ckpt"]
    last = steps[-1]
    done_at_kill = max((e["step"] for e in steps if e["t"] <= t_kill), default=0)
    stop_seen = next((e for e in ev if e["ev"] == "stop_seen"), None)
    stop_ck = next((c for c in ckpts if c["stop"]), None)
    at_exit = next((e for e in ev if e["ev"] == "atexit_last"), None)  # then interpreter teardown

    t_spawn2 = time.time()
    p2 = _spawn(trial_dir, "1.r1", log2, exit_after=1)
    rc2 = p2.wait(timeout=timeout)
    ev2 = _read_log(log2)
    if rc2 != 0 or not any(e["ev"] == "step" for e in ev2):
        err = log2.with_suffix(".err").read_text()[-3000:]
        raise RuntimeError(f"resume exited {rc2} without a step: {err}")
    start2 = next(e for e in ev2 if e["ev"] == "start")
    setup2 = next(e for e in ev2 if e["ev"] == "setup")
    rest2 = next(e for e in ev2 if e["ev"] == "restore")
    first2 = next(e for e in ev2 if e["ev"] == "step")
    restored = rest2["step"]
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
        "resume": {
            "spawn_to_first_step_s": r(first2["t"] - t_spawn2),
            "spawn_to_script_s": r(start2["t_start"] - t_spawn2),
            "imports_and_init_s": r(setup2["t"] - start2["t_start"]),
            "restore_s": r(rest2["t1"] - rest2["t0"]),
            "first_step_s": r(first2["t"] - rest2["t1"]),
        },
        "resume_correct": first2["step"] == restored + 1,
    }


def cmd_lost(args: argparse.Namespace) -> dict[str, Any]:
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
        summary: dict[str, Any] = {}
        for arm in ("harness", "epoch_only"):
            rs = [x for x in runs if x["arm"] == arm]
            summary[arm] = {
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
        saves = [s for x in runs for s in x["epoch_checkpoint_s"]] + [
            x["stop_checkpoint_s"] for x in runs if x["stop_checkpoint_s"] is not None
        ]
        size = runs[0]["checkpoint_bytes"]
        out["models"][model] = {
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
    return out


# ------------------------------------------------------------------- requeue ---

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


def _ts(dt: str | None) -> float | None:
    """An SQLite naive-UTC datetime -> epoch seconds."""
    if not dt:
        return None
    return datetime.fromisoformat(dt).replace(tzinfo=timezone.utc).timestamp()


def _worker_events(attempt_dir: Path) -> dict[str, dict[str, Any]]:
    from dlhpc.protocol import read_event_batches

    out: dict[str, dict[str, Any]] = {}
    if attempt_dir.is_dir():
        for b in read_event_batches(attempt_dir):
            for rec in b.records:
                if rec["type"] in ("start", "exit") and b.name.startswith("worker-r0"):
                    out.setdefault(rec["type"], rec)
    return out


class Cluster:
    def __init__(self, home: Path, interval: float) -> None:
        self.env = {**os.environ, "DLHPC_HOME": str(home), "DLHPC_SITE": "dev-cluster"}
        self.home = home
        self.interval = interval
        self.ticks: list[tuple[float, float]] = []
        self._next_tick = 0.0

    def dlhpc(self, *a: str) -> str:
        p = subprocess.run(
            [sys.executable, "-m", "dlhpc", *a],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if p.returncode != 0:
            raise RuntimeError(f"dlhpc {' '.join(a)}: {p.stdout}\n{p.stderr}")
        return p.stdout

    def maybe_tick(self) -> None:
        """A tick (a fresh process, as cron runs it) every ``interval`` s from the last start."""
        if time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.interval
            t0 = time.time()
            self.dlhpc("tick", "-q")
            self.ticks.append((t0, time.time()))

    def next_tick_in(self, seconds: float) -> None:
        self._next_tick = time.monotonic() + seconds

    def attempts(self, exp_id: int) -> list[dict[str, Any]]:
        con = sqlite3.connect(f"file:{self.home / 'dlhpc.db'}?mode=ro", uri=True, timeout=30)
        con.row_factory = sqlite3.Row
        rows = con.execute(
            "SELECT a.* , t.run_dir FROM attempts a JOIN trials t ON a.trial_id = t.id"
            " WHERE t.experiment_id = ? ORDER BY a.id",
            (exp_id,),
        ).fetchall()
        con.close()
        return [dict(x) for x in rows]

    def squeue(self, job_id: str, fmt: str) -> str:
        p = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", fmt],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return p.stdout.strip()

    def job_state(self, job_id: str) -> str:
        return self.squeue(job_id, "%T|%r")

    def sacct(self, job_ids: list[str]) -> list[str]:
        p = subprocess.run(
            [
                "sacct",
                "-X",
                "-D",
                "-n",
                "-P",
                "-j",
                ",".join(job_ids),
                "-o",
                "JobID,Partition,State,ExitCode,Start,End",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        return p.stdout.split()

    def squeue_node(self, node: str) -> list[str]:
        p = subprocess.run(
            ["squeue", "-h", "-r", "-w", node, "-o", "%i"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return p.stdout.split()


class Interrupted(Exception):
    """Something other than this benchmark stopped the trial (a shared dev cluster)."""


def _first_step_files(out: Path) -> list[Path]:
    """The wrapper's records (``<attempt key>.json``, written at the first step)."""
    return sorted(p for p in out.glob("*.json") if not p.name.endswith(".exit.json"))


def _requeue_rep(args: argparse.Namespace, work: Path, rep: int) -> dict[str, Any]:
    home, out = work / f"home-{rep}", work / f"out-{rep}"
    out.mkdir(parents=True)
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
    c = Cluster(home, args.interval)
    exp_id = json.loads(c.dlhpc("launch", str(exp_yaml), "--json"))["experiment_id"]
    deadline = time.monotonic() + args.timeout
    job_ids: set[str] = set()
    try:
        # 1. wait for the first attempt's first step, then a seeded random part of an epoch
        first: dict[str, Any] | None = None
        while first is None:
            if time.monotonic() > deadline:
                raise RuntimeError("timed out waiting for the first attempt")
            c.maybe_tick()
            files = _first_step_files(out)
            if files:
                first = json.loads(files[0].read_text())
            time.sleep(0.1)
        a0 = c.attempts(exp_id)[0]
        job_ids.add(a0["job_id"])
        time.sleep(args.delay + random.Random(args.seed * 1000 + rep).uniform(0, 1.0))
        a0_dir = Path(a0["run_dir"]) / "attempts" / a0["attempt_key"]
        if "exit" in _worker_events(a0_dir) or not c.job_state(a0["job_id"]).startswith("RUN"):
            raise Interrupted(
                f"{a0['job_id']} stopped before the signal: {c.sacct([a0['job_id']])}"
            )
        # 2. the signal
        if args.mode == "preempt":
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
                    f"sleep {args.hog_s}",
                ],
                env=c.env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            job_ids.add(hog)
        else:
            sig = "TERM" if args.mode == "term" else "USR2"
            t_sig = time.time()
            if subprocess.run(["scancel", f"--signal={sig}", a0["job_id"]], env=c.env).returncode:
                raise Interrupted(f"scancel --signal {a0['job_id']}: {c.sacct([a0['job_id']])}")
        t_sig_done = time.time()
        # the reconciler's phase relative to the signal is random, as with cron
        phase_rng = random.Random(args.seed * 7919 + rep)
        c.next_tick_in(phase_rng.uniform(0.0, args.interval))
        # 3. tick until the next attempt has trained its first step
        states: list[tuple[float, str]] = []
        seen_exit = None
        nxt: dict[str, Any] | None = None
        while nxt is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out; attempts: {c.attempts(exp_id)}")
            c.maybe_tick()
            rows = c.attempts(exp_id)
            job_ids.update(x["job_id"] for x in rows)
            if seen_exit is None and rows[0]["exit_code"] is not None:
                seen_exit = c.ticks[-1][1]
            st = c.job_state(rows[-1]["job_id"])
            if not states or states[-1][1] != st:
                states.append((time.time(), st))
            for f in _first_step_files(out):
                if f.stem != a0["attempt_key"]:
                    nxt = json.loads(f.read_text())
            time.sleep(0.2)
        rows = c.attempts(exp_id)
        run_dir = Path(rows[0]["run_dir"])
        old = _worker_events(run_dir / "attempts" / a0["attempt_key"])
        new_dir = run_dir / "attempts" / nxt["attempt"]
        new = _worker_events(new_dir)
        old_progress = json.loads(
            (run_dir / "attempts" / a0["attempt_key"] / "progress.json").read_text()
        )
        t_exit = old["exit"]["time"]
        old_atexit_f = out / f"{a0['attempt_key']}.exit.json"
        old_atexit = (
            json.loads(old_atexit_f.read_text())["atexit"] if old_atexit_f.exists() else None
        )
        t_start = new["start"]["time"]
        res: dict[str, Any] = {
            "rep": rep,
            "experiment_id": exp_id,
            "jobs": sorted(job_ids),
            "old_attempt": a0["attempt_key"],
            "new_attempt": nxt["attempt"],
            "old_exit": {
                k: old["exit"].get(k)
                for k in ("code", "reason", "signal", "step", "checkpoint_step")
            },
            "restored_step": nxt.get("restored_step"),
            "first_new_step": nxt.get("first_step_no"),
            "scancel_s": r(t_sig_done - t_sig),
            "total_signal_to_first_step_s": r(nxt["first_step"] - t_sig),
            "signal_to_checkpoint_done_s": r(old_progress["time"] - t_sig),
            "signal_to_script_atexit_s": r(old_atexit - t_sig) if old_atexit else None,
            "signal_to_exit_record_s": r(t_exit - t_sig),
            "script_teardown_s": r(t_exit - old_atexit) if old_atexit else None,
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
        res["sacct"] = c.sacct(sorted(job_ids))
        if args.mode != "usr2":
            new_row = rows[-1]
            t_resubmit = _ts(new_row["created_at"])  # recorded right after sbatch returned
            res["exit_to_reconciler_notice_s"] = r(seen_exit - t_exit) if seen_exit else None
            res["exit_to_resubmit_s"] = r(t_resubmit - t_exit) if t_resubmit else None
            res["resubmit_to_job_start_s"] = r(t_start - t_resubmit) if t_resubmit else None
        return res
    finally:
        try:
            c.dlhpc("kill", str(exp_id))
        except RuntimeError as err:
            print(f"kill {exp_id}: {err}", file=sys.stderr)
        ids = sorted({j for j in job_ids if j})
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


def _code_version() -> dict[str, Any]:
    """The commit measured, and which dlhpc/ files differed from it (shared working trees)."""

    def git(*a: str) -> str:
        p = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False)
        return p.stdout.strip()

    return {
        "head": git("rev-parse", "--short", "HEAD"),
        "dlhpc_changed": git("status", "--short", "--", "dlhpc").splitlines(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("overhead", help="harness step-time overhead vs the bare loop")
    p.add_argument("--rounds", type=int, default=10, help="A/B block pairs")
    p.add_argument(
        "--block",
        type=int,
        default=1000,
        help="steps per block (1000 = report()'s flush_every: one flush a block)",
    )
    p.add_argument("--models", nargs="+", default=["tiny", "digits"], choices=["tiny", "digits"])
    p.add_argument(
        "--report-on-cpu",
        action="store_true",
        help="only report() + step() every step vs bare, 100-step ABBA blocks, mean over"
        " steps the scheduler did not preempt",
    )
    p = sub.add_parser("lost", help="work lost per SIGTERM; checkpoint save/restore")
    p.add_argument(
        "--models", nargs="+", default=["digits", "synthetic"], choices=list(LOST_MODELS)
    )
    p.add_argument("--reps", type=int, default=5, help="kills per arm, digits")
    p.add_argument("--reps-synthetic", type=int, default=3, help="kills per arm, synthetic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=180.0)
    p = sub.add_parser("requeue", help="dev cluster: signal -> first step of the next attempt")
    p.add_argument(
        "--mode",
        choices=["term", "usr2", "preempt"],
        default="term",
        help="term: scancel --signal=TERM (preemption's signal; the reconciler"
        " resubmits); usr2: the time-limit signal (the job requeues itself);"
        " preempt: a real preemption by a 'high' job on the trial's node (only"
        " when no other job runs there; waits up to 60 s for that)",
    )
    p.add_argument("--hog-s", type=int, default=5, help="preempt: how long the 'high' job runs")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between tick starts")
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--epochs", type=int, default=60, help="long enough never to finish")
    p.add_argument(
        "--delay", type=float, default=2.0, help="seconds of training before the signal (+U(0,1))"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=240.0, help="per repetition")
    args = parser.parse_args()
    t0 = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    result = {"overhead": cmd_overhead, "lost": cmd_lost, "requeue": cmd_requeue}[args.cmd](args)
    result = {
        "benchmark": args.cmd,
        "wall_s": round(time.monotonic() - t0, 1),
        "code": _code_version(),
        "loadavg_1_5_15_min": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        **result,
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
