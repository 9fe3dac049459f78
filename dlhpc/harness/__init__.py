"""In-job side: the API training scripts call, and the worker that runs them."""

from dlhpc.harness.context import TrialContext
from dlhpc.harness.entry import init

__all__ = ["TrialContext", "init"]
