"""``det.get_cluster_info()`` of the stand-in: the trial's facts and Determined's
container layout, read from the trial's ``trial.json`` and the job's rank environment.

Determined runs the entrypoint once per *container* (a node's share of the trial) and
tells it its slots (``slot_ids``), every container's address (``container_addrs``) and
its own index (``container_rank``); a launch layer starts one worker per slot from that.
Here a container is a dlhpc task (one per node: ``dlhpc convert determined`` writes
``resources.tasks_per_node: 1``):

* ``container_rank``, ``container_addrs``: the task's ``RANK`` among ``WORLD_SIZE``, and
  the address of each task's node (``LOCAL_WORLD_SIZE`` tasks per node, in the order of
  the job's node list; one node: ``MASTER_ADDR``). A launch layer that rewrites ``RANK``
  for its workers passes the container's values on in
  :data:`ENV_CONTAINER_RANK` / :data:`ENV_CONTAINER_ADDRS`, which win.
* ``slot_ids``: ``0 .. N-1``, N from :data:`~dlhpc.integrations.determined.ENV_SLOTS`
  (the converted ``slots_per_trial`` per node), 1 when unset (Determined's default).
* ``gpu_uuids``: the UUIDs of the GPUs the task may use (:func:`gpu_uuids`); empty on
  a CPU node, as in Determined.

Reading the info starts no trial context (``core.init()`` does that), so a launcher
process that only reads it publishes nothing. It makes the process a launcher can be
(:func:`get_cluster_info`): one that started child processes lives on at a stop signal.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from dlhpc.errors import DlhpcError
from dlhpc.harness.distributed import resolve_host
from dlhpc.integrations.determined import ENV_NESTED, ENV_SLOTS, ENV_USER_DATA
from dlhpc.integrations.determined.checkpoints import latest_storage_id
from dlhpc.protocol import ATTEMPT_DIR_VAR, TRIAL_DIR_VAR, TrialSpec, trial_file
from dlhpc.protocol.gpu import load_nvml
from dlhpc.scheduler.plugins import BackendTable
from dlhpc.scheduler.slurm.hostlist import expand_hostlist

__all__ = [
    "ENV_CONTAINER_ADDRS",
    "ENV_CONTAINER_RANK",
    "ClusterInfo",
    "TrialInfo",
    "container_layout",
    "get_cluster_info",
    "gpu_uuids",
    "nest",
    "slots_per_container",
]

# set by the stand-in's launch layers for their workers (whose RANK is the worker's)
ENV_CONTAINER_RANK = "DLHPC_DETERMINED_CONTAINER_RANK"
ENV_CONTAINER_ADDRS = "DLHPC_DETERMINED_CONTAINER_ADDRS"
# the signals dlhpc.init() turns into a stop request: preemption, the time limit
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


def nest(hparams: dict[str, Any], roots_json: str) -> dict[str, Any]:
    """``hparams`` with the ``outer.inner`` names of the nested roots (a JSON list, as
    ``dlhpc convert`` writes it) turned back into Determined's nested mappings."""
    roots = set(json.loads(roots_json)) if roots_json else set()
    out: dict[str, Any] = {}
    for name, value in hparams.items():
        parts = name.split(".")
        if len(parts) == 1 or parts[0] not in roots:
            out[name] = value
            continue
        here = out
        for part in parts[:-1]:
            here = here.setdefault(part, {})
        here[parts[-1]] = value
    return out


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "")
    if not value:
        return default
    if not value.isdigit():
        raise DlhpcError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def slots_per_container(environ: Mapping[str, str]) -> int:
    """The slots of each container (:data:`ENV_SLOTS`; 1 when unset)."""
    return _int(environ, ENV_SLOTS, 1)


def _node_hosts(environ: Mapping[str, str]) -> list[str]:
    """The job's nodes, in order, from its backend (Slurm's node list)."""
    try:
        job = BackendTable().job_environment(environ)
    except DlhpcError:
        return []
    if job.name == "slurm" and job.node_list:
        return expand_hostlist(job.node_list)
    return []


def container_layout(environ: Mapping[str, str]) -> tuple[int, list[str]]:
    """``(container_rank, container_addrs)`` of this process (see the module's doc).
    Raises DlhpcError when the tasks span several nodes whose names the backend does
    not give, or do not fill them evenly."""
    if environ.get(ENV_CONTAINER_RANK):
        addrs = json.loads(environ.get(ENV_CONTAINER_ADDRS) or "[]")
        return _int(environ, ENV_CONTAINER_RANK, 0), [str(a) for a in addrs]
    rank = _int(environ, "RANK", 0)
    world = max(1, _int(environ, "WORLD_SIZE", 1))
    per_node = max(1, _int(environ, "LOCAL_WORLD_SIZE", 1))
    master = environ.get("MASTER_ADDR") or resolve_host(socket.gethostname())
    if world == per_node:  # one node
        return rank, [master] * world
    hosts = _node_hosts(environ)
    if len(hosts) * per_node != world:
        raise DlhpcError(
            f"cannot place {world} tasks, {per_node} per node, on the job's nodes"
            f" {hosts or '(not given by the scheduler)'}"
        )
    return rank, [resolve_host(h) for h in hosts for _ in range(per_node)]


