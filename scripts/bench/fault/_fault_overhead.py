"""``bench_fault.py overhead``: the harness's cost per training step, in this process.

A bare loop against the same loop with ``ctx.report`` and ``ctx.step`` every step (the
mode's contract is in ``bench_fault.py``'s docstring): ABBA blocks, alternating steps,
report() timed in the loop, the cost of each call alone, and with ``--report-on-cpu``
the estimate made of medians, and the mean step over steps the scheduler did not
preempt."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _fault_common import fake_trial, r
from _fault_loop import _Loop, _publisher_cpu_ns


def _on_cpu_arms(
    loop: _Loop, steps: int, block: int
) -> tuple[dict[str, dict[str, list[Any]]], float]:
    """``loop.timed_on_cpu`` in alternating blocks of ``block`` steps (ABBA), ``steps``
    per arm: each arm's lists, and the publishing thread's CPU us per harness step."""
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
    return arms, bg_us


def _on_cpu_estimate(h: dict[str, list[Any]], bg_us: float, bare_median: float) -> dict[str, Any]:
    """The robust estimate of report()'s cost per step from the harness arm ``h``: medians
    only (a preempted call is rejected by them); ``bare_median`` in ns."""
    calls = [x for x, f in zip(h["rep"], h["flush"], strict=True) if not f]
    flushes = [x for x, f in zip(h["rep"], h["flush"], strict=True) if f]
    call_us = statistics.median(calls) / 1e3
    flush_us = statistics.median(flushes) / 1e3 if flushes else call_us
    per_step = call_us + (flush_us - call_us) * len(flushes) / len(h["rep"]) + bg_us
    return {
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


def _report_on_cpu(loop: _Loop, steps: int, block: int) -> dict[str, Any]:
    """report() and step() every step against the bare loop, in alternating blocks of
    ``block`` steps (ABBA), on steps the scheduler did not preempt: the mean step of
    each arm (flushes, disk waits and GIL waits included, wherever the flush runs)."""
    arms, bg_us = _on_cpu_arms(loop, steps, block)
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
    out["estimate"] = _on_cpu_estimate(arms["harness"], bg_us, bare_median)
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


def _abba_blocks(loop: _Loop, rounds: int, steps: int) -> dict[str, dict[str, list[float]]]:
    """``rounds`` pairs of blocks of ``steps`` steps (A/B, then B/A). Per block: the median
    step (wall), the mean step (wall) and the mean CPU time of this thread per step (not
    counting time the machine gave to other processes, nor waits for fsync), in us."""
    block = loop.block
    stats: dict[str, dict[str, list[float]]] = {
        a: {"median": [], "mean": [], "cpu": []} for a in ("bare", "harness")
    }
    for rnd in range(rounds):
        order = (False, True) if rnd % 2 == 0 else (True, False)
        for harness in order:
            c0 = time.thread_time_ns()
            t = block(harness, steps)
            cpu = (time.thread_time_ns() - c0) / len(t) / 1e3
            arm = stats["harness" if harness else "bare"]
            arm["median"].append(statistics.median(t) / 1e3)
            arm["mean"].append(statistics.fmean(t) / 1e3)
            arm["cpu"].append(cpu)
    return stats


def _paired(stats: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Per block statistic, the arms' medians and the differences paired by round."""
    row: dict[str, Any] = {}
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
    return row


