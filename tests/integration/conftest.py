"""Fixtures for tests on the real dev Slurm cluster (scripts/dev-cluster up)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _slurm_env() -> dict[str, str] | None:
    env = dict(os.environ)
    if not env.get("SLURM_CONF"):
        script = REPO / "scripts" / "dev-cluster"
        out = subprocess.run([str(script), "env"], capture_output=True, text=True, check=False)
        for line in out.stdout.splitlines():
            if line.startswith("export SLURM_CONF="):
                env["SLURM_CONF"] = line.split("=", 1)[1].strip().strip("'\"")
    if not env.get("SLURM_CONF") or shutil.which("sinfo") is None:
        return None
    ok = subprocess.run(["sinfo", "-h"], env=env, capture_output=True, timeout=20, check=False)
    return env if ok.returncode == 0 else None


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    env = _slurm_env()
    if env is None:
        pytest.skip("dev cluster not running (scripts/dev-cluster up)")
    return env


class Cli:
    """Runs the real ``dlhpc`` command as a user would, with a private DLHPC_HOME."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env = {**env, "DLHPC_HOME": str(home), "DLHPC_SITE": "dev-cluster"}
        self.home = home

    def __call__(
        self, *args: str, check: bool = True, **env: str
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "dlhpc", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"dlhpc {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)

    def experiment(self, exp_id: int) -> dict[str, Any]:
        return self.json("status", str(exp_id))["experiments"][0]  # type: ignore[no-any-return]

    def tick_until(
        self, exp_id: int, done: Callable[[dict[str, Any]], bool], timeout: float = 300
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            self("tick", "-q")
            exp = self.experiment(exp_id)
            if done(exp):
                return exp
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; last status: {json.dumps(exp, indent=1)}")
            time.sleep(2)


@pytest.fixture
def cli(slurm_env: dict[str, str], tmp_path: Path) -> Cli:
    return Cli(slurm_env, tmp_path / "home")


def squeue_ids(env: dict[str, str]) -> set[str]:
    out = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i"], env=env, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())
