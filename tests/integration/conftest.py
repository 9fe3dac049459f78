"""Fixtures for tests on the real dev Slurm cluster (scripts/dev-cluster up)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PROFILE_SKIP
from tests.integration._invoke import run_in_process, run_process

REPO = Path(__file__).resolve().parents[2]

SLURM_VERSIONS = ("22.05", "24.11", "26.05")
PROFILES = ("default", "strict", "noacct")
NEEDS = ("accounting", "root", "scrontab")


def let_others_pass(path: Path) -> None:
    """Every folder above ``path`` lets others pass (o+x, never o+r), as ``scripts/dev-cluster``
    does for the strict profile's user: a test's other Unix users must reach the checkout
    and the venv, whichever cluster came up first."""
    for folder in reversed(path.parents):
        mode = folder.stat().st_mode
        if not mode & 0o001:
            os.chmod(folder, mode | 0o001)


@dataclass(frozen=True)
class DevCluster:
    """Which dev cluster the tests run against: ``scripts/dev-cluster env`` exports
    DLHPC_DEV_SLURM and DLHPC_DEV_PROFILE (absent: 22.05 and default, today's cluster)."""

    slurm: str
    profile: str

    @property
    def accounting(self) -> bool:
        """Whether ``sacct`` works (every profile but noacct has slurmdbd)."""
        return self.profile != "noacct"

    def lacks(self, need: str) -> str | None:
        """The skip reason, naming the profile, when ``need`` is not available here."""
        where = f"Slurm {self.slurm}, profile {self.profile} (DLHPC_DEV_PROFILE)"
        if need == "accounting":
            return None if self.accounting else f"needs accounting (sacct); {where} has none"
        if need == "scrontab":  # Debian 12's Slurm 22.05 ships no scrontab command
            has = shutil.which("scrontab") is not None
            return None if has else f"needs scrontab; {where} has no scrontab command"
        if need == "root":
            uid = os.geteuid()
            return None if uid == 0 else f"needs root; {where} runs the tests as uid {uid}"
        raise pytest.UsageError(f"unknown needs({need!r}); known: {', '.join(NEEDS)}")


def current_cluster() -> DevCluster:
    """The DevCluster named by the environment; a value outside the matrix is an error."""
    slurm = os.environ.get("DLHPC_DEV_SLURM") or SLURM_VERSIONS[0]
    profile = os.environ.get("DLHPC_DEV_PROFILE") or PROFILES[0]
    if slurm not in SLURM_VERSIONS:
        raise pytest.UsageError(f"DLHPC_DEV_SLURM={slurm!r}: one of {', '.join(SLURM_VERSIONS)}")
    if profile not in PROFILES:
        raise pytest.UsageError(f"DLHPC_DEV_PROFILE={profile!r}: one of {', '.join(PROFILES)}")
    return DevCluster(slurm, profile)


def not_applicable(item: pytest.Item, where: DevCluster) -> str | None:
    """Why ``item`` cannot apply on ``where``: a ``needs(...)`` the profile lacks, or a
    ``profile(...)`` marker that does not name this profile. None when it applies."""
    for mark in item.iter_markers("profile"):
        unknown = set(mark.args) - set(PROFILES)
        if unknown or not mark.args:
            raise pytest.UsageError(f"{item.nodeid}: profile{mark.args}: one of {PROFILES}")
        if where.profile not in mark.args:
            only = ", ".join(mark.args)
            return f"only in the {only} profile; this run is profile {where.profile}"
    for mark in item.iter_markers("needs"):
        for need in mark.args:
            why = where.lacks(need)
            if why is not None:
                return why
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip, with the profile in the reason, a test that cannot apply on this cluster
    (tests/conftest.py lets such skips pass under DLHPC_REQUIRE_CLUSTER, except smoke)."""
    why = not_applicable(item, current_cluster())
    if why is not None:
        item.stash[PROFILE_SKIP] = why
        pytest.skip(why)


@pytest.fixture(scope="session")
def dev_cluster() -> DevCluster:
    return current_cluster()


@pytest.fixture(scope="session")
def dev_slurm(dev_cluster: DevCluster) -> str:
    """The dev cluster's Slurm version (DLHPC_DEV_SLURM, default 22.05)."""
    return dev_cluster.slurm


@pytest.fixture(scope="session")
def dev_profile(dev_cluster: DevCluster) -> str:
    """The dev cluster's profile (DLHPC_DEV_PROFILE: default, strict or noacct)."""
    return dev_cluster.profile


def _env_argv() -> list[str]:
    """``scripts/dev-cluster env`` for the cluster the environment names; the flags only
    when it names one other than today's (so the command also works on older scripts)."""
    where = current_cluster()
    argv = [str(REPO / "scripts" / "dev-cluster"), "env"]
    if where != DevCluster(SLURM_VERSIONS[0], PROFILES[0]):
        argv += ["--slurm", where.slurm, "--profile", where.profile]
    return argv


def _slurm_env() -> dict[str, str] | None:
    env = dict(os.environ)
    if not env.get("SLURM_CONF"):
        out = subprocess.run(_env_argv(), capture_output=True, text=True, check=False)
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
        flags = " ".join(_env_argv()[2:])
        pytest.skip(f"dev cluster not running (scripts/dev-cluster up {flags})".replace(" )", ")"))
    return env


#: Seconds between a cluster test's ticks. A pass and its status read cost the test's
#: process a fraction of a CPU-second, which several cluster parts side by side on a 2-core
#: machine feel: a test polls faster only where it must catch a short-lived state.
POLL_S = 4.0


class Cli:
    """Runs the real ``dlhpc`` command as a user would, with a private DLHPC_HOME:
    in the test's process (``tests/integration/_invoke.py``: the same environment,
    output and exit code as a subprocess), or with :meth:`run_process` as a separate
    process, for a test that needs one (a failpoint SIGKILLs the process it stops)."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env = {**env, "DLHPC_HOME": str(home), "DLHPC_SITE": "dev-cluster"}
        self.home = home

    def __call__(
        self, *args: str, check: bool = True, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """``dlhpc ARGS`` in this process, with ``env`` added to :attr:`env`; with
        ``check``, a non-zero exit is an AssertionError."""
        return self._checked(args, check, run_in_process(args, {**self.env, **env}))

    def run_process(
        self, *args: str, check: bool = True, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """As a call, but as a separate ``python -m dlhpc`` process."""
        return self._checked(args, check, run_process(args, {**self.env, **env}))

    @staticmethod
    def _checked(
        args: tuple[str, ...], check: bool, proc: subprocess.CompletedProcess[str]
    ) -> subprocess.CompletedProcess[str]:
        if check and proc.returncode != 0:
            raise AssertionError(
                f"dlhpc {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "--json").stdout)

    def events(self, kind: str) -> list[str]:
        """The messages of this home's events of ``kind``, read from its database."""
        con = sqlite3.connect(self.home / "dlhpc.db")
        try:
            return [r[0] for r in con.execute("SELECT message FROM events WHERE kind = ?", (kind,))]
        finally:
            con.close()

    def experiment(self, exp_id: int) -> dict[str, Any]:
        return self.json("status", str(exp_id))["experiments"][0]  # type: ignore[no-any-return]

    def tick_until(
        self,
        exp_id: int,
        done: Callable[[dict[str, Any]], bool],
        timeout: float = 300,
        poll_s: float = POLL_S,
    ) -> dict[str, Any]:
        """Tick every ``poll_s`` until ``done(experiment)``; the experiment."""
        deadline = time.monotonic() + timeout
        while True:
            self("tick", "-q")
            exp = self.experiment(exp_id)
            if done(exp):
                return exp
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; last status: {json.dumps(exp, indent=1)}")
            time.sleep(poll_s)


def launch_script_until(
    cli: Cli, folder: Path, name: str, script: str, marker: Path, timeout: float
) -> int:
    """Launch ``script`` as one trial (no restarts) of experiment ``name`` from
    ``folder/code``, and wait until it has written ``marker``; the experiment's id."""
    code = folder / "code"
    code.mkdir()
    (code / "train.py").write_text(script)
    exp = folder / f"{name}.yaml"
    exp.write_text(
        f"name: {name}\nentrypoint: python train.py\nworkdir: {code}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        "hyperparameters:\n  x: 1\n"
        "searcher: {name: grid, metric: loss, smaller_is_better: true, max_length: 1}\n"
        "max_restarts: 0\n"
    )
    exp_id = int(cli.json("launch", str(exp))["experiment_id"])
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert time.monotonic() < deadline, json.dumps(cli.experiment(exp_id), indent=1)
        time.sleep(0.5)
    return exp_id


@pytest.fixture
def cli(slurm_env: dict[str, str], tmp_path: Path) -> Cli:
    return Cli(slurm_env, tmp_path / "home")


def squeue_ids(env: dict[str, str]) -> set[str]:
    out = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i"], env=env, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


@pytest.fixture(scope="session")
def finished_lab(slurm_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two finished digits experiments (grid and random) in one DLHPC_HOME, made once
    per session for the lab tests: ``tests/integration/_lab.py`` says what a test may
    do with them."""
    from tests.integration._lab import finish_two_experiments

    cli = Cli(slurm_env, tmp_path_factory.mktemp("lab") / "home")
    digits = REPO / "templates" / "examples" / "digits"
    return finish_two_experiments(cli, str(digits / "grid.yaml"), str(digits / "random.yaml"))
