"""``determined.core`` of dlhpc's stand-in: ``init()`` and the context's parts."""

from dlhpc.integrations.determined.checkpoints import CheckpointContext, DownloadMode
from dlhpc.integrations.determined.core_api import (
    Context,
    PreemptContext,
    PreemptMode,
    SearcherContext,
    SearcherMode,
    SearcherOperation,
    TrainContext,
    Unit,
    init,
)
from dlhpc.integrations.determined.distributed import DistributedContext

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "PreemptContext",
    "PreemptMode",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TrainContext",
    "Unit",
    "init",
]
