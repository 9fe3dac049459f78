#!/usr/bin/env python3
"""Benchmark: hyperparameter search on the YAHPO Gym LCBench surrogate.

Every method gets the same budget of trial-epochs on each task, seed and worker count W,
in one discrete-event simulation of W GPUs and a virtual clock. dlhpc's searchers run
through their ask/tell API (``_lcbench_driver.py``: the orchestrator's tell/ask/act at
each decision time; ``--tick-interval`` 60 gives the decisions of ``dlhpc simulate``'s
real ``tick``, 0 lets them decide whenever an epoch ends); the peers (Optuna, Syne Tune,
the one-epoch top-K baseline) on the same worker model (``_lcbench_peers.py``). Curves
and epoch times come from the surrogate (``_lcbench_surrogate.py``: budget epochs 1..50
are its epochs 2..51). Measures (``_lcbench_measures.py``): epochs, GPU-hours and wall
time until a trial reports the task's best - 1 point (best of 2,000 random
configurations), against random search's exact expectation over those configurations,
and normalised regret at a log-spaced set of budgets. Protocol: docs/BENCHMARKS.md,
"Search on LCBench".

    pip install -e '.[bench]'   # onnxruntime, optuna, syne-tune
    python scripts/bench/lcbench/bench_search_lcbench.py --quick --json quick.json
    python scripts/bench/lcbench/bench_search_lcbench.py --tasks all --seeds 5 \\
        --workers 4,16 --json results.json --svg-dir out   # --resume: go on after a stop
    python scripts/bench/lcbench/bench_search_lcbench.py --report results.json   # the tables again
    # on 2 cores: two processes with --shard 0/2 and --shard 1/2, then
    # --report a.json,b.json (with --json c.json: merged into c.json)

A dlhpc method is a searcher name (``asha``), a label of :data:`PRESETS` (``asha-tpe``) or
``LABEL={YAML searcher mapping}`` with ``--searcher`` (``--searcher 'x={name: asha,
divisor: 2}'``), so any searcher dlhpc knows runs by its settings. The runs of one task
go seed by seed, each seed's W and methods sharing the surrogate's curves.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lcbench_dlhpc import make_method, searcher_section  # noqa: E402
from _lcbench_driver import run_ask_tell  # noqa: E402
from _lcbench_measures import Trace, checkpoints  # noqa: E402
from _lcbench_peers import MISSING, PEERS, make_peer, run_workers  # noqa: E402
from _lcbench_report import REGRET_BUDGETS, merge, write_report  # noqa: E402
from _lcbench_surrogate import MAX_LENGTH, Surrogate, TaskReference, reference  # noqa: E402

from dlhpc.errors import DlhpcError  # noqa: E402

# ``-tpe``: the default proposer; ``-tpe-all``: it with ``fidelity: all``
DLHPC_METHODS = (
    "random",
    "grid",
    "sha",
    "asha",
    "hyperband",
    "asha-tpe",
    "hyperband-tpe",
    "asha-tpe-all",
    "hyperband-tpe-all",
)
PRESETS: dict[str, dict[str, Any]] = {  # method labels that are not a searcher's bare name
    "asha": {"name": "asha", "proposer": "random"},  # a rung searcher's proposer, named
    "hyperband": {"name": "hyperband", "proposer": "random"},
    "asha-tpe": {"name": "asha", "proposer": "tpe"},
    "hyperband-tpe": {"name": "hyperband", "proposer": "tpe"},
    "asha-tpe-all": {"name": "asha", "proposer": {"name": "tpe", "fidelity": "all"}},
    "hyperband-tpe-all": {"name": "hyperband", "proposer": {"name": "tpe", "fidelity": "all"}},
}
# the declared protocol's methods; ``bayes`` (its GP fits take minutes a run) runs when named
DEFAULT_METHODS = ",".join((*DLHPC_METHODS, *PEERS))
DEFAULT_WORKERS = "1,4,16,64"
QUICK_TASKS = "7593,167168,167200,168329,168331,168910,189905,189909"  # fewest reach the target
QUICK_SEEDS = 3  # --quick: seeds 0-2, so that it fits the inner loop on two cores


def write_json(path: Path, result: dict[str, Any]) -> None:
    """Write ``result`` to ``path`` whole or not at all (a temporary file renamed over it),
    so that a run stopped at any moment leaves its last complete file for ``--resume``."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, path)


