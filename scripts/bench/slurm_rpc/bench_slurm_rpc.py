#!/usr/bin/env python3
"""Benchmark: slurmctld RPCs per ``dlhpc tick`` and ``sbatch`` RPCs per launch, by ``sdiag``.

For each size in ``--sizes`` it launches a random search of that many trials on the dev
cluster, held (``sbatch --hold``: the tasks stay PENDING, so the machine stays idle and
the queue does not change between ticks), runs ``--ticks`` ticks and reads, around each,
the deltas of ``sdiag``'s RPC counters. A last experiment of ``--launch`` trials (run
once with the cluster's ``MaxArraySize`` and once with ``site.max_array_size`` =
``--max-array``) counts the ``REQUEST_SUBMIT_BATCH_JOB`` RPCs of one launch. Everything
it submits is cancelled at the end.

sdiag counts RPCs cluster-wide, by message type, and per user. Other work on the cluster
(tests, other people) runs as other processes of the same user, so with ``--as-user
NAME`` the Slurm *query* commands dlhpc runs (squeue, sacct, scontrol; and, for the
``--launch`` experiment, sbatch, fed the script on stdin) are run as that Unix user
through a PATH shim: that user's sdiag count is then exactly dlhpc's RPCs. The
message-type table is cluster-wide (sdiag has no per-user breakdown by type) and so
includes any concurrent activity. The shim also logs every command it runs, which gives
the number of Slurm processes per tick. sacct talks to slurmdbd, not slurmctld: it does
not appear in sdiag and is counted from the shim's log.

    # dlhpc-user: the unprivileged user `scripts/dev-cluster up` creates in a chroot cluster
    scripts/dev-cluster exec --slurm 24.11 --profile default -- .venv/bin/python \\
        scripts/bench/slurm_rpc/bench_slurm_rpc.py --sizes 10,300 --ticks 5 --launch 1000 \\
        --max-array 100 --as-user dlhpc-user
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _result import write_result  # noqa: E402

EXPERIMENT = """\
name: bench-rpc-{trials}
entrypoint: sleep 5
resources:
  cpus_per_task: 1
  mem: 100M
  time: "00:05:00"
  sbatch_args: [{hold}]
hyperparameters:
  x: {{type: double, minval: 0.0, maxval: 1.0}}
searcher: {{name: random, metric: loss, max_trials: {trials}, max_length: 1, seed: 1}}
"""
_TYPE_RE = re.compile(r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)")
_QUERIES = ("squeue", "sacct", "scontrol")
_SHIM = """#!/bin/bash
printf '%s\\n' "{name}" >> {log}
{run}
"""


def sdiag() -> tuple[Counter[str], Counter[str]]:
    """(RPC counts by message type, by user) from ``sdiag``."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    types: Counter[str] = Counter()
    users: Counter[str] = Counter()
    section = ""
    for line in out.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            section = "type"
        elif line.startswith("Remote Procedure Call statistics by user"):
            section = "user"
        elif line and not line[0].isspace():
            section = ""
        elif section:
            m = _TYPE_RE.match(line)
            if m:
                (types if section == "type" else users)[m[1]] += int(m[2])
    return types, users


