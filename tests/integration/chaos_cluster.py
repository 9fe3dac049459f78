"""The dev cluster's daemons under chaos: found through their pid files, killed,
and brought back by ``scripts/dev-cluster up`` (see docs/CHAOS.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from tests.integration.conftest import REPO

__all__ = ["DEV_CLUSTER", "cluster_healthy", "kill_slurmd", "restore_cluster", "stop_daemon"]

DEV_CLUSTER = REPO / "scripts" / "dev-cluster"

# -- the dev cluster -------------------------------------------------------------


def _state_dir(env: Mapping[str, str]) -> Path:
    if env.get("SLURM_CONF"):
        return Path(env["SLURM_CONF"]).parent
    return Path(env.get("DLHPC_DEV_CLUSTER_DIR", "/var/tmp/dlhpc-dev-cluster"))


def _dev_cluster(command: str, env: Mapping[str, str]) -> list[str]:
    """``scripts/dev-cluster COMMAND`` for the cluster ``env`` names (``dev-cluster env``
    exports its version and profile): without them ``up`` would start another cluster."""
    argv = [str(DEV_CLUSTER), command]
    for flag, var in (("--slurm", "DLHPC_DEV_SLURM"), ("--profile", "DLHPC_DEV_PROFILE")):
        if env.get(var):
            argv += [flag, env[var]]
    return argv


def _pid_alive(pid: int, comm: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == comm and not Path(
            f"/proc/{pid}/stat"
        ).read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def stop_daemon(env: Mapping[str, str], pidfile_name: str, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to the daemon of ``run/<pidfile_name>.pid`` (``slurmctld``,
    ``slurmdbd``, ``slurmd-node1``) and wait until it is gone; its pid.

    Refuses a pid that is not a live process of that daemon (a stale pid file, a
    recycled pid)."""
    comm = pidfile_name.split("-", 1)[0]
    pidfile = _state_dir(env) / "run" / f"{pidfile_name}.pid"
    pid = int(pidfile.read_text().split()[0])
    if not _pid_alive(pid, comm):
        raise RuntimeError(f"{pidfile} names pid {pid}, which is not a live {comm}")
    os.kill(pid, sig)
    deadline = time.monotonic() + 30
    while _pid_alive(pid, comm):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{pidfile_name} (pid {pid}) survived signal {sig}")
        time.sleep(0.1)
    return pid


def kill_slurmd(env: Mapping[str, str], node: str) -> int:
    """SIGKILL the ``slurmd`` of ``node`` (found through its pid file); its pid."""
    return stop_daemon(env, f"slurmd-{node}")


def cluster_healthy(env: Mapping[str, str]) -> bool:
    """All daemons run and no node is down or drained (``scripts/dev-cluster status``)."""
    status = subprocess.run(
        _dev_cluster("status", env), env=dict(env), capture_output=True, text=True, check=False
    )
    if status.returncode != 0:
        return False
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%T"], env=dict(env), capture_output=True, text=True
    )
    bad = ("down", "drain", "fail", "not_responding", "unknown")
    return nodes.returncode == 0 and not any(
        any(b in s for b in bad) for s in nodes.stdout.lower().split()
    )


def restore_cluster(env: Mapping[str, str], attempts: int = 3) -> str:
    """``scripts/dev-cluster up`` (idempotent: restarts dead daemons, resumes down
    nodes) until the cluster is healthy; returns its stderr tail. Raises if it
    stays broken."""
    tail = ""
    for _ in range(attempts):
        proc = subprocess.run(
            _dev_cluster("up", env),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        tail = "\n".join(proc.stderr.strip().splitlines()[-3:])
        if proc.returncode == 0 and cluster_healthy(env):
            return tail
        time.sleep(2)
    raise RuntimeError(f"scripts/dev-cluster up did not restore the cluster:\n{tail}")
