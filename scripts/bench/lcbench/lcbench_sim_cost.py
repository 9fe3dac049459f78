#!/usr/bin/env python3
"""The simulation cost of one dlhpc run of ``bench_search_lcbench.py``: the
same run (method, task, seed, W, budget) with its store and files in each of the given
scratch folders, one after the other in one process: wall and CPU seconds, ticks, and a
digest of the trace (equal digests: the same epochs, times and values, so the folder
changed nothing measured). ``--profile N`` prints the N most expensive functions of each
run (cProfile, cumulative).

    cd scripts/bench/lcbench
    python lcbench_sim_cost.py --task 3945 --methods random,asha --scratch /tmp,/dev/shm
    python lcbench_sim_cost.py --methods '' --searcher 'at={name: asha, proposer: tpe}'
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lcbench_dlhpc import SimKnobs, run_dlhpc, searcher_section  # noqa: E402
from _lcbench_measures import Trace  # noqa: E402
from _lcbench_surrogate import Surrogate  # noqa: E402
from bench_search_lcbench import parse_methods  # noqa: E402


def digest(trace: Trace) -> str:
    """A short digest of every recorded epoch (virtual time, seconds, value)."""
    text = repr((trace.wall, trace.seconds, trace.values))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="3945")
    p.add_argument("--methods", default="random,asha", help="dlhpc searcher names")
    p.add_argument("--searcher", action="append", default=[], help="LABEL={YAML mapping}")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--budget", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scratch", default="/tmp,/dev/shm", help="folders, comma-separated")
    p.add_argument("--profile", type=int, default=0, help="print the N costliest functions")
    args = p.parse_args(argv)
    surrogate = Surrogate()
    knobs = SimKnobs(args.workers)
    for method, mapping in parse_methods(args.methods, args.searcher):
        if mapping is None:
            raise SystemExit(f"{method}: a peer method; this script runs dlhpc searchers")
        section = searcher_section({**mapping, "seed": args.seed}, args.budget, args.workers)
        for folder in args.scratch.split(","):
            prof = cProfile.Profile() if args.profile else None
            t0, c0 = time.monotonic(), time.process_time()
            if prof is not None:
                prof.enable()
            trace, facts = run_dlhpc(
                section, surrogate, args.task, 0, args.budget, knobs, Path(folder)
            )
            if prof is not None:
                prof.disable()
            wall, cpu = time.monotonic() - t0, time.process_time() - c0
            surrogate.clear()
            print(
                f"{method} scratch={folder}: {wall:.1f} s wall, {cpu:.1f} CPU s,"
                f" {facts['ticks']} ticks, {trace.epochs} epochs, trace {digest(trace)},"
                f" load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if prof is not None:
                pstats.Stats(prof).sort_stats("cumulative").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