def parse_methods(names: str, extra: list[str]) -> list[tuple[str, dict[str, Any] | None]]:
    """(label, searcher mapping or None for a peer) per method, in the order given: a
    name in ``names`` is a peer, a :data:`PRESETS` label or a searcher's name. SystemExit
    with the offending text for a malformed ``--searcher``."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        is_peer = name in PEERS or name in MISSING
        out.append((name, None if is_peer else dict(PRESETS.get(name, {"name": name}))))
    for text in extra:
        label, sep, body = text.partition("=")
        try:
            mapping = yaml.safe_load(body) if sep else None
        except yaml.YAMLError as exc:
            raise SystemExit(f"--searcher {text!r}: not YAML: {exc}") from exc
        if not label.strip() or not isinstance(mapping, dict) or "name" not in mapping:
            raise SystemExit(f"--searcher {text!r}: expected LABEL={{name: ..., ...}}")
        out.append((label.strip(), mapping))
    return out


def one_run(
    label: str,
    section: dict[str, Any] | None,
    surrogate: Surrogate,
    task: str,
    seed: int,
    workers: int,
    args: argparse.Namespace,
) -> tuple[Trace, dict[str, Any]]:
    """One method, task, seed and W: its trace and facts."""
    if section is None:
        method = make_peer(label, seed, args.budget)
        return run_workers(method, surrogate, task, workers, args.budget, args.time_scale)
    full = searcher_section({**section, "seed": seed}, args.budget, workers)
    searcher = make_method(full, args.budget, workers)
    run = run_ask_tell(
        searcher,
        lambda hp: surrogate.curve(task, hp),
        workers,
        args.budget,
        args.tick_interval,
        args.time_scale,
    )
    facts = {
        "end": run.end,
        "max_trials": searcher.config.max_trials,
        "trials": len(run.told),
        "starts": run.starts,  # jobs started, a resumed trial again
        "searcher": full,
    }
    return run.trace, facts


def record(
    label: str,
    task: str,
    seed: int,
    workers: int,
    trace: Trace,
    facts: dict[str, Any],
    ref: TaskReference,
    marks: list[int],
    real_s: float,
) -> dict[str, Any]:
    return {
        "method": label,
        "task": task,
        "seed": seed,
        "workers": workers,
        "to_target": trace.to_target(ref.target),
        **trace.summary(),
        "digest": trace.digest(),
        "regret": trace.regret_at(marks, ref.regret),
        "regret_at": {
            str(b): r
            for b, r in zip(
                REGRET_BUDGETS, trace.regret_at(REGRET_BUDGETS, ref.regret), strict=True
            )
            if b <= trace.budget
        },
        "facts": facts,
        "real_s": real_s,
    }


def run_task(
    task: str,
    ref: TaskReference,
    methods: list[tuple[str, dict[str, Any] | None]],
    workers: list[int],
    surrogate: Surrogate,
    marks: list[int],
    args: argparse.Namespace,
    skipped: dict[str, str],
    save: Callable[[dict[str, Any]], None],
    done: set[tuple[str, str, int, int]],
) -> None:
    """Every seed, W and method on ``task``, each run given to ``save`` as it ends; a
    method that cannot run is added to ``skipped`` (with the reason) and not tried again;
    a run in ``done`` (method, task, seed, W: from the JSON resumed) is not run again.
    The surrogate's curves are kept for all the runs of one seed (a curve is a pure
    function of task and configuration, so sharing them changes no run; several
    methods draw the same configurations, and the same ones at every W)."""
    print(f"task {task}: best {ref.best:.3f}, target {ref.target:.3f}, share {ref.share:.4f}")
    for seed in range(args.seeds):
        surrogate.clear()  # the curves of one seed serve its every W and method
        for w in workers:
            for label, section in methods:
                if label in skipped or (label, task, seed, w) in done:
                    continue
                t0, c0 = time.monotonic(), time.process_time()
                try:
                    trace, facts = one_run(label, section, surrogate, task, seed, w, args)
                except (ImportError, ValueError, DlhpcError) as exc:
                    skipped[label] = f"{type(exc).__name__}: {exc}"
                    print(f"  skipped {label}: {skipped[label]}", flush=True)
                    continue
                rec = record(label, task, seed, w, trace, facts, ref, marks, 0.0)
                rec["real_s"] = round(time.monotonic() - t0, 3)
                rec["cpu_s"] = round(time.process_time() - c0, 3)  # this process's CPU
                save(rec)
                hit = rec["to_target"]
                print(
                    f"  {label} W={w} seed={seed}: to target"
                    f" {hit['epochs'] if hit else '> budget'} epochs,"
                    f" best {rec['best']}, {rec['real_s']:.1f} s ({rec['cpu_s']:.1f} CPU s)",
                    flush=True,
                )
    surrogate.clear()


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run; with ``--json`` the results so far are rewritten after every task."""
    t0, c0 = time.monotonic(), time.process_time()
    surrogate = Surrogate(args.data, args.metric)
    tasks = surrogate.tasks if args.tasks == "all" else args.tasks.split(",")
    shard, shards = (int(x) for x in args.shard.split("/"))
    tasks = tasks[shard::shards]
    methods = parse_methods(args.methods, args.searcher)
    workers = [int(w) for w in args.workers.split(",")]
    marks = checkpoints(args.budget, MAX_LENGTH)
    refs = {t: reference(surrogate, t, args.reference_samples, args.points) for t in tasks}
    result: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "references": {t: vars(r) for t, r in refs.items()},
        "checkpoints": marks,
        "runs": [],
        "skipped": {},
        "tasks_done": [],  # tasks with every method, W and seed; the others are partial
        "complete": False,
    }
    if args.resume:
        result = resumed(result, args.json)
    done = {(r["method"], r["task"], r["seed"], r["workers"]) for r in result["runs"]}

    def save(run: dict[str, Any] | None) -> None:
        if run is not None:
            result["runs"].append(run)
        result["runtime_s"] = time.monotonic() - t0
        result["cpu_s"] = time.process_time() - c0  # this process's, references included
        result["load"] = os.getloadavg()
        if args.json is not None:
            write_json(args.json, result)

    for task in tasks:
        if task in result["tasks_done"]:
            continue
        run_task(
            task,
            refs[task],
            methods,
            workers,
            surrogate,
            marks,
            args,
            result["skipped"],
            save,
            done,
        )
        result["tasks_done"].append(task)
        save(None)
    result["complete"] = True
    return result


