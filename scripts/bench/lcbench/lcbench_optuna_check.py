#!/usr/bin/env python3
"""Diagnostic of the Optuna rows of ``bench_search_lcbench.py``: the best
value each Optuna variant reaches on a task in one run (budget, W and seed as given),
against the same study with the sampler or the pruner swapped, to tell a misuse of
Optuna by the driver from Optuna's own behaviour. Variants: ``tpe-sha`` (the
benchmark's ``optuna-tpe-sha``), ``random-sha`` (RandomSampler instead of TPE),
``tpe-nop`` (no pruner: every trial trains 50 epochs), ``tpe-sha-w1`` (one worker, the
sequential use Optuna's documentation shows).

    python scripts/bench/lcbench/lcbench_optuna_check.py --tasks 7593,167184,189873
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lcbench_peers import OptunaMethod, run_workers  # noqa: E402
from _lcbench_surrogate import Surrogate, reference  # noqa: E402

VARIANTS = ("tpe-sha", "random-sha", "tpe-nop", "tpe-sha-w1")


def best_of(variant: str, surrogate: Surrogate, task: str, args: argparse.Namespace) -> float:
    """The best value the run of ``variant`` (module doc) reports within the budget."""
    import optuna

    method = OptunaMethod("tpe-sha", args.seed)
    if variant == "random-sha":
        method.study.sampler = optuna.samplers.RandomSampler(seed=args.seed)
    if variant == "tpe-nop":
        method.study.pruner = optuna.pruners.NopPruner()
    workers = 1 if variant.endswith("-w1") else args.workers
    trace, _ = run_workers(method, surrogate, task, workers, args.budget, 1.0)
    surrogate.clear()
    return max(trace.values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="7593,167184,189873")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--budget", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    surrogate = Surrogate()
    print("task | best of 2,000 random | " + " | ".join(VARIANTS))
    for task in args.tasks.split(","):
        ref = reference(surrogate, task)
        bests = [best_of(v, surrogate, task, args) for v in VARIANTS]
        print(f"{task} | {ref.best:.2f} | " + " | ".join(f"{b:.2f}" for b in bests), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
