"""``dlhpc simulate``: the real searcher and orchestrator on a simulated cluster.

One simulated run (:func:`simulate_once`) is a real ``launch`` and a loop of
real ``tick`` passes over a fresh state folder, where only the scheduler backend
(:class:`SimCluster`: N GPUs, queue waits, preemptions, time limits, stop files,
cancels) and the clock (:class:`VirtualClock`) are simulated. Trials follow
learning curves from :class:`SyntheticCurves` (a family with a known best
configuration) or :class:`RecordedCurves` (a finished experiment in the DB).
:func:`compare` repeats runs for the experiment's searcher and alternatives and
reports GPU-hours, wall time and the chance of finding the best configuration.
"""

from dlhpc.simulate._clock import SIM_EPOCH, VirtualClock
from dlhpc.simulate._cluster import STOP_NOTICE_S, SimCluster
from dlhpc.simulate._compare import (
    Comparison,
    SearcherSummary,
    compare,
    curve_sources,
    searcher_problem,
)
from dlhpc.simulate._curves import (
    BestReference,
    Curve,
    CurveSource,
    SyntheticCurves,
    best_reference,
)
from dlhpc.simulate._recorded import RecordedCurves, RecordedTrial, load_recorded
from dlhpc.simulate._run import RunResult, SimSettings, drive, sim_config, simulate_once
from dlhpc.simulate._tasks import ClusterSpec, SimStats

__all__ = [
    "SIM_EPOCH",
    "STOP_NOTICE_S",
    "BestReference",
    "ClusterSpec",
    "Comparison",
    "Curve",
    "CurveSource",
    "RecordedCurves",
    "RecordedTrial",
    "RunResult",
    "SearcherSummary",
    "SimCluster",
    "SimSettings",
    "SimStats",
    "SyntheticCurves",
    "VirtualClock",
    "best_reference",
    "drive",
    "compare",
    "curve_sources",
    "load_recorded",
    "searcher_problem",
    "sim_config",
    "simulate_once",
]
