"""The ``resources:`` and ``preemption:`` sections of an experiment file.

:func:`read_resources` and :func:`read_preemption` read their section into
``issues`` (every problem, at its key) and return the resolved value, with the
site's defaults filled in; with ``site_ok`` false (the site did not load) the
checks that need the site are skipped. They write nothing.
"""

from __future__ import annotations

import re
from typing import Any

from dlhpc.config import _fields as F
from dlhpc.config._gpus import gpu_count, gpu_option, resolve_gpu_type
from dlhpc.config._site import not_listed
from dlhpc.config._units import format_minutes
from dlhpc.config._validate import (
    Field,
    Invalid,
    Issues,
    describe,
    integer,
    read_section,
    string_list,
)
from dlhpc.config.schema import PreemptionConfig, Resources, SiteConfig

__all__ = ["MAX_COUNT", "read_preemption", "read_resources"]

MAX_COUNT = 100_000  # nodes, CPUs, restarts, kept checkpoints: more is a typo
_MEM = re.compile(r"[0-9]{1,12}[KMGT]?")
_MEM_UNIT_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}
_MAX_MEM_MB = 10**12  # far above any node; what Slurm's --mem parser takes
_SBATCH_ARG = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*(=.*)?", re.DOTALL)
# Options dlhpc writes itself (long name -> short letter).
_OWNED = {
    "array": "a",
    "output": "o",
    "error": "e",
    "job-name": "J",
    "signal": "",
    "open-mode": "",
    "requeue": "",
    "no-requeue": "",
}
_OWNED_SHORT = {short: long for long, short in _OWNED.items() if short}


