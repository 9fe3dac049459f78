"""The rank environment of a multi-process job, derived from its backend's variables.

torch.distributed and DeepSpeed read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (env:// rendezvous);
a scheduler sets its own instead (``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``,
``SLURM_LOCALID`` and the node list), which the backend's job environment
(:class:`~dlhpc.scheduler.environment.JobEnvironment`) reads as a
:class:`~dlhpc.scheduler.environment.TaskLayout`. :func:`rank_env` translates
that into torch's variables; the worker
(:mod:`dlhpc.harness.worker`) sets the result in the training script's
environment, once per rank.

* ``MASTER_ADDR`` is the layout's rank-0 host (Slurm: the first host of the
  step's, else the job's, node list), resolved to an address. Under Slurm rank 0
  runs there with the default (block) task distribution, the only one supported.
* ``MASTER_PORT`` is ``20000 + job_id % 20000`` (:func:`master_port`): array
  tasks, which are separate jobs that may share a node, get different ports; a
  requeued job keeps its id and so its port. ``DLHPC_MASTER_PORT`` overrides it.

Standard library and the light scheduler registry only: imported by the worker
before any training code.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping

from dlhpc.errors import DlhpcError
from dlhpc.scheduler.plugins import BackendTable

__all__ = [
    "RANK_VARS",
    "master_port",
    "resolve_host",
    "rank_env",
    "single_process_env",
]

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
PORT_BASE = 20000
PORT_SPAN = 20000  # ports 20000..39999; a port already taken fails loudly at rendezvous


def resolve_host(host: str) -> str:
    """The IPv4 address of ``host``, or ``host`` itself if it does not resolve here
    (torch then tries, and fails at rendezvous with the name in its message)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def master_port(job_id: str, environ: Mapping[str, str] | None = None) -> int:
    """The rendezvous port of job ``job_id`` (``DLHPC_MASTER_PORT`` wins)."""
    env = os.environ if environ is None else environ
    override = env.get("DLHPC_MASTER_PORT", "")
    if override:
        if not override.isdigit() or not 0 < int(override) < 65536:
            raise DlhpcError(f"DLHPC_MASTER_PORT must be a port number, got {override!r}")
        return int(override)
    digits = re.sub(r"\D", "", job_id.split("_")[0]) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


def rank_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables of this task, or ``{}`` outside a launched task
    (no backend's job, or its :meth:`~dlhpc.scheduler.environment.JobEnvironment.task_layout`
    is None). Raises DlhpcError when the variables are malformed or contradict each other.
    """
    try:
        job = BackendTable().job_environment(environ)
    except DlhpcError:
        return {}  # not a job of any backend: nothing to derive
    try:
        task = job.task_layout()
    except ValueError as err:
        raise DlhpcError(f"cannot derive the rank environment: {err}") from err
    if task is None:
        return {}
    rank, world, local_rank, local_world = task.rank, task.world, task.local_rank, task.local_world
    if not (0 <= rank < world and 0 <= local_rank < local_world <= world):
        raise DlhpcError(
            f"inconsistent {job.name} task variables: rank {rank}, world size {world}, "
            f"local rank {local_rank}, local world size {local_world}"
        )
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": resolve_host(task.master_host or socket.gethostname()),
        "MASTER_PORT": str(master_port(task.job, environ)),
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def single_process_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Rank variables for a lone process outside Slurm: rank 0 of 1 on this host, on
    ``DLHPC_MASTER_PORT`` or a port free right now (concurrent local trials differ)."""
    port = master_port("0", environ) if environ.get("DLHPC_MASTER_PORT") else _free_port()
    return {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
