#!/usr/bin/env python3
"""Reliability check: how often does a finished DeepSpeed rank abort at exit?

A gloo worker thread that frees a finished collective's tensors while the
interpreter shuts down aborts the process (SIGABRT, pytorch/pytorch#190489).
``build_engine``'s exit handler sleeps ``SETTLE_S`` seconds with the GIL
released so that those threads finish first. This script launches the 2-rank
ZeRO-3 run of ``tests/unit/_ds_rank.py`` (gloo on localhost, train 6 steps,
save at 3, then a second engine restores step 3 and trains on) ``--runs``
times, alternating the handler's sleep between 0 and its default, and counts
launches in which a rank exited non-zero.

    . .venv/bin/activate; pip install -e '.[torch,dev]'
    python scripts/bench/ds_gpu/ds_exit_race.py --runs 200
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _result import write_result  # noqa: E402

from dlhpc.harness.deepspeed import SETTLE_S  # noqa: E402
from tests.unit._ds_rank import spawn  # noqa: E402

# sets the handler's sleep, then runs the rank script as __main__
_RANK = (
    "import os, runpy, sys\n"
    "from dlhpc.harness import deepspeed as dsh\n"
    "dsh.SETTLE_S = float(os.environ['SETTLE_S'])\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_module('tests.unit._ds_rank', run_name='__main__')\n"
)


def launch(settle: float, folder: Path, stage: int) -> list[int]:
    """One 2-rank launch; the ranks' exit codes (negative: killed by that signal)."""
    (folder / "o").mkdir(parents=True)
    args = {"out": str(folder / "o"), "ckpt": str(folder / "c"), "stage": stage, "steps": 6}
    args |= {"save_at": [3], "roundtrip": True}
    env = {"SETTLE_S": str(settle)}
    procs = spawn(2, args, cwd=folder, env=env, launcher=["-c", _RANK, "rank"])
    for p in procs:
        p.communicate(timeout=600)  # stderr piped and read, as the unit test runs them
    return [p.returncode for p in procs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="launches in all (alternating)")
    parser.add_argument("--stage", type=int, default=3, help="ZeRO stage")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args()
    failed: Counter[float] = Counter()
    done: Counter[float] = Counter()
    with tempfile.TemporaryDirectory(prefix="ds-exit-") as tmp:
        for i in range(args.runs):
            settle = (0.0, SETTLE_S)[i % 2]
            codes = launch(settle, Path(tmp, str(i)), args.stage)
            done[settle] += 1
            failed[settle] += any(codes)
            print(f"launch {i}: sleep {settle} s, exit codes {codes}", flush=True)
    print("\n| exit-handler sleep | launches | launches with a rank exiting non-zero |")
    print("|---|---|---|")
    for settle in (0.0, SETTLE_S):
        print(f"| {settle} s | {done[settle]} | {failed[settle]} |")
    if args.json is not None:
        counts = [
            {"sleep_s": s, "launches": done[s], "launches_with_an_abort": failed[s]}
            for s in (0.0, SETTLE_S)
        ]
        write_result(args.json, {"stage": args.stage, "counts": counts})


if __name__ == "__main__":
    main()
