"""The tick's order of steps: every experiment decides (one commit each) before any acts,
and the act step (stop, cancel, submit, keep policy) holds back only the experiment
whose cancel failed.

Two experiments launched on an in-process backend that refuses their first
submission for a site limit, so that their trials wait PENDING for the tick to submit.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from dlhpc.config import load_experiment
from dlhpc.errors import SchedulerError
from dlhpc.orchestrator._reconcile import Decided
from dlhpc.orchestrator.launch import launch
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.scheduler import JobRequest, SubmittedTask
from dlhpc.scheduler.plugins import Backend, BackendTable
from dlhpc.search import SearcherTable
from dlhpc.store import Store
from tests.unit.test_site_limits import YAML, Limited

tick_module = importlib.import_module("dlhpc.orchestrator.tick")  # the module, not the function


class _Recording(Limited):
    """Records its submissions, by experiment, in ``log``; fails its cancels while
    ``cancel_fails``."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self.cancel_fails = False

    def submit(self, request: JobRequest) -> list[SubmittedTask]:
        tasks = super().submit(request)
        self.log.append(f"submit {request.experiment_id}")
        return tasks

    def cancel(self, job_ids: Collection[str]) -> None:
        if self.cancel_fails:
            raise SchedulerError("scancel: error: Slurm is down")
        super().cancel(job_ids)


def _two_experiments(tmp_path: Path) -> tuple[Store, SchedulerPool, _Recording, list[str]]:
    """Two launched experiments, one PENDING trial each, their submission DEFERRED."""
    (tmp_path / "train.py").write_text("")
    yaml = tmp_path / "exp.yaml"
    yaml.write_text(YAML)
    store = Store(tmp_path / "home")
    log: list[str] = []
    backend = _Recording(log)
    pool = SchedulerPool(
        local_root=tmp_path / "local",
        backends=BackendTable([Backend("local", lambda _r: backend)]),
    )
    backend.refuse = True
    for _ in range(2):
        launch(
            load_experiment(yaml, site="local", searchers=SearcherTable()), store, pool, record={}
        )
    backend.refuse = False
    return store, pool, backend, log


def _decisions_logged(
    monkeypatch: pytest.MonkeyPatch, log: list[str], change: Callable[[Decided], Decided]
) -> None:
    """Wrap the decide step of one experiment: log it, then ``change`` what it decided."""
    real = tick_module.reconcile_experiment

    def logged(store: Store, exp_id: int, *args: Any) -> Decided | None:
        decided = real(store, exp_id, *args)
        log.append(f"decide {exp_id}")
        return None if decided is None else change(decided)

    monkeypatch.setattr(tick_module, "reconcile_experiment", logged)


def test_every_experiment_decides_before_any_submits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, pool, _backend, log = _two_experiments(tmp_path)
    _decisions_logged(monkeypatch, log, lambda d: d)
    report = tick_module.tick(store, pool)
    assert report.errors == []
    assert log == ["decide 1", "decide 2", "submit 1", "submit 2"]
    assert report.submitted == 2
    log.clear()
    again = tick_module.tick(store, pool)  # idempotent: decided again, nothing submitted twice
    assert (again.submitted, log) == (0, ["decide 1", "decide 2"])


def test_a_failed_cancel_holds_back_that_experiments_submission_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, pool, backend, log = _two_experiments(tmp_path)

    def cancel_in_first(d: Decided) -> Decided:
        return dataclasses.replace(d, cancels=["7_0"]) if d.exp_id == 1 else d

    _decisions_logged(monkeypatch, log, cancel_in_first)
    backend.cancel_fails = True
    report = tick_module.tick(store, pool)
    assert report.errors == ["experiment 1: SchedulerError: scancel: error: Slurm is down"]
    assert log == ["decide 1", "decide 2", "submit 2"]
    assert report.submitted == 1
    backend.cancel_fails = False
    log.clear()
    later = tick_module.tick(store, pool)  # the cancel goes through: the held-back trial goes
    assert (later.errors, later.submitted) == ([], 1)
    assert log == ["decide 1", "decide 2", "submit 1"]
    assert backend.cancelled == ["7_0"]
