"""The optional pyslurm queue path: choice, version matching, same results as squeue.

pyslurm is faked at the import boundary (a module object with pyslurm 22.5's
``__version__``, ``slurm_api_version()`` and ``job().find_user()``): no pyslurm
for Slurm 22.05 can be installed here (PyPI has 17.11, 18.8 and 25.11 only).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import pytest

from dlhpc.errors import SchedulerError
from dlhpc.scheduler import JobState, SlurmScheduler
from dlhpc.scheduler.slurm._pyslurm import (
    PollPath,
    choose,
    poll_path,
    queue_via_pyslurm,
    squeue_lines,
    version_pair,
)
from dlhpc.scheduler.slurm.parse import parse_squeue

_T0 = int(datetime(2024, 5, 1, 12, 0, 0).timestamp())
# find_user records (pyslurm 22.5 keys) and the squeue line the CLI prints for each.
_RECORDS: dict[int, dict[str, Any]] = {
    101: {  # a pending array, not yet split
        "job_id": 101,
        "array_job_id": 101,
        "array_task_id": None,
        "array_task_str": "2-4%2",
        "job_state": "PENDING",
        "state_reason": "JobArrayTaskLimit",
        "nodes": None,
        "start_time": 0,
        "end_time": 0,
    },
    102: {
        "job_id": 102,
        "array_job_id": 101,
        "array_task_id": 0,
        "array_task_str": None,
        "job_state": "RUNNING",
        "state_reason": "None",
        "nodes": "node1",
        "start_time": _T0,
        "end_time": _T0 + 3600,
    },
    103: {
        "job_id": 103,
        "array_job_id": 101,
        "array_task_id": 1,
        "array_task_str": None,
        "job_state": "COMPLETED",
        "state_reason": "None",
        "nodes": "node2",
        "start_time": _T0,
        "end_time": _T0 + 60,
    },
    200: {  # a plain job
        "job_id": 200,
        "array_job_id": None,
        "array_task_id": None,
        "array_task_str": None,
        "job_state": "CANCELLED",
        "state_reason": "None",
        "nodes": "node1",
        "start_time": _T0,
        "end_time": _T0 + 5,
    },
}
_SQUEUE = """\
101_[2-4%2]|PENDING|JobArrayTaskLimit||N/A|N/A
101_0|RUNNING|None|node1|2024-05-01T12:00:00|2024-05-01T13:00:00
101_1|COMPLETED|None|node2|2024-05-01T12:00:00|2024-05-01T12:01:00
200|CANCELLED|None|node1|2024-05-01T12:00:00|2024-05-01T12:00:05
"""


def fake_pyslurm(
    version: str = "22.5.1",
    api: tuple[int, int, int] = (22, 5, 8),
    records: Mapping[int, Mapping[str, Any]] | Exception = _RECORDS,
) -> types.ModuleType:
    module = types.ModuleType("pyslurm")
    module.__version__ = version  # type: ignore[attr-defined]
    module.slurm_api_version = lambda: api  # type: ignore[attr-defined]
    asked: list[str] = []

    class job:  # noqa: N801 - pyslurm's name
        def find_user(self, user: str) -> Mapping[int, Mapping[str, Any]]:
            asked.append(user)
            if isinstance(records, Exception):
                raise records
            return records

    module.job = job  # type: ignore[attr-defined]
    module.asked = asked  # type: ignore[attr-defined]
    return module


def importer(module: types.ModuleType | Exception) -> Callable[[str], types.ModuleType]:
    def load(name: str) -> types.ModuleType:
        assert name == "pyslurm"
        if isinstance(module, Exception):
            raise module
        return module

    return load


def test_version_pair() -> None:
    assert version_pair("slurm 22.05.8") == (22, 5)
    assert version_pair("22.5.1") == (22, 5)
    assert version_pair("25.11.2") == (25, 11)
    assert version_pair("unknown") is None


def test_chosen_when_versions_match() -> None:
    path = choose(importer=importer(fake_pyslurm()), slurm_version=lambda: "slurm 22.05.8")
    assert path.name == "pyslurm" and path.module is not None
    assert path.reason == "pyslurm 22.5.1 matches slurm 22.05.8"


@pytest.mark.parametrize(
    ("module", "installed", "env", "reason"),
    [
        (
            ModuleNotFoundError("No module named 'pyslurm'"),
            "slurm 22.05.8",
            {},
            "pyslurm is not importable (No module named 'pyslurm')",
        ),
        (
            OSError("libslurm.so.37: cannot open shared object file"),
            "slurm 22.05.8",
            {},
            "importing pyslurm failed (OSError: libslurm.so.37",
        ),
        (fake_pyslurm("25.11.2", (25, 11, 2)), "slurm 22.05.8", {}, "is for Slurm 25.11"),
        (fake_pyslurm("22.5.1", (23, 2, 0)), "slurm 22.05.8", {}, "built against Slurm 23.02"),
        (fake_pyslurm("dev", (22, 5, 8)), "slurm 22.05.8", {}, "no readable version ('dev')"),
        (fake_pyslurm(), "", {}, "cannot tell the installed Slurm's version"),
        (fake_pyslurm(), "slurm 22.05.8", {"DLHPC_PYSLURM": "0"}, "disabled by DLHPC_PYSLURM=0"),
    ],
)
def test_cli_chosen_with_the_reason(
    module: types.ModuleType | Exception, installed: str, env: dict[str, str], reason: str
) -> None:
    path = choose(importer=importer(module), slurm_version=lambda: installed, environ=env)
    assert path.name == "cli" and path.module is None
    assert path.reason.startswith("squeue: ")
    assert reason in path.reason


def test_choice_is_made_once_per_process() -> None:
    assert poll_path() is poll_path()
    assert SlurmScheduler().queue_path is poll_path()


def test_records_parse_exactly_as_squeue_output() -> None:
    ours = queue_via_pyslurm(fake_pyslurm(), "alice")
    assert ours == parse_squeue(_SQUEUE)
    assert sorted(ours) == ["101_0", "101_1", "101_2", "101_3", "101_4", "200"]
    assert ours["101_3"].state is JobState.PENDING and ours["101_3"].reason == "JobArrayTaskLimit"
    assert ours["101_0"].node_list == "node1" and ours["101_0"].end is None  # not a fact yet
    assert ours["101_1"].exit_code == 0 and ours["101_1"].end == datetime(2024, 5, 1, 12, 1)
    assert squeue_lines(_RECORDS).splitlines() == _SQUEUE.splitlines()


def test_scheduler_polls_through_pyslurm_without_squeue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # any squeue/sacct would fail loudly
    module = fake_pyslurm()
    sched = SlurmScheduler(queue_path=PollPath("pyslurm", "test", module))
    got = sched.poll(["101_0", "101_3"])
    assert {k: v.state for k, v in got.items()} == {
        "101_0": JobState.RUNNING,
        "101_3": JobState.PENDING,
    }
    assert sched.calls == {"pyslurm": 1}
    assert len(module.asked) == 1


def test_pyslurm_failure_mid_tick_is_an_error_not_a_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    module = fake_pyslurm(records=ValueError("Unable to contact slurm controller"))
    sched = SlurmScheduler(queue_path=PollPath("pyslurm", "test", module))
    with pytest.raises(SchedulerError, match="pyslurm poll failed .*Unable to contact") as err:
        sched.poll(["101_0"])
    assert "DLHPC_PYSLURM=0" in str(err.value)
    assert sched.calls == {"pyslurm": 1}  # and no squeue was tried behind the user's back


def test_doctor_shows_the_choice_and_its_reason() -> None:
    from dlhpc.scheduler.slurm.checks import pyslurm_check

    check = pyslurm_check()
    assert check.name == "queue polling" and check.detail == poll_path().reason
