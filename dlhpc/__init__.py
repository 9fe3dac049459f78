"""dlhpc: Slurm-native, daemon-free orchestration of deep-learning experiments."""

from typing import TYPE_CHECKING, Any

from dlhpc._version import __version__
from dlhpc.errors import DlhpcError

if TYPE_CHECKING:
    from dlhpc.harness.context import TrialContext, init

__all__ = ["DlhpcError", "TrialContext", "__version__", "init"]


def __getattr__(name: str) -> Any:
    # The in-job API loads on first use: the `dlhpc` command does not need it.
    if name in ("TrialContext", "init"):
        from dlhpc.harness import context

        return getattr(context, name)
    raise AttributeError(f"module 'dlhpc' has no attribute {name!r}")
