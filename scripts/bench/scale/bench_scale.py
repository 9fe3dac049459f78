#!/usr/bin/env python3
"""Benchmark: ``dlhpc tick`` and ``dlhpc status`` on one experiment of ``--trials`` trials.

The state is synthetic and built fast (``_bench_scale_state.py``): one ASHA
experiment of ``--trials`` trials after a long search, 1,000,000 metric points,
the live jobs' folders with one new event file each. Slurm is faked at the
scheduler-backend boundary only: each timed process registers a backend whose
``poll`` answers from a JSON file of job states (counted as one ``squeue`` and one
``sacct``), ``submit`` hands out job ids (``sbatch``) and ``cancel`` records
(``scancel``); everything else is the real CLI (``dlhpc.cli.main``). Each run starts
from a pristine copy of the state folder, so every timed tick polls, ingests, tells
the searcher, decides and submits the same work. Prints a markdown table: median
(min-max) wall time of the process, its peak RSS, and the SQL statements it ran.

    . .venv/bin/activate
    python scripts/bench/scale/bench_scale.py --trials 10000 --runs 5 [--baseline TREE] [--report]
        [--same-state] [--json RESULT.json]

``--baseline TREE`` times an older ``TREE/dlhpc`` too, alternating runs with this tree's so
that both see the same machine load. The baseline's own copy of this script
(``TREE/scripts/bench/scale/bench_scale.py`` or ``TREE/scripts/bench_scale.py``, which take
the same ``--build``/``--upgrade``/``--child`` arguments) builds its state, upgrades it and
runs its timed processes, since the state builder and the fake backend use each tree's
internals; with ``--same-state`` one state, built by this tree, is restored for both.
``--json`` writes every run's figures and, with a baseline, the median of the per-run ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench_scale_state import JOBS_FILE, build, freshen, install_fake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _result import write_result  # noqa: E402


def _child(argv: list[str]) -> int:
    """A timed process: count SQL statements, fake Slurm, run the real CLI."""
    from sqlalchemy import Engine, event

    home = Path(os.environ["DLHPC_HOME"])
    install_fake(home / JOBS_FILE)
    count = [0]
    event.listen(Engine, "before_cursor_execute", lambda *a: count.__setitem__(0, count[0] + 1))
    from dlhpc.cli.main import cli

    try:
        cli(argv, prog_name="dlhpc")
    except SystemExit as e:
        code = int(e.code or 0)
    else:
        code = 0
    # the peak RSS of this process since exec (VmHWM; a fork's pre-exec pages excluded)
    status = Path("/proc/self/status").read_text()
    hwm = int(status.split("VmHWM:", 1)[1].split()[0])
    sys.stderr.write(f"\nBENCH_SQL={count[0]} BENCH_RSS_KB={hwm}\n")
    return code


def _upgrade(home: Path) -> int:
    """Untimed: bring the DB to this tree's schema, as ``dlhpc db migrate`` does (its
    migrations, nothing when the version is already this tree's; no backup: the copy
    is thrown away), then store each experiment's searcher state as this tree's code
    stores it.

    What an upgrade of dlhpc does once (``db migrate``, then the first tick loads a
    state written by an older version and saves it in the current format); run before
    the timed commands so that they see the steady state of the tree being measured."""
    import sqlite3

    from dlhpc.config import ExperimentConfig
    from dlhpc.config.serde import from_jsonable
    from dlhpc.orchestrator.stored import searcher_of, state_json
    from dlhpc.store.engine import SCHEMA_VERSION, make_engine, migrate, read_version

    reader = make_engine(home / "dlhpc.db", writer=False)
    version = read_version(reader)
    reader.dispose()
    if version != SCHEMA_VERSION:
        writer = make_engine(home / "dlhpc.db", writer=True)
        print("schema v{} -> v{}".format(*migrate(writer)))
        writer.dispose()
    db = sqlite3.connect(home / "dlhpc.db")
    rows = db.execute("SELECT id, config_json, searcher_state FROM experiments").fetchall()
    changed = 0
    for exp_id, config, state in rows:
        cfg = from_jsonable(ExperimentConfig, json.loads(config))
        new = state_json(searcher_of(cfg, state or ""))
        if new != state:
            db.execute("UPDATE experiments SET searcher_state = ? WHERE id = ?", (new, exp_id))
            changed += 1
    db.commit()
    db.close()
    print(changed)
    return 0


def _script(tree: Path | None) -> str:
    """The benchmark script whose ``--build``/``--upgrade``/``--child`` serve ``tree``."""
    if tree is None:
        return __file__
    for rel in ("scripts/bench/scale/bench_scale.py", "scripts/bench_scale.py"):
        if (tree / rel).is_file():
            return str(tree / rel)
    raise SystemExit(f"--baseline {tree}: it has no copy of this benchmark script")


def _env(home: Path, tree: Path | None) -> dict[str, str]:
    env = {**os.environ, "DLHPC_HOME": str(home)}
    if tree is not None:  # the dlhpc package of another tree (the baseline)
        env["PYTHONPATH"] = str(tree)
    return env


def _timed(home: Path, tree: Path | None, argv: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(
            [sys.executable, _script(tree), "--child", *argv],
            env=_env(home, tree),
            stdout=out,
            stderr=err,
        )
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode()
        out.seek(0)
        stdout = out.read().decode()
    if p.returncode != 0:
        raise SystemExit(f"{argv} failed ({p.returncode}):\n{stdout[-2000:]}\n{text[-3000:]}")
    sql = int(text.rsplit("BENCH_SQL=", 1)[1].split()[0])
    rss = int(text.rsplit("BENCH_RSS_KB=", 1)[1].split()[0])
    cpu = usage.ru_utime + usage.ru_stime  # less sensitive to other processes' load
    return {"wall_s": wall, "cpu_s": cpu, "rss_mib": rss / 1024, "sql": sql, "out": stdout}


def _cell(runs: list[dict[str, Any]]) -> str:
    w = [r["wall_s"] for r in runs]
    return (
        f"{statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) | "
        f"{statistics.median(r['cpu_s'] for r in runs):.2f} | "
        f"{max(r['rss_mib'] for r in runs):.0f} | {statistics.median(r['sql'] for r in runs):.0f}"
    )


COMMANDS = {  # in this order on one state: the second tick finds nothing new
    "dlhpc tick": ["tick", "--json"],
    "dlhpc tick (again: nothing new)": ["tick", "--json"],
    "dlhpc status 1": ["status", "1"],
    "dlhpc status 1 --json": ["status", "1", "--json"],
}
# with --report, last: the page, which rewrites the stale curve archives the ticks left
REPORT = {"dlhpc report 1 (after the ticks)": ["report", "1", "-o", "{home}/exp-1.html"]}
Results = dict[tuple[str, str], list[dict[str, Any]]]  # (tree, command) -> its runs


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--concurrent", type=int, default=400)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--report", action="store_true", help="time `dlhpc report 1` too")
    ap.add_argument("--work", type=Path, default=None, help="keep the state here")
    ap.add_argument(
        "--baseline", type=Path, default=None, help="a tree holding an older dlhpc/ to compare"
    )
    ap.add_argument(
        "--same-state",
        action="store_true",
        help="one state (built by this tree, in WORK/home) restored for both trees",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    return ap.parse_args()


def _homes(work: Path, trees: dict[str, Path | None], same: bool) -> dict[str, Path]:
    """Each tree's state folder: its own (``WORK/NAME/home``), or one for all."""
    return {name: work / "home" if same else work / name / "home" for name in trees}


