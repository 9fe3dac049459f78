"""The state names: one leaf module (the live attempt states derived from the job
states), and one constructor builds every new attempt row."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import dlhpc.states as states
from dlhpc.scheduler import JobState
from dlhpc.store import utcnow
from dlhpc.store.ingest import new_attempt


def _import_roots(path: str) -> set[str]:
    tree = ast.parse(Path(path).read_text())
    return {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }


def test_the_states_module_imports_only_the_standard_library() -> None:
    stdlib = {*sys.stdlib_module_names, "__future__"}
    assert {m.split(".")[0] for m in _import_roots(states.__file__)} <= stdlib


def test_an_attempt_is_live_exactly_while_the_schedulers_job_is() -> None:
    assert states.JobState is JobState
    assert {s.value for s in JobState if not s.is_terminal} == states.LIVE_ATTEMPT_STATES
    assert {"PENDING", "RUNNING", "REQUEUED", "UNKNOWN"} == states.LIVE_ATTEMPT_STATES
    assert states.SUPERSEDED not in {s.value for s in JobState}


def test_terminal_states_are_the_terminal_sets() -> None:
    assert {s.value for s in states.TrialState if s.is_terminal} == states.TERMINAL_TRIAL_STATES
    assert {
        s.value for s in states.ExperimentState if s.is_terminal
    } == states.TERMINAL_EXPERIMENT_STATES
    assert states.TrialState.PAUSED.value not in states.TERMINAL_TRIAL_STATES


@pytest.mark.parametrize(
    ("key", "job_id", "index", "restart"),
    [
        ("123_4.r0", "123_4", 4, 0),
        ("123_4.r2", "123_4", 4, 2),
        ("123.r1", "123", None, 1),
        ("local-7_x.r0", "local-7_x", None, 0),
        ("123_5", "123_5", 5, 0),  # not an attempt folder name: a job id at restart 0
    ],
)
def test_new_attempt_reads_the_job_array_index_and_restart_from_the_key(
    key: str, job_id: str, index: int | None, restart: int
) -> None:
    a = new_attempt(7, key, "PENDING", utcnow(), submission_id=3, log_path="/l")
    assert (a.trial_id, a.attempt_key, a.job_id) == (7, key, job_id)
    assert (a.array_index, a.restart_count, a.state) == (index, restart, "PENDING")
    assert (a.submission_id, a.log_path) == (3, "/l")
