"""The orchestrator: launch, the tick (reconcile, decide, act), kill."""

from dlhpc.orchestrator.kill import kill_experiment, kill_trial
from dlhpc.orchestrator.launch import DryRun, LaunchResult, launch, plan_launch
from dlhpc.orchestrator.tick import TickReport, tick

__all__ = [
    "DryRun",
    "LaunchResult",
    "TickReport",
    "kill_experiment",
    "kill_trial",
    "launch",
    "plan_launch",
    "tick",
]
