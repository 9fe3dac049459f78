"""Does ``dlhpc simulate`` tell the truth? (protocol: docs/BENCHMARKS.md)

Runs the digits example under the default search (``asha``, its proposer the
default ``tpe``), shrunk to the search smoke test's shape, on the dev cluster
(``dlhpc launch``, then ``dlhpc tick -q`` every ``--tick`` seconds until the
experiment ends), measures its compute (slot-hours, trial-epochs) and wall
time, then runs ``dlhpc simulate --curves experiment:ID`` on the same state folder
with the cluster's measured queue wait and start-up, and prints measured,
predicted and their ratio. Run it inside the dev cluster's world::

    scripts/dev-cluster exec --slurm 24.11 --profile default -- \\
      env -C "$PWD" PYTHONPATH="$PWD" .venv/bin/python \\
      scripts/bench/simulate_truth/bench_simulate_truth.py

``--home DIR --experiment ID`` skips the cluster run and simulates a finished one
again (the same measurements; used to check a simulator fix on the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _result import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
DIGITS = REPO / "templates" / "examples" / "digits"
SEARCHER = (  # test_search_cluster.py's DEFAULT_SEARCH
    "{name: asha, metric: val_accuracy, smaller_is_better: false, max_trials: 9,"
    " max_length: 9, divisor: 3, max_rungs: 3, max_concurrent_trials: 4, seed: 3}"
)
METRIC = "val_accuracy"
STEP_SLEEP = 0.05  # seconds per batch: about 1-2 s per epoch
SLOTS = 16  # the dev cluster's CPUs (2 nodes x 8); one slot per 1-CPU trial


def write_experiment(folder: Path) -> Path:
    """The example's train.py and its asha.yaml with :data:`SEARCHER`."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(DIGITS / "train.py", folder / "train.py")
    text = (DIGITS / "asha.yaml").read_text()
    head = text[: text.index("searcher:")]
    head = head.replace(
        "  batch_size: {type: categorical, vals: [32, 64, 128]}\n",
        f"  batch_size: {{type: categorical, vals: [32, 64, 128]}}\n  step_sleep: {STEP_SLEEP}\n",
    )
    path = folder / "exp.yaml"
    path.write_text(head + f"searcher: {SEARCHER}\n")
    return path


def dlhpc(env: dict[str, str], *args: str) -> str:
    """Run the ``dlhpc`` CLI; its stdout (exits on failure with its output)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dlhpc", *args], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"dlhpc {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def status(env: dict[str, str], exp_id: int) -> dict[str, Any]:
    out = json.loads(dlhpc(env, "status", str(exp_id), "--json"))
    return out["experiments"][0]  # type: ignore[no-any-return]


def run_real(env: dict[str, str], yaml: Path, tick_s: float, timeout_s: float) -> int:
    """Launch, then tick every ``tick_s`` seconds (fixed period; later when a tick and
    the status read take longer) until it ends; prints the mean period reached."""
    exp_id = int(json.loads(dlhpc(env, "launch", str(yaml), "--json"))["experiment_id"])
    print(f"launched experiment {exp_id}", flush=True)
    t0 = time.monotonic()
    nxt = t0
    ticks: list[float] = []
    while True:
        ticks.append(time.monotonic())
        dlhpc(env, "tick", "-q")
        exp = status(env, exp_id)
        if exp["state"] != "ACTIVE":
            period = (ticks[-1] - ticks[0]) / max(1, len(ticks) - 1)
            print(
                f"experiment {exp_id} {exp['state']} after {time.monotonic() - t0:.0f} s,"
                f" {len(ticks)} ticks, mean period {period:.2f} s"
            )
            return exp_id
        if time.monotonic() - t0 > timeout_s:
            sys.exit(f"experiment {exp_id} still ACTIVE after {timeout_s:.0f} s")
        nxt += tick_s
        time.sleep(max(0.0, nxt - time.monotonic()))


def _ts(text: str | None) -> float | None:
    """A DB DateTime (naive UTC text) as epoch seconds."""
    if text is None:
        return None
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def cluster_knobs(db: Path, exp_id: int) -> dict[str, float]:
    """Queue wait (mean) and start-up (median) of the real run; see the protocol."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        attempts = con.execute(
            "SELECT a.id, a.trial_id, a.started_at, s.created_at FROM attempts a"
            " JOIN trials t ON t.id = a.trial_id LEFT JOIN submissions s ON s.id = a.submission_id"
            " WHERE t.experiment_id = ?",
            (exp_id,),
        ).fetchall()
        points = con.execute(
            "SELECT m.attempt_id, m.trial_id, m.step, m.time FROM metrics m"
            " JOIN trials t ON t.id = m.trial_id WHERE t.experiment_id = ? AND m.name = ?"
            " ORDER BY m.attempt_id, m.step",
            (exp_id, METRIC),
        ).fetchall()
    finally:
        con.close()
    waits = [
        s - c
        for _a, _t, st, cr in attempts
        if (s := _ts(st)) is not None and (c := _ts(cr)) is not None
    ]
    by_attempt: dict[int, list[tuple[int, float]]] = {}
    trial_of: dict[int, int] = {}
    for att, trial, step, at in points:
        by_attempt.setdefault(att, []).append((step, at))
        trial_of[att] = trial
    gaps: dict[int, list[float]] = {}
    for att, pts in by_attempt.items():
        for (s0, t0), (s1, t1) in zip(pts, pts[1:], strict=False):
            gaps.setdefault(trial_of[att], []).append((t1 - t0) / max(1, s1 - s0))
    every = [g for gs in gaps.values() for g in gs]
    epoch = statistics.median(every) if every else 0.0
    starts = {a: _ts(st) for a, _t, st, _c in attempts}
    startups = []
    for att, pts in by_attempt.items():
        begun = starts.get(att)
        if begun is not None:
            own = gaps.get(trial_of[att])
            startups.append(pts[0][1] - begun - (statistics.median(own) if own else epoch))
    return {
        "queue_wait_s": statistics.mean(waits) if waits else 0.0,
        "startup_s": max(0.0, statistics.median(startups)) if startups else 0.0,
        "epoch_s": epoch,
    }