def _build(home: Path, tree: Path | None, args: argparse.Namespace, name: str) -> None:
    """The state, built in place (the DB holds absolute paths) and kept aside as
    ``pristine`` next to ``home``, unless it is there already."""
    pristine = home.parent / "pristine"
    if (pristine / "dlhpc.db").exists():
        return
    t0 = time.perf_counter()
    shutil.rmtree(home, ignore_errors=True)
    argv = [sys.executable, _script(tree), "--build", str(home)]
    argv += [str(args.trials), str(args.concurrent)]
    made = subprocess.run(
        argv, env=_env(home, tree), check=True, capture_output=True, text=True
    ).stdout
    shutil.copytree(home, pristine)
    print(f"{name}: built in {time.perf_counter() - t0:.1f} s: {made.strip()}")


def _one_run(home: Path, tree: Path | None, commands: dict[str, list[str]]) -> dict[str, Any]:
    """The commands, in order, on a fresh copy of the pristine state."""
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(home.parent / "pristine", home)
    freshen(home)
    subprocess.run(  # untimed; see _upgrade
        [sys.executable, _script(tree), "--upgrade", str(home)],
        env=_env(home, tree),
        check=True,
        capture_output=True,
    )
    os.sync()  # else the first timed commit flushes this copy (0.4 s at 100,000)
    out = {}
    for label, argv in commands.items():
        argv = [a.replace("{home}", str(home)) for a in argv]
        run = {"load": os.getloadavg()[0], **_timed(home, tree, argv)}
        if label != "dlhpc tick":  # only the tick's output is read (_print)
            run.pop("out")
        out[label] = run
    return out


