"""The rank environment of a multi-process job, derived from Slurm's variables.

torch.distributed and DeepSpeed read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (env:// rendezvous);
``srun`` sets ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and the node
list instead. :func:`slurm_rank_env` translates one into the other; the worker
(:mod:`dlhpc.harness.worker`) sets the result in the training script's
environment, once per rank.

* ``MASTER_ADDR`` is the first host of the step's (else the job's) node list,
  resolved to an address. Rank 0 runs there under Slurm's default (block) task
  distribution, the only one supported.
* ``MASTER_PORT`` is ``20000 + job_id % 20000`` (:func:`master_port`): array
  tasks, which are separate jobs that may share a node, get different ports; a
  requeued job keeps its id and so its port. ``DLHPC_MASTER_PORT`` overrides it.

Standard library only: imported by the worker before any training code.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping

from dlhpc.errors import DlhpcError

__all__ = [
    "RANK_VARS",
    "expand_hostlist",
    "first_host",
    "local_world_size",
    "master_port",
    "resolve_host",
    "single_process_env",
    "slurm_rank_env",
]

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
PORT_BASE = 20000
PORT_SPAN = 20000  # ports 20000..39999; a port already taken fails loudly at rendezvous
_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top(text: str) -> list[str]:
    """Split ``text`` at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_ranges(body: str, text: str) -> list[str]:
    """``01-03,7`` -> ``["01", "02", "03", "7"]`` (zero padding kept)."""
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE_RE.match(item.strip())
        if m is None:
            raise ValueError(f"bad range {item!r} in host list {text!r}")
        lo, hi = m[1], m[2] if m[2] is not None else m[1]
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in host list {text!r}")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list (``node[01-03,7],gpu[1-2]-ib``) into host names, in order.

    Like ``scontrol show hostnames``: comma-separated entries, each with any
    number of bracketed range groups (a cartesian product, leftmost varying
    slowest). Raises ValueError on a malformed list.
    """
    hosts: list[str] = []
    for entry in _split_top(text.strip()):
        names = [""]
        rest = entry
        while rest:
            open_at = rest.find("[")
            if open_at < 0:
                names = [n + rest for n in names]
                break
            close_at = rest.find("]", open_at)
            prefix, body, rest = rest[:open_at], rest[open_at + 1 : close_at], rest[close_at + 1 :]
            names = [n + prefix + r for n in names for r in _expand_ranges(body, text)]
        hosts.extend(names)
    return hosts


def first_host(text: str) -> str:
    """The first host of a Slurm host list."""
    hosts = expand_hostlist(text)
    if not hosts:
        raise ValueError(f"empty host list {text!r}")
    return hosts[0]


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


def local_world_size(tasks_per_node: str, node_id: int) -> int:
    """Tasks on node ``node_id`` from ``SLURM_TASKS_PER_NODE`` (``2(x3),1``)."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        m = _TASKS_RE.match(item.strip())
        if m is None:
            raise ValueError(f"bad SLURM_TASKS_PER_NODE {tasks_per_node!r}")
        counts.extend([int(m[1])] * int(m[2] or 1))
    if not 0 <= node_id < len(counts):
        raise ValueError(f"node id {node_id} outside SLURM_TASKS_PER_NODE {tasks_per_node!r}")
    return counts[node_id]


def slurm_rank_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The torch.distributed variables of this Slurm task, or ``{}`` outside an srun task.

    Needs ``SLURM_PROCID``; the other values fall back to one process on this
    host (``SLURM_NTASKS`` -> 1, ``SLURM_LOCALID`` -> 0, no node list -> this
    host). Raises DlhpcError when the variables contradict each other.
    """
    if not environ.get("SLURM_PROCID", "").isdigit():
        return {}
    rank = int(environ["SLURM_PROCID"])
    world = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or 1)
    local_rank = int(environ.get("SLURM_LOCALID") or 0)
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    try:
        local_world = (
            local_world_size(per_node, int(environ.get("SLURM_NODEID") or 0)) if per_node else world
        )
        nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
        host = first_host(nodes) if nodes else socket.gethostname()
    except ValueError as err:
        raise DlhpcError(f"cannot derive the rank environment: {err}") from err
    if not (0 <= rank < world and 0 <= local_rank < local_world <= world):
        raise DlhpcError(
            f"inconsistent Slurm task variables: rank {rank}, world size {world}, "
            f"local rank {local_rank}, local world size {local_world}"
        )
    job_id = environ.get("SLURM_JOB_ID") or "0"
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "MASTER_ADDR": resolve_host(host),
        "MASTER_PORT": str(master_port(job_id, environ)),
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