def _alternating(alt: dict[str, dict[str, list[int]]], steps: int) -> dict[str, Any]:
    """The finest interleaving (bare and harness steps in turn): medians and means per arm
    (us) and the medians' difference, wall and thread CPU."""
    res: dict[str, Any] = {
        "steps_per_arm": steps,
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
        res[f"{kind_}_median_diff_us"] = r(mh - mb, 2)
        res[f"{kind_}_median_diff_pct"] = r(100 * (mh - mb) / mb, 2)
    return res


def _model_row(loop: _Loop, rounds: int, steps: int) -> dict[str, Any]:
    """One model's row: warm-up, ABBA blocks of ``steps`` steps, alternating steps, then
    report() every step timed in the loop, in this order."""
    block, model, bs = loop.block, loop.model, loop.bs
    block(False, steps)
    block(True, steps)  # warm-up, both arms
    stats = _abba_blocks(loop, rounds, steps)
    row: dict[str, Any] = {
        "params": sum(p.numel() for p in model.parameters()),
        "batch": bs,
        **_paired(stats),
    }
    alt = loop.alternate(rounds * steps)
    row["alternating_steps"] = _alternating(alt, rounds * steps)
    row["report_every_step"] = _report_every_step(loop, rounds * steps, alt)
    row["blocks"] = {a: {k: [r(v, 1) for v in vs] for k, vs in d.items()} for a, d in stats.items()}
    return row


def _per_call(fn: Callable[[int], Any], rounds: int, n: int = 1000) -> float:
    """us per call of ``fn``: ``rounds`` blocks of ``n`` calls, median of the blocks."""
    perf = time.perf_counter_ns
    res = []
    for _ in range(rounds):
        t0 = perf()
        for i in range(n):
            fn(i)
        res.append((perf() - t0) / n / 1e3)
    return statistics.median(res)


def _per_call_costs(ctx: Any, trial_dir: Path, rounds: int) -> tuple[dict[str, Any], float]:
    """The cost of each call alone, in the same process: blocks of 1000 calls (=
    flush_every, so each block of report() calls holds exactly one flush), median of the
    blocks; then report() split into buffering a record and the flush of 1000 records (a
    second context, ``bench-split.r0``). Returns the row and the flush's median in ms."""
    import dlhpc

    perf = time.perf_counter_ns
    st = SimpleNamespace(step=0)
    e = _per_call(lambda i: None, rounds)
    report = _per_call(lambda i: ctx.report(i, {"train_loss": 0.5}), rounds) - e
    step = _per_call(lambda i: ctx.step(st), rounds) - e
    # report() split into its two parts: buffering a record, and the flush of 1000 records
    os.environ["DLHPC_ATTEMPT_DIR"] = str(trial_dir / "attempts" / "bench-split.r0")
    ctx2 = dlhpc.init(flush_every=10**9, flush_interval_s=1e9)
    add, flush = [], []
    for _ in range(rounds):
        t0 = perf()
        for i in range(1000):
            ctx2.report(i, {"train_loss": 0.5})
        t1 = perf()
        ctx2.flush()
        add.append((t1 - t0) / 1000 / 1e3 - e)
        flush.append((perf() - t1) / 1e6)
    row = {
        "report": r(report, 3),
        "report_buffer_only": r(statistics.median(add), 3),
        "flush_of_1000_records_ms": r(statistics.median(flush), 3),
        "step": r(step, 3),
        "empty_loop": r(e, 3),
        "note": "report(): flushes (json + write + fsync of one file) every 1000 records or "
        "30 s, in the calling thread; step(): rewrites progress.json (fsynced) every 5 s",
    }
    ctx2.close()
    return row, statistics.median(flush)


def _add_estimates(models: dict[str, Any], flush_us_per_step: float) -> None:
    """The estimate, per model row: the median step's difference (every call, without the
    rare flush) plus the flush of 1000 records spread over the 1000 steps that filled it
    (ms -> us per step)."""
    for row in models.values():
        alt = row["alternating_steps"]
        est = alt["wall_median_diff_us"] + flush_us_per_step
        row["estimate"] = {
            "overhead_us_per_step": r(est, 2),
            "overhead_pct": r(100 * est / alt["wall_median_us"]["bare"], 2),
            "how": "alternating steps' median wall difference + flush_of_1000_records_ms"
            " / 1000 steps",
        }


def cmd_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """The ``overhead`` mode (``--rounds``, ``--block``, ``--models``, ``--report-on-cpu``):
    its JSON result, without the fields every mode shares."""
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="dlhpc-bench-fault-"))
    trial_dir = fake_trial(root, {}, max_length=1)
    attempt = trial_dir / "attempts" / "bench.r0"
    os.environ["DLHPC_TRIAL_DIR"], os.environ["DLHPC_ATTEMPT_DIR"] = str(trial_dir), str(attempt)
    import dlhpc

    ctx = dlhpc.init()  # defaults: flush every 1000 records or 30 s, progress every 5 s
    out: dict[str, Any] = {"rounds": args.rounds, "block_steps": args.block, "models": {}}

    for kind in args.models:
        loop = _Loop(kind, ctx)
        if args.report_on_cpu:  # the medians estimate only
            loop.timed_on_cpu(False, args.block)
            loop.timed_on_cpu(True, args.block)  # warm-up
            out["models"][kind] = {
                "report_on_cpu": _report_on_cpu(loop, args.rounds * args.block, 100)
            }
            continue
        out["models"][kind] = _model_row(loop, args.rounds, args.block)
    if args.report_on_cpu:
        ctx.close()
        out["event_files_written"] = len(list(attempt.glob("user-r0-*.jsonl")))
        shutil.rmtree(root, ignore_errors=True)
        return out

    out["per_call_us"], flush_us_per_step = _per_call_costs(ctx, trial_dir, args.rounds)
    _add_estimates(out["models"], flush_us_per_step)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    ctx.close()
    out["event_files_written"] = len(list(attempt.glob("user-r0-*.jsonl")))
    shutil.rmtree(root, ignore_errors=True)
    return out