def make_shims(folder: Path, user: str | None, log: Path, with_sbatch: bool) -> None:
    """squeue/sacct/scontrol (and sbatch) wrappers that log and, with ``user``, run as it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*_QUERIES, "sbatch", "scancel"):
        real = shutil.which(name)
        assert real is not None, f"{name} not on PATH"
        as_user = user is not None and (name in _QUERIES or (with_sbatch and name == "sbatch"))
        if not as_user:
            run = f'exec {real} "$@"'
        elif name == "sbatch":  # the job script on stdin: that user may not read the file
            run = f'exec runuser -u {user} -- {real} "${{@:1:$#-1}}" < "${{@: -1}}"'
        else:
            run = f'exec runuser -u {user} -- {real} "$@"'
        path = folder / name
        path.write_text(_SHIM.format(name=name, log=log, run=run))
        path.chmod(0o755)


class Bench:
    def __init__(self, work: Path, user: str | None) -> None:
        self.work = work
        self.user = user

    def dlhpc(self, home: Path, shims: Path, *args: str) -> dict[str, Any]:
        env = dict(os.environ, DLHPC_HOME=str(home), PATH=f"{shims}:{os.environ['PATH']}")
        proc = subprocess.run(
            [sys.executable, "-m", "dlhpc", *args, "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        if proc.returncode != 0:
            raise SystemExit(f"dlhpc {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return json.loads(proc.stdout)  # type: ignore[no-any-return]

    def experiment(
        self, trials: int, max_array: int | None, sbatch_as_user: bool, hold: bool = True
    ) -> Path:
        folder = Path(tempfile.mkdtemp(prefix=f"e{trials}-", dir=self.work))
        site = (REPO / "site-configs" / "dev-cluster.yaml").read_text()
        if max_array is not None:
            site += f"\nmax_array_size: {max_array}\n"
        (folder / "site.yaml").write_text(site)
        (folder / "exp.yaml").write_text(
            EXPERIMENT.format(trials=trials, hold='"--hold"' if hold else "") + "site: site.yaml\n",
            encoding="utf-8",
        )
        make_shims(folder / "shims", self.user, folder / "calls.log", sbatch_as_user)
        return folder

    def calls(self, folder: Path) -> Counter[str]:
        log = folder / "calls.log"
        return Counter(log.read_text().split()) if log.exists() else Counter()

    def measured(
        self, folder: Path, *args: str
    ) -> tuple[dict[str, Any], Counter[str], int, Counter[str]]:
        """(dlhpc's JSON, sdiag type deltas, this user's RPC delta, Slurm commands run)."""
        before_calls = self.calls(folder)
        t0, u0 = sdiag()
        out = self.dlhpc(folder / "home", folder / "shims", *args)
        t1, u1 = sdiag()
        mine = (u1[self.user] - u0[self.user]) if self.user else -1
        return out, t1 - t0, mine, self.calls(folder) - before_calls


def _ids(out: dict[str, Any]) -> list[str]:
    ids = out.get("slurm_job_ids")
    return [str(i) for i in ids] if isinstance(ids, list) else []


def run_to_end(bench: Bench, trials: int, submitted: list[str]) -> dict[str, object]:
    """Tick an experiment whose tasks really run until it ends (or 300 s): per-tick
    Slurm commands and this user's RPCs, with jobs pending, running and ending."""
    folder = bench.experiment(trials, None, sbatch_as_user=False, hold=False)
    out, _, _, _ = bench.measured(folder, "launch", str(folder / "exp.yaml"))
    submitted += _ids(out)
    exp_id = str(out["experiment_id"])
    ticks: list[dict[str, Any]] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        rep, _, mine, cmds = bench.measured(folder, "tick")
        ticks.append({"user_rpcs": mine, "commands": dict(cmds), "finished": rep.get("finished")})
        status = bench.dlhpc(folder / "home", folder / "shims", "status", exp_id)
        experiments = status["experiments"]
        assert isinstance(experiments, list)
        if experiments[0]["state"] != "ACTIVE":
            break
        time.sleep(2)
    queries = [sum(t["commands"].get(c, 0) for c in ("squeue", "sacct")) for t in ticks]
    return {
        "trials": trials,
        "ticks": len(ticks),
        "final_state": experiments[0]["state"],
        "max_squeue_per_tick": max(t["commands"].get("squeue", 0) for t in ticks),
        "max_sacct_per_tick": max(t["commands"].get("sacct", 0) for t in ticks),
        "max_queries_per_tick": max(queries),
        "max_user_rpcs_per_tick": max(t["user_rpcs"] for t in ticks),
        "per_tick": ticks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,300", help="trials per polled experiment")
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--launch", type=int, default=1000, help="trials of the launch count")
    parser.add_argument("--max-array", type=int, default=100, help="site.max_array_size")
    parser.add_argument(
        "--run", type=int, default=10, help="trials of an experiment run to its end (0: none)"
    )
    parser.add_argument("--as-user", default=None, help="run Slurm queries as this user")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit('run eval "$(scripts/dev-cluster env)" first')
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=True
    ).stdout
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", config, re.MULTILINE)
    cluster_max = int(m[1]) if m else None
    work = Path(tempfile.mkdtemp(prefix="dlhpc-bench-rpc-"))
    os.chmod(work, 0o755)
    bench = Bench(work, args.as_user)
    submitted: list[str] = []
    summary: dict[str, object] = {
        "max_array_size": cluster_max,
        "as_user": args.as_user,
        "loadavg": os.getloadavg(),
    }
    try:
        polls = []
        for size in [int(s) for s in args.sizes.split(",")]:
            folder = bench.experiment(size, None, sbatch_as_user=False)
            out, types, mine, cmds = bench.measured(folder, "launch", str(folder / "exp.yaml"))
            submitted += _ids(out)
            ticks: list[dict[str, Any]] = []
            for _ in range(args.ticks):
                rep, types, mine, cmds = bench.measured(folder, "tick")
                ticks.append(
                    {
                        "user_rpcs": mine,
                        "rpc_types": dict(types),
                        "commands": dict(cmds),
                        "polled_jobs": rep.get("polled_jobs"),
                    }
                )
            polls.append(
                {
                    "trials": size,
                    "median_user_rpcs_per_tick": statistics.median(t["user_rpcs"] for t in ticks),
                    "max_user_rpcs_per_tick": max(t["user_rpcs"] for t in ticks),
                    "per_tick": ticks,
                }
            )
        summary["polls"] = polls
        if args.run:
            summary["run"] = run_to_end(bench, args.run, submitted)
        launches = []
        for limit in (None, args.max_array):
            folder = bench.experiment(args.launch, limit, sbatch_as_user=True)
            out, types, mine, cmds = bench.measured(folder, "launch", str(folder / "exp.yaml"))
            ids = _ids(out)
            submitted += ids
            chunk = min(x for x in (cluster_max, limit) if x is not None)
            launches.append(
                {
                    "trials": args.launch,
                    "site_max_array_size": limit,
                    "chunk": chunk,
                    "expected_sbatch": math.ceil(args.launch / chunk),
                    "arrays_submitted": len({i.split("_")[0] for i in ids}),
                    "sbatch_processes": cmds.get("sbatch", 0),
                    "REQUEST_SUBMIT_BATCH_JOB": types.get("REQUEST_SUBMIT_BATCH_JOB", 0),
                    "user_rpcs": mine,
                    "rpc_types": dict(types),
                    "commands": dict(cmds),
                }
            )
        summary["launches"] = launches
    finally:
        arrays = sorted({i.split("_")[0] for i in submitted})
        if arrays:
            subprocess.run(["scancel", *arrays], check=False)
        summary["cancelled_arrays"] = len(arrays)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        write_result(args.json, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
