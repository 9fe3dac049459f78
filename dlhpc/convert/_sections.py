"""Determined's non-search sections: entrypoint, resources, checkpoint storage,
environment, reproducibility, and the fields dlhpc has no equivalent for."""

from __future__ import annotations

import json
import shlex
from typing import Any

from dlhpc.convert._source import Source

__all__ = [
    "LAUNCHER",
    "UNTRANSLATED",
    "checkpoint_section",
    "entrypoint",
    "environment_vars",
    "resources",
]

# the module whose launcher puts the stand-in `determined` package on PYTHONPATH
# (dlhpc.integrations.determined; a test holds the names equal)
LAUNCHER = "python -m dlhpc.integrations.determined"
ENV_USER_DATA = "DLHPC_DETERMINED_USER_DATA"
_DET_LAUNCHERS = ("determined.launch.torch_distributed", "determined.launch.horovod")

# Determined fields with no dlhpc equivalent: the reason each is not translated
UNTRANSLATED: dict[str, str] = {
    "bind_mounts": "jobs run on the cluster's own filesystems (no container)",
    "checkpoint_policy": "dlhpc keeps checkpoints by checkpoint.keep_* only",
    "debug": "no equivalent (use dlhpc --debug for the commands)",
    "integrations": "no equivalent",
    "labels": "no equivalent",
    "log_policies": "no equivalent (dlhpc restarts crashes up to max_restarts)",
    "min_checkpoint_period": "Trial API only; a Core API script checkpoints when it chooses",
    "min_validation_period": "Trial API only; a Core API script validates when it chooses",
    "optimizations": "Trial API only",
    "perform_initial_validation": "Trial API only",
    "preemption_timeout": "Slurm's grace time and preemption.lead_time apply",
    "pbs": "dlhpc runs on Slurm (or locally)",
    "profiling": "no equivalent",
    "project": "no projects in dlhpc",
    "records_per_epoch": "Trial API only",
    "retention_policy": "logs stay in the run folder until it is removed",
    "scheduling_unit": "Trial API only",
    "tensorboard_storage": "no TensorBoard upload; metrics are in dlhpc status and reports",
    "workspace": "no workspaces in dlhpc",
}


def entrypoint(src: Source) -> str | None:
    """The dlhpc entrypoint: Determined's command behind the stand-in's launcher, with
    Determined's own distributed launcher left out (dlhpc starts one task per slot and
    sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT itself)."""
    value = src.data.get("entrypoint")
    keys = ("entrypoint",)
    if value is None:
        src.error(keys, "required: the command that runs the Core API script")
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        argv = list(value)
    elif isinstance(value, str) and value.strip():
        try:
            argv = shlex.split(value)
        except ValueError as err:
            src.error(keys, f"cannot split into arguments: {err}")
            return None
    else:
        src.error(keys, f"must be a command (a string or a list of strings), got {value!r}")
        return None
    if len(argv) == 1 and ":" in argv[0] and not argv[0].endswith(".py"):
        src.error(
            keys,
            f"{argv[0]!r} is a Trial API class (module:Class); dlhpc runs Core API scripts"
            " (an entrypoint command such as `python3 train.py`)",
        )
        return None
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] in _DET_LAUNCHERS:
        rest = argv[3:]
        rest = rest[rest.index("--") + 1 :] if "--" in rest else rest
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        src.note(keys, f"{argv[2]} left out: dlhpc starts one process per slot itself")
        argv = rest
        if not argv:
            src.error(keys, f"{value!r}: no command after Determined's launcher")
            return None
    return f"{LAUNCHER} {shlex.join(argv)}"


def _slurm(src: Source) -> tuple[str | None, list[str], int | None]:
    """Determined's ``slurm`` section (its Slurm launcher): gpu_type, sbatch_args,
    slots_per_node."""
    keys = ("slurm",)
    sl = src.mapping(keys, src.data.get("slurm"))
    for key in sorted(set(sl) - {"gpu_type", "sbatch_args", "slots_per_node"}):
        src.note((*keys, key), "not translated")
    gpu_type = src.typed(
        (*keys, "gpu_type"), sl.get("gpu_type"), lambda v: isinstance(v, str) and bool(v), "text"
    )
    args = src.typed(
        (*keys, "sbatch_args"),
        sl.get("sbatch_args", []),
        lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
        "a list of strings",
    )
    per_node = src.int_at((*keys, "slots_per_node"), sl.get("slots_per_node"), 1)
    return gpu_type, list(args or []), per_node


