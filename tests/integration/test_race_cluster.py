"""Two reconcilers started at the same moment on the dev Slurm cluster: one
runs ``sbatch`` once, the other exits quietly (the local-backend version, with more
rounds, is tests/stress/test_stress.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from dlhpc.store import Store, Submission
from tests.stress._race import count, pending_experiment, race

pytestmark = pytest.mark.cluster


def _arrays_named(name: str, env: dict[str, str]) -> set[str]:
    """Array job ids Slurm knows under job name ``name`` (queue or accounting)."""
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        for cmd in (
            ["squeue", "-h", "-r", f"--name={name}", "-o", "%i"],
            ["sacct", "-n", "-X", "-P", f"--name={name}", "--format=JobID"],
        ):
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            seen |= {line.split("_")[0] for line in out.stdout.split()}
        time.sleep(0 if seen else 1)
    return seen


def test_two_reconcilers_on_slurm_submit_one_array(
    slurm_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("SLURM_CONF", "PATH"):
        monkeypatch.setenv(key, slurm_env[key])
    held = 0
    for i in range(2):
        root = tmp_path / f"r{i}"
        home = pending_experiment(root, 2, monkeypatch, site="dev-cluster")
        outputs = race(home, root / "ready", (False, i == 1), site="dev-cluster")
        c = count(home)
        store = Store(home)
        with store.read() as s:
            names = s.scalars(select(Submission.name)).all()
        store.close()
        jobs = {j.split("_")[0] for j in c["job_ids"]}
        try:
            for code, out, err in outputs:
                assert code == 0 and err == "", (out, err)
            assert len(names) == 1 and len(jobs) == 1 and c["attempts_per_trial"] == [1, 1]
            assert _arrays_named(names[0], slurm_env) == jobs  # Slurm got one sbatch
        finally:
            subprocess.run(["scancel", *jobs], env=slurm_env, check=False)
        held += sum("another reconciler holds the lease" in out for _, out, _ in outputs)
    print(f"lease found held in {held} of 2 rounds")
