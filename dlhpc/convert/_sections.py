"""Determined's non-search sections: entrypoint, resources, checkpoint storage,
environment, reproducibility, and the fields dlhpc has no equivalent for."""

from __future__ import annotations

import json
import shlex
from typing import Any

from dlhpc.convert._source import Source

__all__ = [
    "CORE_API_ROUTE",
    "ENV_SLOTS",
    "LAUNCHER",
    "LAUNCH_LAYERS",
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
# Determined's launch layers the stand-in provides (determined.launch.<name>)
LAUNCH_LAYERS = ("torch_distributed", "deepspeed")
# the slots of each node, for the stand-in's ClusterInfo.slot_ids
ENV_SLOTS = "DLHPC_DETERMINED_SLOTS_PER_NODE"
CORE_API_ROUTE = (
    "dlhpc runs Core API scripts only (det.core.init(), as in Determined's"
    " examples/tutorials/core_api): train with plain PyTorch under `with det.core.init() as"
    " core_context:` instead of PyTorchTrial / det.pytorch.Trainer / det.keras, or use"
    " dlhpc's own integrations"
)

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


def _launcher_args(src: Source, module: str, args: list[str]) -> None:
    """Check what follows Determined's launch layer ``module`` in the entrypoint."""
    keys = ("entrypoint",)
    launcher = module.rsplit(".", 1)[-1]
    if launcher not in LAUNCH_LAYERS:
        names = ", ".join(f"determined.launch.{name}" for name in LAUNCH_LAYERS)
        src.error(keys, f"{module} is not supported: dlhpc's stand-in runs {names}")
        return
    if "--" in args and launcher == "torch_distributed" and args[: args.index("--")]:
        src.error(
            keys,
            f"torch.distributed.run overrides {args[: args.index('--')]} are not supported:"
            " dlhpc sets the nodes, processes per node, ranks and rendezvous itself",
        )
    elif args[:1] == ["--trial"] or any(a.startswith("--trial=") for a in args[:1]):
        src.error(keys, f"--trial (a Trial API class) is not supported: {CORE_API_ROUTE}")
    elif not [a for a in args if a != "--"]:
        src.error(keys, f"no command after {module}")


def entrypoint(src: Source) -> tuple[str | None, list[str]]:
    """The dlhpc entrypoint and the words of Determined's. As in Determined, a string
    runs through ``sh -c`` and a list as it is, once per node, behind the stand-in's
    launcher; Determined's launch layers (``python3 -m determined.launch.torch_distributed
    SCRIPT...``, ``deepspeed``) are kept: the stand-in's start one worker per slot."""
    value = src.data.get("entrypoint")
    keys = ("entrypoint",)
    if value is None:
        src.error(keys, "required: the command that runs the Core API script")
        return None, []
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        argv, command = list(value), shlex.join(value)
    elif isinstance(value, str) and value.strip():
        try:
            argv = shlex.split(value)
        except ValueError as err:
            src.error(keys, f"cannot split into arguments: {err}")
            return None, []
        command = f"sh -c {shlex.quote(value)}"
    else:
        src.error(keys, f"must be a command (a string or a list of strings), got {value!r}")
        return None, []
    if len(argv) == 1 and ":" in argv[0] and not argv[0].endswith(".py"):
        src.error(keys, f"{argv[0]!r} is a Trial API class (module:Class): {CORE_API_ROUTE}")
        return None, argv
    if len(argv) >= 3 and argv[1] == "-m" and argv[2].startswith("determined.launch."):
        _launcher_args(src, argv[2], argv[3:])
    return f"{LAUNCHER} {command}", argv


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


def resources(
    src: Source, slot_type: str, slots_per_node: int | None
) -> tuple[dict[str, Any], int | None]:
    """``resources.slots_per_trial`` as nodes of ``slots_per_node`` slots (the option, else
    ``slurm.slots_per_node``, else all on one node), with one task per node, as Determined
    runs the entrypoint once per container, and a CPU for each of the node's workers: GPUs
    (``--slot-type gpu``) or CPUs only (``cpu``); the ``slurm`` section's GPU type and
    sbatch arguments.
    Returns the section and the slots per node (None after an error)."""
    keys = ("resources",)
    res = src.mapping(keys, src.data.get("resources"))
    for key in sorted(set(res) - {"slots_per_trial"}):
        src.note((*keys, key), "not translated (set resources.partition/qos/... by hand)")
    gpu_type, sbatch_args, per_node_given = _slurm(src)
    out: dict[str, Any] = {"sbatch_args": sbatch_args} if sbatch_args else {}
    if "slots_per_trial" in res:
        slots = src.int_at((*keys, "slots_per_trial"), res["slots_per_trial"])
    else:
        slots = 1
        src.note((*keys, "slots_per_trial"), "not given: Determined's default, 1 slot")
    if slots is None:
        return out, None
    if slots == 0:
        return {"gpus_per_node": 0, "tasks_per_node": 1, **out}, 0
    if slot_type == "cpu" and gpu_type is not None:
        src.note(("slurm", "gpu_type"), "not used: --slot-type cpu")
    per_node = min(slots_per_node or per_node_given or slots, slots)
    if slots % per_node:
        src.error(
            (*keys, "slots_per_trial"),
            f"{slots} slots do not fill nodes of {per_node} slots (--slots-per-node,"
            " slurm.slots_per_node)",
        )
        return out, None
    gpus: int | str = 0 if slot_type == "cpu" else per_node
    if slot_type == "gpu" and gpu_type:
        gpus = f"{gpu_type}:{per_node}"
    section = {"nodes": slots // per_node, "gpus_per_node": gpus, "tasks_per_node": 1}
    return {**section, "cpus_per_task": per_node, **out}, per_node


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
