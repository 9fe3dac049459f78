#!/usr/bin/env python3
"""Benchmark: `dlhpc report` on a synthetic experiment of N trials x P points.

Builds a state DB in a temporary folder (one asha experiment, N trials with two
attempts each, P metric points of the searcher metric per trial, GPU samples),
archives every trial's curves into its ``curves.h5`` the way a page build rewrites
stale ones (batches of 64 trials), then writes the report page. Prints
a JSON summary: archive time per trial, archive file size, page build time, page size.

    .venv/bin/python scripts/bench/report/bench_report.py --trials 1000 --points 100 \
        --json scripts/bench/report/result.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _result import write_result  # noqa: E402

from dlhpc.report._curves import archive_trials, curves_path  # noqa: E402
from dlhpc.report.build import write_report  # noqa: E402
from dlhpc.store import Attempt, Experiment, GpuSample, Metric, Store, Trial  # noqa: E402

T0 = datetime(2025, 1, 1)
BATCH = 64  # the reconciler's ingest batch (attempt folders per write transaction)


def build(store: Store, root: Path, trials: int, points: int) -> dict[int, str]:
    config = {
        "entrypoint": "python train.py",
        "resources": {"nodes": 1, "gpus_per_node": 4, "tasks_per_node": 4, "cpus_per_task": 8},
        "searcher": {"name": "asha", "max_length": points, "divisor": 3, "max_rungs": 4},
        "hyperparameters": {
            "lr": {"type": "log"},
            "batch_size": {"type": "categorical"},
            "dropout": {"type": "double"},
            "hidden": {"type": "int"},
        },
    }
    run_dirs = {}
    with store.write() as s:
        e = Experiment(
            name="bench-report",
            state="COMPLETED",
            backend="slurm",
            site="bench",
            searcher="asha",
            metric="val_loss",
            smaller_is_better=True,
            source_path=str(root / "exp.yaml"),
            yaml_text="name: bench-report\n",
            config_json=json.dumps(config),
            run_dir=str(root / "run"),
            created_at=T0,
            ended_at=T0 + timedelta(hours=30),
        )
        s.add(e)
        s.flush()
        for i in range(trials):
            rate = 0.01 + (i % 97) / 2000
            values = [2.0 * math.exp(-rate * k) + 0.05 * math.sin(i + k) for k in range(points)]
            start = T0 + timedelta(seconds=60 * i)
            t = Trial(
                experiment_id=e.id,
                request_id=i,
                state="COMPLETED" if i % 3 else "STOPPED_EARLY",
                hparams_json=json.dumps(
                    {
                        "lr": 10 ** (-4 + (i % 31) / 10),
                        "batch_size": (32, 64, 128)[i % 3],
                        "dropout": (i % 11) / 20,
                        "hidden": 16 + i % 113,
                    }
                ),
                max_length=points,
                seed=i,
                run_dir="",
                steps_completed=points,
                best_metric=min(values),
                latest_metric=values[-1],
                restarts=1,
                created_at=start,
                ended_at=start + timedelta(minutes=20),
            )
            s.add(t)
            s.flush()
            t.run_dir = str(root / "run" / "trials" / f"trial-{t.id:06d}")
            run_dirs[t.id] = t.run_dir
            a0 = Attempt(
                trial_id=t.id,
                attempt_key=f"{i}_0.r0",
                job_id=f"100_{i}",
                state="SUPERSEDED",
                cause="preempted",
                exit_code=143,
                lost_steps=3,
                node_list="gpu01",
                started_at=start,
                ended_at=start + timedelta(minutes=5),
                created_at=start,
            )
            a1 = Attempt(
                trial_id=t.id,
                attempt_key=f"{i}_0.r1",
                job_id=f"100_{i}",
                state="COMPLETED",
                cause="completed",
                exit_code=0,
                node_list="gpu02",
                started_at=start + timedelta(minutes=6),
                ended_at=start + timedelta(minutes=20),
                created_at=start + timedelta(minutes=5),
            )
            s.add_all([a0, a1])
            s.flush()
            base = start.timestamp()
            s.execute(
                Metric.__table__.insert(),
                [
                    {
                        "trial_id": t.id,
                        "attempt_id": a1.id,
                        "step": k + 1,
                        "name": "val_loss",
                        "value": v,
                        "time": base + 12.0 * k,
                    }
                    for k, v in enumerate(values)
                ],
            )
            s.execute(
                GpuSample.__table__.insert(),
                [
                    {
                        "attempt_id": a1.id,
                        "time": base + 400 + 30 * k,
                        "host": "gpu02",
                        "gpu_index": g,
                        "util": 60 + (i + k + g) % 40,
                    }
                    for k in range(3)
                    for g in range(4)
                ],
            )
    return run_dirs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--keep", type=Path, default=None, help="Also copy the page here.")
    parser.add_argument("--json", type=Path, help="also write the result (with its setting) here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dlhpc-bench-report-") as tmp:
        root = Path(tmp)
        store = Store(root / "home")
        t = time.perf_counter()
        run_dirs = build(store, root, args.trials, args.points)
        build_s = time.perf_counter() - t
        ids = list(run_dirs)
        per_batch = []
        for i in range(0, len(ids), BATCH):
            chunk = {tid: run_dirs[tid] for tid in ids[i : i + BATCH]}
            t = time.perf_counter()
            _, errors = archive_trials(store, chunk)
            per_batch.append((time.perf_counter() - t) / len(chunk))
            assert not errors, errors
        sizes = [curves_path(d).stat().st_size for d in run_dirs.values()]
        page = root / "report.html"
        t = time.perf_counter()
        size = write_report(store, 1, page, now=T0 + timedelta(hours=31))
        page_s = time.perf_counter() - t
        if args.keep is not None:
            args.keep.write_bytes(page.read_bytes())
        store.close()
    result = {
        "trials": args.trials,
        "points_per_trial": args.points,
        "db_build_s": round(build_s, 2),
        "archive_ms_per_trial_median": round(statistics.median(per_batch) * 1000, 2),
        "archive_ms_per_trial_max_batch": round(max(per_batch) * 1000, 2),
        "curves_h5_bytes_median": int(statistics.median(sizes)),
        "page_build_s": round(page_s, 2),
        "page_bytes": size,
        "page_mb": round(size / 1e6, 2),
    }
    print(json.dumps(result, indent=2))
    if args.json is not None:
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