def measured(env: dict[str, str], db: Path, exp_id: int, cpus: int) -> dict[str, float]:
    exp = status(env, exp_id)
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        created, ended = con.execute(
            "SELECT created_at, ended_at FROM experiments WHERE id = ?", (exp_id,)
        ).fetchone()
    finally:
        con.close()
    return {
        "slot_hours": float(exp["cpu_hours"]) / cpus,
        "epochs": float(sum(t["steps_completed"] for t in exp["trials"])),
        "wall_hours": ((_ts(ended) or 0.0) - (_ts(created) or 0.0)) / 3600,
        "trials": float(len(exp["trials"])),
    }


def predicted(
    env: dict[str, str], yaml: Path, exp_id: int, knobs: dict[str, float], args: argparse.Namespace
) -> dict[str, Any]:
    argv = [
        "simulate", str(yaml), "--curves", f"experiment:{exp_id}", "--alternatives", "none",
        "--reps", str(args.reps), "--gpus", str(SLOTS),
        "--queue-wait", f"{knobs['queue_wait_s']:.3f}", "--startup", f"{knobs['startup_s']:.3f}",
        "--tick-interval", str(args.tick), "--json",
    ]  # fmt: skip
    print("dlhpc " + " ".join(argv), flush=True)
    out = json.loads(dlhpc(env, *argv))
    summary = out["searchers"][0]
    run0 = summary["runs"][0]
    return {
        "median": {
            "slot_hours": summary["median_gpu_hours"],
            "epochs": summary["median_epochs"],
            "wall_hours": summary["median_wall_hours"],
            "trials": summary["median_trials"],
        },
        "run0": {
            "slot_hours": run0["gpu_hours"],
            "epochs": run0["epochs"],
            "wall_hours": run0["wall_hours"],
            "trials": run0["trials"],
        },
        "argv": argv,
    }


def table(real: dict[str, float], pred: dict[str, Any]) -> str:
    rows = [f"{'':14}{'measured':>12}{'sim median':>12}{'ratio':>8}{'sim run 0':>12}{'ratio':>8}"]
    for key in ("slot_hours", "epochs", "wall_hours", "trials"):
        m, p, r0 = real[key], pred["median"][key], pred["run0"][key]
        scale = 3600.0 if key.endswith("hours") else 1.0  # hours shown as seconds
        name = key.replace("_hours", " (s)")
        rows.append(
            f"{name:14}{m * scale:12.1f}{p * scale:12.1f}{p / m if m else float('nan'):8.3f}"
            f"{r0 * scale:12.1f}{r0 / m if m else float('nan'):8.3f}"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a new one)")
    ap.add_argument("--tick", type=float, default=10.0, help="seconds between ticks")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--home", type=Path, default=None, help="a finished run's DLHPC_HOME")
    ap.add_argument("--experiment", type=int, default=None, help="its experiment id")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    out = args.out or Path(f"/tmp/dlhpc-simtruth-{os.getpid()}")
    yaml = write_experiment(out / "digits")
    home = args.home or out / "home"
    env = {**os.environ, "DLHPC_HOME": str(home), "DLHPC_SITE": "dev-cluster"}
    if args.home is None:
        exp_id = run_real(env, yaml, args.tick, args.timeout)
    elif args.experiment is None:
        sys.exit("--home needs --experiment")
    else:
        exp_id = args.experiment
    db = home / "dlhpc.db"
    knobs = cluster_knobs(db, exp_id)
    real = measured(env, db, exp_id, cpus=1)
    pred = predicted(env, yaml, exp_id, knobs, args)
    print(f"home {home}, experiment {exp_id}; load average {os.getloadavg()}")
    rounded = {k: round(v, 2) for k, v in knobs.items()}
    print(f"cluster knobs from the real run: {json.dumps(rounded)}")
    print(table(real, pred))
    result = {"experiment": exp_id, "home": str(home), "knobs": knobs, "measured": real, **pred}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    if args.json is not None:
        write_result(args.json, {k: v for k, v in result.items() if k != "home"})


if __name__ == "__main__":
    main()