def _mem(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_MEM_MB:
        return str(value)
    if isinstance(value, str) and _MEM.fullmatch(value):
        digits, unit = (value[:-1], value[-1]) if value[-1] in _MEM_UNIT_MB else (value, "M")
        if int(digits) * _MEM_UNIT_MB[unit] < _MAX_MEM_MB:
            return value
        raise Invalid(f"must be under 10^12 megabytes, got {describe(value)}")
    raise Invalid(
        f"must be megabytes (an integer) or like '4G' (digits + K/M/G/T), got {describe(value)}"
    )


def _sbatch_arg(value: Any) -> str:
    if (
        not isinstance(value, str)
        or not _SBATCH_ARG.fullmatch(value)
        or any(c in value for c in "\n\r\0")
    ):
        raise Invalid(
            "must be one sbatch option token like '--key=value' or '--flag' "
            f"(write '--partition=gpu', not '-p gpu'), got {describe(value)}"
        )
    option = value.split("=", 1)[0]
    gpu = gpu_option(value)
    if gpu is not None:
        raise Invalid(
            f"{gpu} requests GPUs, which resources.gpus_per_node already does (2, or a typed "
            "a100:2); remove it"
        )
    if option.startswith("--"):
        given = option[2:]
        for long in _OWNED:
            if long.startswith(given):
                what = f"--{long}" if long == given else f"--{given} (short for --{long})"
                raise Invalid(f"{what} is set by dlhpc itself; remove it")
    elif option[1] in _OWNED_SHORT:
        raise Invalid(
            f"-{option[1]} (--{_OWNED_SHORT[option[1]]}) is set by dlhpc itself; remove it"
        )
    return value


_RESOURCES = {
    "nodes": Field(integer(min=1, cap=MAX_COUNT), default=1),
    "gpus_per_node": Field(gpu_count, default=(None, 0)),
    "tasks_per_node": Field(integer(min=1, cap=MAX_COUNT), nullable=True),
    "cpus_per_task": Field(integer(min=1, cap=MAX_COUNT), default=1),
    "mem": Field(_mem, default="4G"),
    "time": Field(F.slurm_time(allow_unlimited=False), default=("01:00:00", 60)),
    "partition": Field(F.TOKEN, nullable=True),
    "account": Field(F.TOKEN, nullable=True),
    "qos": Field(F.TOKEN, nullable=True),
    "constraint": Field(F.TOKEN, nullable=True),
    "sbatch_args": Field(string_list(_sbatch_arg), default=()),
}
_PREEMPTION = {
    "signal": Field(F.signal, nullable=True),
    "lead_time": Field(F.lead_time, nullable=True),
}


def read_resources(issues: Issues, value: Any, site: SiteConfig, site_ok: bool) -> Resources:
    """The ``resources:`` section, the site's partition, account and QOS filling what it
    leaves out; each partition named is checked against the site's list (GPUs per node,
    GPU type, max time) when the site loaded and lists partitions."""
    path = ("resources",)
    s = read_section(issues, value, path, _RESOURCES)
    partition = s["partition"] if s["partition"] is not None else site.partition
    time_text, minutes = s["time"]
    given_type, gpus = s["gpus_per_node"]
    if site_ok and site.partitions and partition is not None and issues.ok((*path, "partition")):
        for part in partition.split(","):
            info = site.partitions.get(part)
            if info is None:
                issues.add((*path, "partition"), not_listed(part, site.partitions, site.name))
                continue
            if gpus > info.gpus_per_node and issues.ok((*path, "gpus_per_node")):
                issues.add(
                    (*path, "gpus_per_node"),
                    f"partition {part!r} has {info.gpus_per_node} GPU(s) per node, got {gpus}",
                )
            if given_type and info.gpu_type and given_type != info.gpu_type:
                issues.add(
                    (*path, "gpus_per_node"),
                    f"partition {part!r} has GPUs of type {info.gpu_type!r} (site "
                    f"{site.name!r}), got {given_type!r}",
                )
            limit = info.max_time_minutes
            if limit is not None and minutes > limit and issues.ok((*path, "time")):
                issues.add(
                    (*path, "time"),
                    f"exceeds partition {part!r}'s max_time {format_minutes(limit)}, "
                    f"got {describe(time_text)} ({format_minutes(minutes)})",
                )
    tasks = s["tasks_per_node"]
    return Resources(
        nodes=s["nodes"],
        gpus_per_node=gpus,
        tasks_per_node=tasks if tasks is not None else max(1, gpus),
        cpus_per_task=s["cpus_per_task"],
        mem=s["mem"],
        time=time_text,
        time_minutes=minutes,
        partition=partition,
        account=s["account"] if s["account"] is not None else site.account,
        qos=s["qos"] if s["qos"] is not None else site.qos,
        constraint=s["constraint"],
        sbatch_args=s["sbatch_args"],
        gpu_type=resolve_gpu_type(site, partition, given_type, gpus),
    )


def read_preemption(
    issues: Issues, value: Any, site: SiteConfig, site_ok: bool, resources: Resources
) -> PreemptionConfig:
    """The ``preemption:`` section, the site's signal and lead time filling what it leaves
    out; the lead time must be shorter than ``resources.time`` (reported at the key the
    user gave: ``lead_time``, else ``resources.time``)."""
    path = ("preemption",)
    s = read_section(issues, value, path, _PREEMPTION)
    lead = s["lead_time"] if s["lead_time"] is not None else site.lead_time_s
    walltime = resources.time_minutes * 60
    checkable = site_ok or "lead_time" in s.given
    if lead >= walltime and checkable and issues.ok((*path, "lead_time"), ("resources", "time")):
        if "lead_time" in s.given:
            issues.add(
                (*path, "lead_time"),
                f"must be shorter than resources.time ({walltime}s), got {lead}s",
            )
        else:
            issues.add(
                ("resources", "time"),
                f"must be longer than the site's preemption "
                f"lead_time ({lead}s), got {resources.time_minutes * 60}s",
            )
    return PreemptionConfig(
        signal=s["signal"] if s["signal"] is not None else site.signal, lead_time_s=lead
    )
