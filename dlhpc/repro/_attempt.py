"""The per-attempt record, built inside the job by the worker (local rank 0 of each node).

Contract of :func:`attempt_record`: standard library only (NVML through
``pynvml`` when it is installed; torch is never imported), never raises (a part
that fails says why under ``error``), returns a JSON-able dict::

    {"version": 1, "host", "rank", "nodes",            # the job's node list, else the host
     "cpu": {"model", "logical_cpus", "allowed_cpus"},
     "gpu": {"driver", "cuda_driver", "nvml", "devices": [{"index", "name", "uuid",
             "memory_total"}]} | {"devices": [], "unavailable": "why"},
     "python": {"version", "executable"},
     "modules": {"loaded": [...], "files": [...]},   # in effect in the job (after the setup)
     "env": {NAME: value | "<redacted>"},              # allowlist, secrets redacted
     "data": [fingerprint, ...]}                       # rank 0 only (see _files)

:func:`merge_env_record` folds the records of several nodes into one
``attempts.env_json`` (rank 0's facts at the top, every node under ``hosts``).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import socket
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dlhpc.repro._files import fingerprint_data

__all__ = [
    "ENV_ALLOWED",
    "ENV_PREFIXES",
    "REDACTED",
    "attempt_record",
    "deterministic_env",
    "is_secret_name",
    "merge_env_record",
    "redacted_env",
]

REDACTED = "<redacted>"
_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH", re.IGNORECASE)
# Plus the scheduler's own: its job environment's record_vars, which the caller passes.
ENV_ALLOWED = frozenset(
    {
        "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
        "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "PYTHONPATH", "VIRTUAL_ENV",
        "CONDA_PREFIX", "LD_LIBRARY_PATH", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
        "RANK", "LOCAL_RANK", "DLHPC_EXPERIMENT_ID", "DLHPC_TRIAL_ID",
    }
)  # fmt: skip
ENV_PREFIXES = ("NCCL_", "CUDA_", "CUDNN_", "TORCH_", "PYTORCH_", "HF_", "TRANSFORMERS_", "XLA_")
# Differ between any two attempts by construction; kept in the record, not compared
# (with the schedulers' own, which diff_records' caller passes).
VOLATILE_ENV = frozenset(
    {
        "MASTER_ADDR", "MASTER_PORT", "DLHPC_EXPERIMENT_ID", "DLHPC_TRIAL_ID", "PYTHONHASHSEED",
    }
)  # fmt: skip


def deterministic_env(seed: int) -> dict[str, str]:
    """Variables a deterministic trial needs before its interpreter starts."""
    return {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": str(seed % 2**32)}


def is_secret_name(name: str) -> bool:
    """Whether a variable or key name looks like it holds a secret (TOKEN, KEY, ...)."""
    return _SECRET.search(name) is not None


def redacted_env(
    environ: Mapping[str, str],
    declared: Sequence[str] = (),
    scheduler_vars: Collection[str] = (),
) -> dict[str, str]:
    """The variables that matter (the allowlist, the prefixes, ``declared``: the
    experiment's and site's own, and ``scheduler_vars``: the backend's, from its job
    environment), with any whose name looks secret redacted."""
    out = {}
    for name in sorted(environ):
        if (
            name in ENV_ALLOWED
            or name.startswith(ENV_PREFIXES)
            or name in declared
            or name in scheduler_vars
        ):
            out[name] = REDACTED if _SECRET.search(name) else environ[name]
    return out


def _cpu() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "Model", "cpu model")):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        allowed: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = None
    return {"model": model, "logical_cpus": os.cpu_count(), "allowed_cpus": allowed}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _gpu(
    environ: Mapping[str, str], loader: Callable[[], tuple[Any, str]] | None
) -> dict[str, Any]:
    if loader is None:
        from dlhpc.protocol.gpu import load_nvml

        loader = load_nvml
    nvml, why = loader()
    if nvml is None:
        return {"devices": [], "unavailable": why}
    out: dict[str, Any] = {"devices": []}
    try:
        out["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        out["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        try:
            out["nvml"] = _text(nvml.nvmlSystemGetNVMLVersion())
        except Exception:
            out["nvml"] = None
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            items = [str(i) for i in range(nvml.nvmlDeviceGetCount())]
        else:
            items = [x.strip() for x in visible.split(",") if x.strip()]
        for index, item in enumerate(items):
            if item.isdigit():
                handle = nvml.nvmlDeviceGetHandleByIndex(int(item))
            else:
                handle = nvml.nvmlDeviceGetHandleByUUID(item)
            out["devices"].append(
                {
                    "index": index,
                    "name": _text(nvml.nvmlDeviceGetName(handle)),
                    "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                    "memory_total": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                }
            )
    except Exception as err:  # NVMLError and friends: keep what was read
        out["error"] = f"{type(err).__name__}: {err}"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return out


def _modules(environ: Mapping[str, str]) -> dict[str, list[str]]:
    """The environment modules in effect (Lmod and Tcl modules both keep
    ``LOADEDMODULES`` and ``_LMFILES_``): in a job, what the site's ``module load``
    lines and the setup really loaded, not what the site file asked for."""
    return {
        "loaded": [m for m in environ.get("LOADEDMODULES", "").split(":") if m],
        "files": [f for f in environ.get("_LMFILES_", "").split(":") if f],
    }


def attempt_record(
    environ: Mapping[str, str],
    *,
    rank: int = 0,
    data: Sequence[Mapping[str, Any]] = (),
    declared: Sequence[str] = (),
    nodes: str | None = None,
    scheduler_vars: Collection[str] = (),
    nvml_loader: Callable[[], tuple[Any, str]] | None = None,
) -> dict[str, Any]:
    """This node's record for the attempt (see the module docstring). ``environ`` is
    the environment the training process gets; ``data`` is fingerprinted only when
    given (the worker passes it on rank 0). ``nodes`` (the job's node list) and
    ``scheduler_vars`` (the variables of its backend worth keeping) come from the
    backend's job environment; this module knows no scheduler."""
    host = socket.gethostname()
    record: dict[str, Any] = {"version": 1, "host": host, "rank": rank}
    parts: dict[str, Callable[[], Any]] = {
        "nodes": lambda: nodes or host,
        "cpu": _cpu,
        "gpu": lambda: _gpu(environ, nvml_loader),
        "python": lambda: {"version": platform.python_version(), "executable": sys.executable},
        "modules": lambda: _modules(environ),
        "env": lambda: redacted_env(environ, declared, scheduler_vars),
        "data": lambda: fingerprint_data(data),
    }
    for name, part in parts.items():
        try:
            record[name] = part()
        except Exception as err:  # the record must never stop the training
            record[name] = {"error": f"{type(err).__name__}: {err}"}
    return record


def merge_env_record(existing_json: str, rec: Mapping[str, Any]) -> str:
    """``attempts.env_json`` after one ``env`` event record ``rec``."""
    try:
        current = json.loads(existing_json or "{}")
    except ValueError:
        current = {}
    if not isinstance(current, dict):
        current = {}
    record = rec.get("record")
    if not isinstance(record, dict):
        return json.dumps(current, sort_keys=True)
    hosts = current.pop("hosts", {})
    hosts[str(record.get("host", ""))] = {k: record.get(k) for k in ("rank", "cpu", "gpu")}
    merged = dict(record) if rec.get("rank", record.get("rank")) == 0 or not current else current
    merged["hosts"] = hosts
    return json.dumps(merged, sort_keys=True)
