#!/usr/bin/env python3
"""Benchmark: the crash-and-concurrency stress run, and one tick's ingest.

``stress`` runs tests/stress/_stress.py's run_stress ``--reps`` times (256 writers
killed at random, reconcilers killed and restarted, then the exactly-once checks) and
prints the median wall time and the counts of each run. ``ingest`` times one
``tick`` that ingests ``--files`` event files per trial for ``--writers`` trials
(3 metric records of 2 metrics and 3 log records per file), median of ``--reps``.

    . .venv/bin/activate
    python scripts/bench/stress/bench_stress.py stress --reps 3
    python scripts/bench/stress/bench_stress.py ingest --writers 256 --files 8 --reps 5 \
        --json scripts/bench/stress/ingest.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _result import write_result  # noqa: E402

from dlhpc.orchestrator import tick  # noqa: E402
from dlhpc.protocol import EventWriter  # noqa: E402
from dlhpc.store import Store  # noqa: E402
from tests.stress._backend import launch_stress, stress_pool  # noqa: E402
from tests.stress._stress import run_stress  # noqa: E402


def bench_ingest(root: Path, writers: int, files: int) -> tuple[float, int]:
    home, runs = launch_stress(root, writers)
    for run in runs:
        w = EventWriter(run.attempt_dir, "user-r0")
        for f in range(files):
            for k in range(3):
                step = f * 3 + k
                w.add("metric", step=step, metrics={"loss": 1.0 / (step + 1), "acc": 0.5})
                w.add("log", level="info", message=f"step {step}")
            w.flush()
    store = Store(home)
    try:
        t0 = time.monotonic()
        report = tick(store, stress_pool(home))
        return time.monotonic() - t0, report.ingested_files
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["stress", "ingest"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--writers", type=int, default=256)
    ap.add_argument("--events", type=int, default=20, help="stress: steps per writer")
    ap.add_argument("--reconcilers", type=int, default=3)
    ap.add_argument("--files", type=int, default=8, help="ingest: event files per trial")
    ap.add_argument("--json", type=Path, help="also write the runs and the median here")
    args = ap.parse_args()
    times = []
    runs: list[dict[str, object]] = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="dlhpc-bench-stress-") as tmp:
            if args.what == "stress":
                res = run_stress(
                    Path(tmp),
                    writers=args.writers,
                    events=args.events,
                    reconcilers=args.reconcilers,
                    seed=rep,
                )
                runs.append({"rep": rep, **dataclasses.asdict(res)})
                print(json.dumps(runs[-1]), flush=True)
                if res.problems:
                    sys.exit(f"rep {rep}: {len(res.problems)} problems")
                times.append(res.seconds)
            else:
                seconds, n = bench_ingest(Path(tmp), args.writers, args.files)
                runs.append({"rep": rep, "tick_s": round(seconds, 3), "files": n})
                print(json.dumps(runs[-1]), flush=True)
                times.append(seconds)
    median = statistics.median(times)
    print(f"{args.what}: median {median:.2f} s over {args.reps} runs")
    if args.json is not None:
        setting = {k: v for k, v in vars(args).items() if k != "json"}
        write_result(args.json, {**setting, "median_s": round(median, 3), "runs": runs})


if __name__ == "__main__":
    main()
