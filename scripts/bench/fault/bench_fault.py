#!/usr/bin/env python3
"""Benchmark: fault tolerance of the in-job harness. Prints a JSON summary
(``--json PATH``: also writes it there, with the date, command and machine).

    . .venv/bin/activate
    python scripts/bench/fault/bench_fault.py overhead  # harness step overhead vs the bare loop
    python scripts/bench/fault/bench_fault.py lost      # work lost per SIGTERM, checkpoint times
    eval "$(scripts/dev-cluster env)"
    python scripts/bench/fault/bench_fault.py requeue   # signal -> first step of the next attempt

``overhead`` runs in this process, one torch thread: a bare training loop and the same loop
with ``ctx.report(step, ...)`` and ``ctx.step(state)`` every step (in a fake trial folder), for
a tiny model (the per-call cost shows) and a digits-sized MLP. Interleaved two ways: blocks of
``--block`` steps (A/B, then B/A; block medians, means and thread-CPU means, paired by round)
and single steps in turn (medians per arm: robust on a noisy machine). Plus the cost per call
of each API alone, and of one flush of 1000 buffered records; ``estimate`` = the alternating
steps' median difference + that flush spread over its 1000 steps.

``lost`` runs ``bench_fault_train.py`` (beside this script) as a plain process in a fake trial
folder,
SIGTERMs it at a seeded random moment (uniform over two epochs, after the first epoch
checkpoint), waits for the exit, then runs it again to resume (and stop after its first
step). Two arms side by side, with the same moments: the harness (``ctx.step(state)``: a
checkpoint at the stop) and a baseline that checkpoints only at epoch ends
(``ctx.step(None)``: exits without one). For the digits example and a synthetic ~38 M
parameter MLP with Adam (a ~450 MB checkpoint).

``requeue`` needs the dev cluster: launches the digits example (one trial, through
``dlhpc launch``; the entrypoint runs train.py under ``bench_fault_entry.py``, which only
timestamps it), ticks (``dlhpc tick`` every ``--interval`` s at a random phase, as cron
would), interrupts the running job (``--mode term|usr2``: ``scancel --signal``; ``preempt``: a
``high`` job on the trial's node, only when no other job runs there) and times the way to the
first training step of the next attempt, in parts. Repetitions that something else
interrupted (a shared cluster) are discarded and replaced (``discarded`` in the JSON).

The modes live beside this script: ``_fault_overhead.py`` (with the loops of
``_fault_loop.py``), ``_fault_lost.py`` and ``_fault_requeue.py`` (with the dev cluster's
view in ``_fault_cluster.py``); shared parts in ``_fault_common.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _fault_common import _code_version  # noqa: E402
from _fault_lost import LOST_MODELS, cmd_lost  # noqa: E402
from _fault_overhead import cmd_overhead  # noqa: E402
from _fault_requeue import cmd_requeue  # noqa: E402
from _result import write_result  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per mode, with its options."""
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
    for mode in sub.choices.values():
        mode.add_argument("--json", type=Path, help="also write the JSON result to this file")
    return parser


def main() -> int:
    """Runs the mode named on the command line; prints its JSON result with the wall time,
    the code version and the load averages at the start and the end."""
    args = _parser().parse_args()
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
    if args.json is not None:
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