def _summary(args: argparse.Namespace, trees: list[str], results: Results) -> dict[str, Any]:
    """The results as JSON: per command and tree the runs' wall and CPU times (user +
    system), peak RSS and SQL statements, their medians; with two trees, the median of
    the per-run ratios (second tree / first, each run's two measured one after the
    other), of wall and of CPU time."""
    commands: dict[str, Any] = {}
    for (name, label), runs in results.items():
        walls, cpus = [r["wall_s"] for r in runs], [r["cpu_s"] for r in runs]
        commands.setdefault(label, {})[name] = {
            "wall_s": [round(w, 3) for w in walls],
            "median_s": round(statistics.median(walls), 3),
            "cpu_s": [round(c, 3) for c in cpus],
            "median_cpu_s": round(statistics.median(cpus), 3),
            "rss_mib": [round(r["rss_mib"], 1) for r in runs],
            "median_rss_mib": round(statistics.median(r["rss_mib"] for r in runs), 1),
            "max_rss_mib": round(max(r["rss_mib"] for r in runs), 1),
            "sql": statistics.median(r["sql"] for r in runs),
        }
    if len(trees) == 2:
        for label, per_tree in commands.items():
            pairs = list(zip(results[(trees[0], label)], results[(trees[1], label)], strict=True))
            for key in ("wall_s", "cpu_s"):
                ratio = statistics.median(b[key] / a[key] for a, b in pairs)
                per_tree[f"median_ratio_{key}"] = round(ratio, 3)
    loads = [r["load"] for runs in results.values() for r in runs]
    return {
        "trials": args.trials,
        "runs": args.runs,
        "trees": trees,
        "load_1min": [min(loads), max(loads)],
        "commands": commands,
    }


def _print(trees: list[str], labels: list[str], results: Results) -> None:
    for name in trees:
        r = json.loads(results[(name, "dlhpc tick")][-1]["out"])
        print(
            f"{name}: last tick {r['polled_jobs']} jobs polled, {r['ingested_files']} files,"
            f" {r['metrics']} metrics, {r['decisions']} decisions, {r['submitted']} submitted,"
            f" scheduler calls {r['scheduler_calls']}, errors {r['errors'][:3]}"
        )
    loads = [r["load"] for runs in results.values() for r in runs]
    runs = len(results[(trees[0], labels[0])])
    print(
        f"\n{runs} runs each; load average {min(loads):.1f}-{max(loads):.1f}"
        f" on {os.cpu_count()} CPUs\n"
    )
    head = " | ".join(
        f"{n}: median s (min-max) | {n}: median CPU s | {n}: peak RSS MiB | {n}: SQL" for n in trees
    )
    print(f"| command | {head} |")
    print("|---" * (1 + 4 * len(trees)) + "|")
    for label in labels:
        print(f"| `{label}` | " + " | ".join(_cell(results[(n, label)]) for n in trees) + " |")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return _child(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--upgrade":
        return _upgrade(Path(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "--build":  # apart: the timed children fork small
        print(json.dumps(build(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
        return 0
    args = _args()
    work = args.work or Path(tempfile.mkdtemp(prefix="dlhpc-scale-"))
    trees: dict[str, Path | None] = {"after": None}
    if args.baseline is not None:
        trees = {"before": args.baseline.resolve(), **trees}
    homes = _homes(work, trees, args.same_state)
    for name, tree in trees.items():
        if args.same_state:  # this tree's code builds the one state
            tree = None
        _build(homes[name], tree, args, name)
    commands = {**COMMANDS, **(REPORT if args.report else {})}
    results: Results = {}
    for _ in range(args.runs):  # the trees alternate: both see the same machine load
        for name, tree in trees.items():
            for label, run in _one_run(homes[name], tree, commands).items():
                results.setdefault((name, label), []).append(run)
    _print(list(trees), list(commands), results)
    if args.json is not None:
        write_result(args.json, _summary(args, list(trees), results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
