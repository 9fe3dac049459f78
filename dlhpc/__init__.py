"""dlhpc: Slurm-native, daemon-free orchestration of deep-learning experiments."""

from typing import TYPE_CHECKING, Any

from dlhpc._version import __version__
from dlhpc.errors import DlhpcError

if TYPE_CHECKING:
    from dlhpc.harness.context import TrialContext
    from dlhpc.harness.entry import init

__all__ = ["DlhpcError", "TrialContext", "__version__", "init"]


def __getattr__(name: str) -> Any:
    # The in-job API loads on first use: the `dlhpc` command does not need it.
    if name == "TrialContext":
        from dlhpc.harness.context import TrialContext

        return TrialContext
    if name == "init":
        from dlhpc.harness.entry import init

        return init
    raise AttributeError(f"module 'dlhpc' has no attribute {name!r}")
