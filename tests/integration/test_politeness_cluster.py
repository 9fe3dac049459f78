"""Kindness to slurmctld on the real dev cluster: Slurm commands per tick do not grow
with the number of trials, and a launch uses ceil(N / chunk) sbatch calls.

Counted at the process boundary: shims first on ``PATH`` log every Slurm command
dlhpc starts, then run the real one. (sdiag's counters are per user and cluster-wide;
other tests running as the same user at the same time would make them flaky here.
``scripts/bench/slurm_rpc/bench_slurm_rpc.py`` measures the RPCs themselves with sdiag.)
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, Cli

pytestmark = pytest.mark.cluster

_COMMANDS = ("squeue", "sacct", "sbatch", "scontrol", "scancel", "sinfo")
_SITE_MAX_ARRAY = 25
_EXPERIMENT = """\
name: polite-{trials}
site: site.yaml
entrypoint: sleep 1
resources: {{cpus_per_task: 1, mem: 100M, time: "00:05:00", sbatch_args: ["--hold"]}}
hyperparameters:
  x: {{type: double, minval: 0.0, maxval: 1.0}}
searcher: {{name: random, metric: loss, max_trials: {trials}, max_length: 1, seed: 1}}
"""


class Shims:
    """A folder of logging wrappers around the real Slurm commands."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.log = folder / "calls.log"
        folder.mkdir(parents=True)
        for name in _COMMANDS:
            real = shutil.which(name)
            assert real is not None, f"{name} is not on PATH"
            shim = folder / name
            shim.write_text(f'#!/bin/sh\necho {name} >> "{self.log}"\nexec {real} "$@"\n')
            shim.chmod(0o755)

    def calls(self) -> Counter[str]:
        return Counter(self.log.read_text().split()) if self.log.exists() else Counter()


@pytest.fixture
def polite(cli: Cli, tmp_path: Path) -> Iterator[tuple[Cli, Shims, list[str]]]:
    shims = Shims(tmp_path / "shims")
    cli.env["PATH"] = f"{shims.folder}:{cli.env['PATH']}"
    submitted: list[str] = []
    yield cli, shims, submitted
    arrays = sorted({j.split("_")[0] for j in submitted})
    if arrays:
        subprocess.run(["scancel", *arrays], env=cli.env, capture_output=True, check=False)


def _cluster_max_array(env: dict[str, str]) -> int:
    out = subprocess.run(
        ["scontrol", "show", "config"], env=env, capture_output=True, text=True, check=True
    ).stdout
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
    return int(m[1]) if m else 1001


def _experiment(folder: Path, trials: int) -> Path:
    folder.mkdir()
    site = (REPO / "site-configs" / "dev-cluster.yaml").read_text()
    (folder / "site.yaml").write_text(f"{site}\nmax_array_size: {_SITE_MAX_ARRAY}\n")
    path = folder / "exp.yaml"
    path.write_text(_EXPERIMENT.format(trials=trials))
    return path


def _ticks(cli: Cli, shims: Shims, n: int) -> list[Counter[str]]:
    out = []
    for _ in range(n):
        before = shims.calls()
        report = cli.json("tick")
        assert not report["errors"], report["errors"]
        out.append(shims.calls() - before)
    return out


def test_commands_per_tick_constant_and_sbatch_per_chunk(
    polite: tuple[Cli, Shims, list[str]], tmp_path: Path
) -> None:
    cli, shims, submitted = polite
    chunk = min(_cluster_max_array(cli.env), _SITE_MAX_ARRAY)

    sizes = (5, 60)
    per_tick: dict[int, list[Counter[str]]] = {}
    for trials in sizes:
        before = shims.calls()
        launched = cli.json("launch", str(_experiment(tmp_path / f"e{trials}", trials)))
        launch_calls = shims.calls() - before
        ids = launched["slurm_job_ids"]
        submitted.extend(ids)
        arrays = {j.split("_")[0] for j in ids}
        assert len(ids) == trials
        assert launch_calls["sbatch"] == math.ceil(trials / chunk) == len(arrays)
        assert launch_calls["squeue"] == 0 and launch_calls["sacct"] == 0
        # Every experiment launched so far is polled: 5 jobs, then 65.
        per_tick[trials] = _ticks(cli, shims, 2)

    small, large = per_tick[sizes[0]], per_tick[sizes[1]]
    for calls in small + large:
        # Held tasks stay PENDING: squeue alone answers, nothing is (re)submitted.
        assert calls == Counter({"squeue": 1}), calls
    assert max(sum(c.values()) for c in large) <= max(sum(c.values()) for c in small)
