"""A login node whose clock is off by minutes, ahead or behind: the tick judges a
running job's heartbeat by the clock that stamped the file, so a fresh heartbeat is
never taken for a hung job and a stale one is still found.

No cluster: one trial launched on an in-process backend that shows its job RUNNING;
the heartbeat file is written as the worker writes it, its age set by its time stamp.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from datetime import timedelta
from pathlib import Path

import pytest

from dlhpc.config import load_experiment
from dlhpc.orchestrator import tick
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.protocol import HEARTBEAT_FILE
from dlhpc.scheduler import JobState, JobStatus
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.search import SearcherTable
from dlhpc.store import Store
from tests._clock import SkewedClock
from tests.unit.test_site_limits import Limited

SKEW = timedelta(minutes=10)  # beyond the 180 s after which a heartbeat is stale


class _Running(Limited):
    """Shows every job RUNNING."""

    def poll(self, job_ids: Collection[str]) -> dict[str, JobStatus]:
        return {j: JobStatus(j, JobState.RUNNING) for j in job_ids}


@pytest.mark.parametrize("skew", [SKEW, -SKEW, timedelta(0)], ids=["ahead", "behind", "right"])
@pytest.mark.parametrize("beat_age_s", [5.0, 400.0], ids=["fresh", "stale"])
def test_a_skewed_login_clock_judges_heartbeats_right(
    tmp_path: Path, skew: timedelta, beat_age_s: float
) -> None:
    (tmp_path / "train.py").write_text("")
    yaml = tmp_path / "exp.yaml"
    yaml.write_text(
        "name: skew\nentrypoint: python train.py\n"
        'resources: {cpus_per_task: 1, mem: "1G", time: "01:00:00"}\n'
        "searcher: {name: single, metric: loss, max_length: 3}\n"
    )
    store = Store(tmp_path / "home")
    backend = _Running()
    pool = SchedulerPool(
        local_root=tmp_path / "local", backends=BackendTable([Backend("local", lambda _r: backend)])
    )
    launch(load_experiment(yaml, site="local", searchers=SearcherTable()), store, pool, record={})
    (trial_dir,) = store.runs_root.glob("*/trials/trial-*")
    beat = trial_dir / "attempts" / "40_0.r0" / HEARTBEAT_FILE
    beat.parent.mkdir(parents=True)
    written = time.time() - beat_age_s  # by the compute node's (right) clock
    beat.write_text(json.dumps({"time": written, "pid": 1}))
    os.utime(beat, (written, written))
    report = tick(store, pool, SkewedClock(skew))
    assert report.errors == [] and report.stalled is None
    stale = beat_age_s > 180
    assert backend.cancelled == (["40_0"] if stale else []), (skew, beat_age_s)
    store.close()
