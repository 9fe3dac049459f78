#!/usr/bin/env python3
"""Benchmark: Slurm calls and tick time for a 200-trial experiment on the dev cluster.

Launches a random search of N trials (a trivial entrypoint that reports one metric),
then ticks until it is over, recording per tick the wall time and the external Slurm
commands run (by name). Prints a JSON summary with medians (``--json PATH``: also
writes it there).

    eval "$(scripts/dev-cluster env)"; . .venv/bin/activate
    python scripts/bench/tick/bench_tick.py --trials 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _result import write_result  # noqa: E402

EXPERIMENT = """\
name: bench-tick
entrypoint: python report.py
resources: {{cpus_per_task: 1, mem: "100M", time: "00:05:00"}}
hyperparameters:
  x: {{type: double, minval: 0.0, maxval: 1.0}}
searcher: {{name: random, metric: loss, max_trials: {trials}, max_length: 1, seed: 1}}
"""
REPORT = """\
import dlhpc
ctx = dlhpc.init()
ctx.report(1, {"loss": (ctx.hparams["x"] - 0.3) ** 2})
ctx.close()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--site", default="dev-cluster")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--pileup",
        action="store_true",
        help="do not tick until every job has left the queue, then time the ticks that ingest"
        " everything (a quiet machine: the jobs no longer compete for the CPUs)",
    )
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dlhpc-bench-"))
    os.environ["DLHPC_HOME"] = str(work / "home")
    (work / "exp").mkdir()
    (work / "exp" / "report.py").write_text(REPORT)
    (work / "exp" / "exp.yaml").write_text(EXPERIMENT.format(trials=args.trials))

    from dlhpc.config import load_experiment
    from dlhpc.orchestrator import launch, tick
    from dlhpc.orchestrator.pool import SchedulerPool
    from dlhpc.scheduler.plugins import BackendTable
    from dlhpc.search import SearcherTable
    from dlhpc.states import ExperimentState
    from dlhpc.store import Experiment, Store

    registry = BackendTable()
    cfg = load_experiment(
        work / "exp" / "exp.yaml", site=args.site, backends=registry, searchers=SearcherTable()
    )
    store = Store(Path(os.environ["DLHPC_HOME"]))
    pool = SchedulerPool(local_root=store.home / "local")
    t0 = time.monotonic()
    result = launch(cfg, store, pool)
    launch_s = time.monotonic() - t0
    launch_calls = dict(pool.calls())

    deadline = time.monotonic() + args.timeout
    if args.pileup:
        import subprocess

        jobs = set(result.job_ids)
        while jobs & set(
            subprocess.run(
                ["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, check=True
            ).stdout.split()
        ):
            if time.monotonic() > deadline:
                break
            time.sleep(2)
    ticks = []
    while True:
        report = tick(store, pool)
        ticks.append(
            {
                "duration_s": report.duration_s,
                "calls": report.scheduler_calls,
                "polled": report.polled_jobs,
                "files": report.ingested_files,
            }
        )
        with store.read() as s:
            exp = s.get(Experiment, result.experiment_id)
            assert exp is not None
            state = exp.state
        if state != ExperimentState.ACTIVE.value or time.monotonic() > deadline:
            break
        time.sleep(args.interval)

    busy = [t for t in ticks if t["polled"]]
    per_tick_queries = [
        sum(v for k, v in t["calls"].items() if k in ("squeue", "sacct")) for t in ticks
    ]
    summary = {
        "trials": args.trials,
        "pileup": args.pileup,
        "final_state": state,
        "launch_s": round(launch_s, 3),
        "launch_calls": launch_calls,
        "sbatch_calls": launch_calls.get("sbatch", 0),
        "ticks": len(ticks),
        "max_slurm_queries_per_tick": max(per_tick_queries),
        "median_slurm_queries_per_tick": statistics.median(per_tick_queries),
        "median_tick_s_while_jobs_polled": round(
            statistics.median(t["duration_s"] for t in busy), 3
        )
        if busy
        else None,
        "max_tick_s": round(max(t["duration_s"] for t in ticks), 3),
        "per_tick": ticks,
    }
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        write_result(args.json, summary)
    return 0 if state == ExperimentState.COMPLETED.value else 1


if __name__ == "__main__":
    sys.exit(main())
