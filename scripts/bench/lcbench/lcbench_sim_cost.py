#!/usr/bin/env python3
"""The simulation cost and decision digest of ``bench_search_lcbench.py``'s runs.

Every (method, task, seed) given runs once at W workers, as the benchmark runs it (a
dlhpc searcher through the ask/tell driver, a peer on the worker simulation, curves
from one surrogate for all of them): its CPU seconds, epochs, the surrogate queries it
made and a digest of its trace (equal digests: the same epochs, times and values, so a
change to the harness changed no decision and no measure). ``--profile N`` prints the
N functions with the most CPU time of each run (cProfile on the process clock).

With ``--scratch`` a dlhpc method runs instead on the product's own path (a real
``launch`` and ``tick`` on ``dlhpc simulate``'s cluster, ``_lcbench_dlhpc.run_dlhpc``)
with its store and files in each of the given folders, one after the other.

    cd scripts/bench/lcbench
    python lcbench_sim_cost.py --tasks 7593,167168 --seeds 2 --methods asha,syne-bohb
    python lcbench_sim_cost.py --methods asha --profile 15
    python lcbench_sim_cost.py --task 3945 --methods random,asha --scratch /tmp,/dev/shm
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lcbench_dlhpc import SimKnobs, run_dlhpc, searcher_section  # noqa: E402
from _lcbench_surrogate import Surrogate  # noqa: E402
from bench_search_lcbench import one_run, parse_methods  # noqa: E402


def _timed(prof: cProfile.Profile | None, fn: Any) -> tuple[Any, float]:
    """``fn()`` and the CPU seconds it took, profiled when ``prof`` is given."""
    c0 = time.process_time()
    if prof is not None:
        prof.enable()
    try:
        out = fn()
    finally:
        if prof is not None:
            prof.disable()
    return out, time.process_time() - c0


def _print_profile(prof: cProfile.Profile | None, top: int) -> None:
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def bench_runs(args: argparse.Namespace, surrogate: Surrogate) -> None:
    """Each method, task and seed as the benchmark runs it; one line each."""
    run_args = argparse.Namespace(
        budget=args.budget, tick_interval=args.tick_interval, time_scale=1.0
    )
    for task in args.tasks.split(","):
        for seed in range(args.seeds):
            for label, section in parse_methods(args.methods, args.searcher):
                prof = cProfile.Profile(time.process_time) if args.profile else None
                q0 = surrogate.queries
                (trace, _), cpu = _timed(
                    prof,
                    partial(one_run, label, section, surrogate, task, seed, args.workers, run_args),
                )
                surrogate.clear()
                print(
                    f"{label} task={task} seed={seed} W={args.workers}: {cpu:.2f} CPU s,"
                    f" {trace.epochs} epochs, {surrogate.queries - q0} queries,"
                    f" trace {trace.digest()}, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
                _print_profile(prof, args.profile)


def tick_runs(args: argparse.Namespace, surrogate: Surrogate) -> None:
    """Each dlhpc method on the product's tick-driven path, in each scratch folder."""
    knobs = SimKnobs(args.workers)
    task = args.tasks.split(",")[0]
    for method, mapping in parse_methods(args.methods, args.searcher):
        if mapping is None:
            raise SystemExit(f"{method}: a peer method; --scratch runs dlhpc searchers")
        section = searcher_section({**mapping, "seed": 0}, args.budget, args.workers)
        for folder in args.scratch.split(","):
            prof = cProfile.Profile(time.process_time) if args.profile else None
            t0 = time.monotonic()
            (trace, facts), cpu = _timed(
                prof,
                partial(run_dlhpc, section, surrogate, task, 0, args.budget, knobs, Path(folder)),
            )
            surrogate.clear()
            print(
                f"{method} scratch={folder}: {time.monotonic() - t0:.1f} s wall, {cpu:.1f} CPU s,"
                f" {facts['ticks']} ticks, {trace.epochs} epochs, trace {trace.digest()},"
                f" load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            _print_profile(prof, args.profile)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", "--task", default="7593", help="comma-separated task ids")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    p.add_argument("--methods", default="random,asha", help="dlhpc searcher names and peers")
    p.add_argument("--searcher", action="append", default=[], help="LABEL={YAML mapping}")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--budget", type=int, default=10000)
    p.add_argument("--tick-interval", type=float, default=60.0)
    p.add_argument("--scratch", default=None, help="folders: the tick-driven path in each")
    p.add_argument("--profile", type=int, default=0, help="print the N costliest functions")
    args = p.parse_args(argv)
    surrogate = Surrogate()
    if args.scratch is None:
        bench_runs(args, surrogate)
    else:
        tick_runs(args, surrogate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
