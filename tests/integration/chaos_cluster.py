"""The dev cluster's daemons under chaos: found through their pid files, stopped,
and started again with ``scripts/dev-cluster up``'s command lines (see docs/CHAOS.md)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Collection, Mapping
from pathlib import Path

__all__ = ["cluster_healthy", "kill_node", "kill_slurmd", "restore_cluster", "stop_daemon"]


# -- the dev cluster -------------------------------------------------------------


def _state_dir(env: Mapping[str, str]) -> Path:
    if env.get("SLURM_CONF"):
        return Path(env["SLURM_CONF"]).parent
    return Path(env.get("DLHPC_DEV_CLUSTER_DIR", "/var/tmp/dlhpc-dev-cluster"))


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


def kill_node(env: Mapping[str, str], node: str, raw_job_ids: Collection[str]) -> list[int]:
    """A node lost with its jobs: SIGKILL its ``slurmd``, then every process of the
    jobs (Slurm's raw job ids): their ``slurmstepd`` (``[ID.`` in its command line;
    each dev cluster numbers its jobs from its own first id) and what they started
    (``SLURM_JOB_ID`` and this cluster's ``SLURM_CONF`` in their environment). The
    pids killed, slurmd's first."""
    killed = [kill_slurmd(env, node)]
    steps = [f"[{j}.".encode() for j in raw_job_ids]
    conf = f"SLURM_CONF={env.get('SLURM_CONF', '')}".encode()
    jobs = {f"SLURM_JOB_ID={j}".encode() for j in raw_job_ids}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = set((proc / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue  # gone, or a kernel thread
        stepd = cmdline.startswith(b"slurmstepd") and any(s in cmdline for s in steps)
        if stepd or (conf in environ and jobs & environ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def _daemons(env: Mapping[str, str]) -> list[str]:
    """The pid-file names of the daemons this cluster runs that chaos may stop."""
    run = _state_dir(env) / "run"
    names = ["slurmctld", *sorted(p.stem for p in run.glob("slurmd-*.pid"))]
    if env.get("DLHPC_DEV_PROFILE", "default") != "noacct":
        names.insert(0, "slurmdbd")
    return names


def _running(env: Mapping[str, str], name: str) -> bool:
    try:
        pid = int((_state_dir(env) / "run" / f"{name}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return _pid_alive(pid, name.split("-", 1)[0])


def _answers(env: Mapping[str, str], name: str) -> bool:
    """The daemon answers its clients (slurmd: its node is neither down nor not responding)."""
    argv = {"slurmctld": ["sinfo", "-h"], "slurmdbd": ["sacctmgr", "-n", "list", "cluster"]}.get(
        name, ["sinfo", "-h", "-n", name.split("-", 1)[-1], "-o", "%T"]
    )
    proc = subprocess.run(argv, env=dict(env), capture_output=True, text=True, check=False)
    bad = ("down", "drain", "fail", "not_responding", "unknown", "*")
    return proc.returncode == 0 and not (
        name.startswith("slurmd-") and any(b in proc.stdout.lower() for b in bad)
    )


def cluster_healthy(env: Mapping[str, str]) -> bool:
    """Every daemon of :func:`_daemons` runs and answers; no node is down or drained."""
    return all(_running(env, n) and _answers(env, n) for n in _daemons(env))


def restore_cluster(env: Mapping[str, str], timeout_s: float = 120.0) -> str:
    """Start each daemon chaos stopped (as ``scripts/dev-cluster up`` does, with its
    command line, but from here: in a chroot's world, ``up`` cannot run), resume the
    nodes that are down or drained, and wait until :func:`cluster_healthy`; what it
    did, one line. Raises if the cluster stays broken."""
    did = []
    for name in _daemons(env):
        if _running(env, name):
            continue
        daemon, _, node = name.partition("-")
        argv = [daemon, "-i"] if daemon == "slurmctld" else [daemon]
        argv += ["-N", node] if node else []
        with (_state_dir(env) / "log" / f"{name}.out").open("a") as out:
            subprocess.run(argv, env=dict(env), stdout=out, stderr=out, check=True, timeout=60)
        did.append(" ".join(argv))
    deadline = time.monotonic() + timeout_s
    while not cluster_healthy(env):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster did not recover ({'; '.join(did) or 'nothing'})")
        for name in _daemons(env):
            node = name.partition("-")[2]
            if node and _running(env, name) and not _answers(env, name):
                cmd = ["scontrol", "update", f"NodeName={node}", "State=RESUME"]
                subprocess.run(cmd, env=dict(env), capture_output=True, check=False)
        time.sleep(1)
    return f"started: {'; '.join(did) or 'nothing'}"