_NOT_COMPARED = {"json", "svg_dir", "stem", "report", "partial_tasks", "resume", "quick"}


def resumed(fresh: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """The results in ``path`` (an earlier run of the same settings, stopped), to go on
    from: its runs are kept and not run again. Exits if the settings differ."""
    if path is None or not path.is_file():
        sys.exit("--resume needs --json naming the file of the run to go on with")
    old = json.loads(path.read_text())
    differ = sorted(
        k
        for k in set(old["args"]) | set(fresh["args"])
        if k not in _NOT_COMPARED and old["args"].get(k) != fresh["args"].get(k)
    )
    if differ or old["references"] != fresh["references"]:
        sys.exit(f"--resume: {path} was run with other settings: {differ or 'references'}")
    print(f"resumed {path}: {len(old['runs'])} runs, tasks done {old['tasks_done']}")
    return {
        **fresh,
        "runs": old["runs"],
        "skipped": old["skipped"],
        "tasks_done": old["tasks_done"],
    }


def done_tasks_only(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with only the runs of its ``tasks_done`` (a run written before that list
    existed counts every task as done); prints the tasks left out."""
    if "tasks_done" not in result:
        return result
    done = set(result["tasks_done"])
    left = sorted({r["task"] for r in result["runs"]} - done, key=int)
    if left:
        print(f"not finished, left out (--partial-tasks shows them): {', '.join(left)}")
    return {**result, "runs": [r for r in result["runs"] if r["task"] in done]}


def subset(result: dict[str, Any], tasks: str, workers: str | None) -> dict[str, Any]:
    """The runs of ``result`` on ``tasks`` ('all' or ids) at the W values of ``workers``
    (None: every W)."""
    ws = None if workers is None else {int(w) for w in workers.split(",")}
    keep = None if tasks == "all" else set(tasks.split(","))
    runs = [
        r
        for r in result["runs"]
        if (ws is None or r["workers"] in ws) and (keep is None or r["task"] in keep)
    ]
    return {**result, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="all", help="'all' or comma-separated OpenML task ids")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1")
    p.add_argument(
        "--workers",
        default=None,
        help=f"W values (GPUs), comma-separated (default {DEFAULT_WORKERS};"
        " with --report: every W)",
    )
    p.add_argument("--budget", type=int, default=200 * MAX_LENGTH, help="trial-epochs per run")
    p.add_argument("--methods", default=DEFAULT_METHODS, help="dlhpc searcher names and peers")
    p.add_argument("--searcher", action="append", default=[], help="LABEL={YAML mapping}")
    p.add_argument("--points", type=float, default=1.0, help="target = best - this")
    p.add_argument("--reference-samples", type=int, default=2000)
    p.add_argument("--metric", default="val_accuracy")
    p.add_argument(
        "--tick-interval",
        type=float,
        default=60.0,
        help="dlhpc's searchers decide every this many virtual s (dlhpc's tick);"
        " 0: whenever an epoch ends, as the peers",
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="x the surrogate's seconds")
    p.add_argument("--data", type=Path, default=None, help="the surrogate's folder")
    p.add_argument("--json", type=Path, default=None, help="write every run here")
    p.add_argument("--svg-dir", type=Path, default=None, help="write regret SVG + CSV here")
    p.add_argument("--stem", default="lcbench-regret", help="file name stem of the SVGs")
    p.add_argument("--shard", default="0/1", help="K/N: run every N-th task from the K-th")
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on with the stopped run in --json (same settings): its runs are kept",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"the inner loop: tasks {QUICK_TASKS}, seeds 0..{QUICK_SEEDS - 1}, W = 4"
        " (overrides --tasks, --seeds, --workers)",
    )
    p.add_argument(
        "--report",
        default=None,
        help="only the tables of these JSON files (shards); with --json, merged into it;"
        " with --tasks or --workers, of those tasks or W only (a side-by-side on a subset)",
    )
    p.add_argument(
        "--partial-tasks",
        action="store_true",
        help="with --report: also the runs of tasks not finished (some methods missing)",
    )
    args = p.parse_args(argv)
    k, _, n = args.shard.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        p.error(f"--shard: expected K/N with 0 <= K < N, got {args.shard!r}")
    if args.quick:
        args.tasks, args.seeds, args.workers = QUICK_TASKS, QUICK_SEEDS, "4"
    if args.report is not None:
        result = merge([json.loads(Path(f).read_text()) for f in args.report.split(",")])
        if args.json is not None:
            write_json(args.json, result)  # the shards as one file, every run kept
        result = done_tasks_only(result) if not args.partial_tasks else result
        result = subset(result, args.tasks, args.workers)
    else:
        args.workers = args.workers or DEFAULT_WORKERS
        result = run_all(args)
        if args.json is not None:
            write_json(args.json, result)
    print()
    print(write_report(result, args.svg_dir, args.stem))
    if "runtime_s" in result:
        print(f"\nruntime {result['runtime_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
