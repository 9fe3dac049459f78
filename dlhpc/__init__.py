"""dlhpc: Slurm-native, daemon-free orchestration of deep-learning experiments."""

from dlhpc.errors import DlhpcError
from dlhpc.harness.context import TrialContext, init

__version__ = "0.1.0"
__all__ = ["DlhpcError", "TrialContext", "__version__", "init"]
