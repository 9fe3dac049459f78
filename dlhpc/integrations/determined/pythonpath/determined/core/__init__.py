"""``determined.core`` of dlhpc's stand-in: ``init()`` and the context's parts."""

from dlhpc.integrations.determined.checkpoints import CheckpointContext, DownloadMode
from dlhpc.integrations.determined.core_api import (
    Context,
    DistributedContext,
    PreemptContext,
    PreemptMode,
    SearcherContext,
    SearcherMode,
    SearcherOperation,
    TrainContext,
    Unit,
    init,
)

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