def resources(src: Source, slot_type: str, gpus_per_node: int | None) -> dict[str, Any]:
    """``resources.slots_per_trial`` as GPUs (one task each), or as CPU tasks; the
    ``slurm`` section's GPU type, sbatch arguments and slots per node."""
    keys = ("resources",)
    res = src.mapping(keys, src.data.get("resources"))
    for key in sorted(set(res) - {"slots_per_trial"}):
        src.note((*keys, key), "not translated (set resources.partition/qos/... by hand)")
    gpu_type, sbatch_args, slots_per_node = _slurm(src)
    out: dict[str, Any] = {"sbatch_args": sbatch_args} if sbatch_args else {}
    if "slots_per_trial" in res:
        slots = src.int_at((*keys, "slots_per_trial"), res["slots_per_trial"])
    else:
        slots = 1
        src.note((*keys, "slots_per_trial"), "not given: Determined's default, 1 slot")
    if slots is None:
        return out
    if slots == 0:
        return {"gpus_per_node": 0, **out}
    if slot_type == "cpu":
        if gpu_type is not None:
            src.note(("slurm", "gpu_type"), "not used: --slot-type cpu")
        return {"gpus_per_node": 0, "tasks_per_node": slots, **out}
    per_node = gpus_per_node or slots_per_node or slots
    if slots % per_node:
        src.error(
            (*keys, "slots_per_trial"),
            f"{slots} slots do not fill nodes of {per_node} GPUs (--gpus-per-node,"
            " slurm.slots_per_node)",
        )
        return out
    gpus: int | str = f"{gpu_type}:{per_node}" if gpu_type else per_node
    return {"nodes": slots // per_node, "gpus_per_node": gpus, **out}


def checkpoint_section(src: Source) -> dict[str, Any]:
    """``checkpoint_storage``: the keep settings, and a shared_fs folder."""
    keys = ("checkpoint_storage",)
    cs = src.mapping(keys, src.data.get("checkpoint_storage"))
    out: dict[str, Any] = {}
    pairs = (
        ("save_trial_best", "keep_best", 0),
        ("save_trial_latest", "keep_latest", 0),
        ("save_experiment_best", "keep_experiment_best", 0),
    )
    for det_key, key, low in pairs:
        if det_key in cs:
            value = src.int_at((*keys, det_key), cs[det_key], low)
            if value is not None:
                out[key] = value
    if out.get("keep_latest") == 0:
        src.note((*keys, "save_trial_latest"), "0 raised to 1: dlhpc resumes from the newest")
        out["keep_latest"] = 1
    kind = cs.get("type")
    if kind == "shared_fs" and isinstance(cs.get("host_path"), str):
        path = cs["host_path"]
        sub = cs.get("storage_path")
        out["dir"] = f"{path.rstrip('/')}/{sub}" if isinstance(sub, str) and sub else path
    elif kind is not None:
        src.note((*keys, "type"), f"{kind!r} storage not translated: checkpoints go to the site's")
    done = {"save_trial_best", "save_trial_latest", "save_experiment_best", "type"}
    done |= {"host_path", "storage_path"} if "dir" in out else set()
    for key in sorted(set(cs) - done):
        src.note((*keys, key), "not translated")
    return out


def environment_vars(src: Source) -> dict[str, str]:
    """``environment.environment_variables`` (a list of NAME=value, or per cpu/cuda/rocm),
    plus ``data`` as JSON for ``info.user_data``; the image and the rest are listed."""
    keys = ("environment",)
    env = src.mapping(keys, src.data.get("environment"))
    out: dict[str, str] = {}
    given = env.get("environment_variables")
    items: list[Any] = []
    if isinstance(given, list):
        items = given
    elif isinstance(given, dict):
        items = list(given.get("cuda") or given.get("cpu") or [])
        src.note((*keys, "environment_variables"), "the cuda (else cpu) list is used")
    elif given is not None:
        src.error((*keys, "environment_variables"), "must be a list of NAME=value strings")
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            src.error((*keys, "environment_variables"), f"must be NAME=value, got {item!r}")
            continue
        name, _, value = item.partition("=")
        out[name] = value
    for key in sorted(set(env) - {"environment_variables"}):
        src.note((*keys, key), "not translated: jobs run in the cluster's environment")
    if "data" in src.data:
        try:
            out[ENV_USER_DATA] = json.dumps(src.data["data"], sort_keys=True)
        except (TypeError, ValueError) as err:
            src.error(("data",), f"must be JSON-compatible: {err}")
    return out
