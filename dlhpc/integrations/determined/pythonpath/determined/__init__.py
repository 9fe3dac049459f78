"""dlhpc's stand-in for Determined's ``determined`` package, importable only inside dlhpc
jobs whose entrypoint starts with ``python -m dlhpc.integrations.determined`` (see
:mod:`dlhpc.integrations.determined`). It covers the Core API a script uses:
``get_cluster_info()``, ``core.init()`` and what the context holds, and the launch layers
(``determined.launch``). Determined's Trial APIs (``det.pytorch``, ``det.keras``, ...)
raise an error that says so."""

from typing import Any

from dlhpc.integrations.determined import UNSUPPORTED_APIS, unsupported
from dlhpc.integrations.determined.cluster import ClusterInfo, TrialInfo, get_cluster_info

from . import core

__all__ = ["LOG_FORMAT", "ClusterInfo", "TrialInfo", "core", "get_cluster_info"]
__version__ = "0.38.1+dlhpc"
DLHPC_SHIM = True  # how a test tells the stand-in from the real package

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"


def __getattr__(name: str) -> Any:
    if name in UNSUPPORTED_APIS:
        raise AttributeError(unsupported(f"determined.{name}"))
    raise AttributeError(f"module 'determined' has no attribute {name!r}")