def gpu_uuids(environ: Mapping[str, str]) -> list[str]:
    """The UUIDs of the GPUs ``environ``'s process may use, in CUDA's order: the entries
    of ``CUDA_VISIBLE_DEVICES`` (a UUID as given, an index through NVML), or every GPU
    NVML shows when it is unset; [] when it is set empty, or unset where NVML cannot
    load (a CPU node). Raises DlhpcError for indices that NVML cannot resolve."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    items = [x.strip() for x in (visible or "").split(",") if x.strip()]
    if visible is not None and all(not x.isdigit() for x in items):  # GPU-/MIG- UUIDs
        return items
    nvml, why = load_nvml()
    if nvml is None:
        if visible is None:
            return []
        raise DlhpcError(f"gpu_uuids: CUDA_VISIBLE_DEVICES={visible!r} needs NVML ({why})")
    try:
        if visible is None:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        else:
            handles = [
                nvml.nvmlDeviceGetHandleByIndex(int(x))
                if x.isdigit()
                else nvml.nvmlDeviceGetHandleByUUID(x)
                for x in items
            ]
        uuids = [nvml.nvmlDeviceGetUUID(h) for h in handles]
    except nvml.NVMLError as err:
        raise DlhpcError(f"gpu_uuids: NVML: {err}") from None
    return [u.decode() if isinstance(u, bytes) else str(u) for u in uuids]


class TrialInfo:
    """``info.trial``: this trial's facts."""

    def __init__(self, spec: TrialSpec, user_data: dict[str, Any]) -> None:
        self.trial_id = spec.trial_id
        self.experiment_id = spec.experiment_id
        self.trial_seed = spec.seed
        self.hparams: dict[str, Any] = nest(spec.hparams, os.environ.get(ENV_NESTED, ""))
        self.user_data = user_data


class ClusterInfo:
    """``det.get_cluster_info()`` inside a dlhpc job: the fields Determined's Core API
    scripts and launch layers read."""

    def __init__(self, spec: TrialSpec, environ: Mapping[str, str]) -> None:
        raw = environ.get(ENV_USER_DATA, "")
        self.user_data: dict[str, Any] = json.loads(raw) if raw else {}
        self.task_type = "TRIAL"
        self.task_id = f"{spec.experiment_id}.{spec.trial_id}"
        self.allocation_id = environ.get(ATTEMPT_DIR_VAR, "")
        self.master_url = ""
        self.cluster_id = "dlhpc"
        self.agent_id = socket.gethostname()
        self.session_token = ""
        self.master_cert_name: str | None = None
        self.master_cert_file: str | None = None
        #: this container's slots (``0 .. N-1``)
        self.slot_ids: list[int] = list(range(slots_per_container(environ)))
        self._rank, self._addrs = container_layout(environ)
        self._environ = dict(environ)
        self._trial = TrialInfo(spec, self.user_data)
        self._latest_checkpoint = latest_storage_id(Path(spec.checkpoint_dir))

    @property
    def trial(self) -> TrialInfo:
        return self._trial

    @property
    def latest_checkpoint(self) -> str | None:
        """The storage id of the trial's newest verified checkpoint (None on a first run)."""
        return self._latest_checkpoint

    @property
    def container_addrs(self) -> list[str]:
        """The address of every container of the trial; the chief's first."""
        return list(self._addrs)

    @property
    def container_rank(self) -> int:
        """This container's index in :attr:`container_addrs`."""
        return self._rank

    @functools.cached_property
    def gpu_uuids(self) -> list[str]:
        """The UUIDs of this container's GPUs ([] on a CPU node; see :func:`gpu_uuids`)."""
        return gpu_uuids(self._environ)

    @property
    def container_slot_counts(self) -> list[int]:
        """The slots of each container (all the same here)."""
        return [len(self.slot_ids)] * len(self._addrs)


def _has_children() -> bool:
    """Whether this process has child processes (none is reaped: WNOWAIT)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _stop_signal(signum: int, _frame: FrameType | None) -> None:
    """A stop signal in a process that has not entered ``core.init()``: a launcher (it
    has children) lives on, its workers (in its process group, or signalled by the
    scheduler one by one) got the signal too, checkpoint and exit, and it exits with
    their codes; any other process ends of the signal, as it would have without this."""
    if _has_children():
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _launcher_handlers() -> None:
    """Install :func:`_stop_signal` for the stop signals still at their default action
    (main thread only). A caught signal is reset to its default in the processes this
    one starts, and ``core.init()`` installs its own handlers over it."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _stop_signal)


def get_cluster_info() -> ClusterInfo | None:
    """This trial's :class:`ClusterInfo`; None outside a dlhpc job (as Determined
    off-cluster). In a job, a launcher that reads it survives the stop signals that
    reach its workers (see :func:`_stop_signal`): Determined stops workers through its
    API, so its launchers, such as its tutorial's, let a TERM end them."""
    trial_dir = os.environ.get(TRIAL_DIR_VAR)
    if not trial_dir:
        return None
    info = ClusterInfo(TrialSpec.read(trial_file(Path(trial_dir))), os.environ)
    _launcher_handlers()
    return info
