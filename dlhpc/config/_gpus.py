"""GPU requests: ``resources.gpus_per_node`` (a count, or ``TYPE:N``) and the site's type.

``gpus_per_node: 2`` asks for two GPUs of any type, unless the site lists the
partition with a ``gpu_type``: then that type is asked for. ``gpus_per_node:
a100:2`` asks for two A100s whatever the site says (a site partition with
another ``gpu_type`` is a config error). The backend writes the request
(``--gpus-per-node=a100:2`` or ``--gres=gpu:a100:2``, as the site's
``gpu_request`` says); the count N alone is what the rest of dlhpc sees
(tasks per node, GPU-hours). A GPU request in ``sbatch_args`` would be a second,
conflicting one: :func:`gpu_option` finds it, and the loader refuses it.
"""

from __future__ import annotations

import re
from typing import Any

from dlhpc.config._validate import Invalid, describe, integer
from dlhpc.config.schema import SiteConfig

__all__ = ["MAX_GPUS", "gpu_count", "gpu_option", "resolve_gpu_type"]

MAX_GPUS = 1024
_TYPED = re.compile(r"(?P<type>[A-Za-z0-9][A-Za-z0-9_.-]{0,63}):(?P<count>[0-9]{1,5})")
_COUNT = integer(min=0, cap=MAX_GPUS)


def gpu_count(value: Any) -> tuple[str | None, int]:
    """``2`` -> ``(None, 2)``; ``"a100:2"`` -> ``("a100", 2)`` (a typed count is 1 or more)."""
    if isinstance(value, str):
        m = _TYPED.fullmatch(value)
        if m is None:
            raise Invalid(
                "must be a GPU count (e.g. 2) or a GPU type and count (e.g. 'a100:2'), "
                f"got {describe(value)}"
            )
        count = int(m["count"])
        if not 1 <= count <= MAX_GPUS:
            raise Invalid(f"the count of a typed request must be 1 to {MAX_GPUS}, got {count}")
        return m["type"], count
    return None, _COUNT(value)


def gpu_option(token: str) -> str | None:
    """The sbatch option of ``token`` (``--key[=value]`` or ``-K...``) when it requests
    GPUs (``-G``, ``--gpus*`` and its abbreviations, ``--gres``/``--tres-per-task``
    naming a GPU), else None. ``--gpu-bind``, ``--cpus-per-gpu`` and such are not requests."""
    if not token.startswith("--"):
        return "-G" if token[1:2] == "G" else None
    name, _, value = token[2:].partition("=")
    if name.startswith("gpus"):
        return f"--{name}"
    if len(name) >= 3 and ("gres".startswith(name) or name == "tres-per-task"):
        return f"--{name}={value}" if "gpu" in value.lower() else None
    return None


def resolve_gpu_type(
    site: SiteConfig, partition: str | None, given: str | None, count: int
) -> str | None:
    """The type to ask for: ``given``, else the one ``gpu_type`` every listed partition
    of ``partition`` (``a,b`` allowed) has in the site file; None for any GPU (no
    GPUs, partitions the site does not list or that disagree)."""
    if count == 0:
        return None
    if given is not None:
        return given
    if partition is None:
        return None
    infos = [site.partitions.get(p) for p in partition.split(",")]
    types = {i.gpu_type for i in infos if i is not None}
    if len(types) == 1 and None not in types and all(i is not None for i in infos):
        return types.pop()
    return None
