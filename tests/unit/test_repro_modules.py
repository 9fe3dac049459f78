"""``dlhpc diff`` shows the environment modules that were in effect in the jobs (the
attempt records' ``modules``, after the site's ``module load`` lines), not only those
loaded where ``dlhpc launch`` ran."""

from __future__ import annotations

from typing import Any

from dlhpc.repro import diff_records
from dlhpc.repro._attempt import attempt_record
from tests.unit.test_repro import _record


def _job_modules(loaded: str) -> dict[str, Any]:
    modules: dict[str, Any] = attempt_record({"LOADEDMODULES": loaded})["modules"]
    return modules


def test_modules_in_effect_in_the_job_differ() -> None:
    a = _record(attempt__modules=_job_modules("gcc/12:cuda/12.1"))
    b = _record(attempt__modules=_job_modules("gcc/12:cuda/12.4:nccl/2.20"))
    got = {(d.section, d.item): (d.a, d.b) for d in diff_records(a, b)}
    assert got == {
        ("modules", "job: cuda"): ("cuda/12.1", "cuda/12.4"),
        ("modules", "job: nccl"): (None, "nccl/2.20"),
    }
    assert diff_records(a, b, sections={"modules"}) == diff_records(a, b)
    assert diff_records(a, _record(attempt__modules=_job_modules("gcc/12:cuda/12.1"))) == []


def test_launch_and_job_modules_are_told_apart_and_missing_ones_not_compared() -> None:
    a = _record(attempt__modules=_job_modules("cuda/12.1"))
    b = _record(experiment__modules={"loaded": ["cuda/12.4"]}, attempt__modules={"loaded": []})
    got = {(d.section, d.item): (d.a, d.b) for d in diff_records(a, b)}
    assert got == {
        ("modules", "cuda"): ("cuda/12.1", "cuda/12.4"),  # where dlhpc launch ran
        ("modules", "job: cuda"): ("cuda/12.1", None),  # in the job
    }
    # a record without the job's modules (older, or a reproduction not yet run) says nothing
    assert diff_records(a, _record()) == []
