"""The backend table: built-ins, entry points, in-process additions, job environments."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from dlhpc.config import load_site
from dlhpc.errors import ConfigError, DlhpcError
from dlhpc.scheduler import LocalScheduler, SlurmScheduler, make_scheduler
from dlhpc.scheduler.environment import JobEnvironment
from dlhpc.scheduler.local.environment import LocalJobEnvironment
from dlhpc.scheduler.plugins import GROUP, Backend, BackendTable
from dlhpc.scheduler.slurm.checks import state_dir_problem
from dlhpc.scheduler.slurm.environment import SlurmJobEnvironment


class ToyJobEnvironment(JobEnvironment):
    """A test-only backend's job: ``TOY_JOB`` names it."""

    name = "toy"
    marker = "TOY_JOB"

    @classmethod
    def activated(cls, environ: Mapping[str, str]) -> bool:
        return "TOY_JOB" in environ

    @property
    def job_id(self) -> str:
        return self.environ["TOY_JOB"]


TOY = Backend("toy", lambda root: LocalScheduler(root), environment=ToyJobEnvironment)


def test_builtins_come_first_and_an_unknown_name_lists_the_valid_ones() -> None:
    table = BackendTable()
    assert table.names()[:2] == ["slurm", "local"]
    with pytest.raises(ValueError, match=r"unknown scheduler backend 'pbs'; valid: local, slurm"):
        table.get("pbs")
    assert isinstance(make_scheduler("slurm", local_root=Path("/x")), SlurmScheduler)


def test_an_added_backend_builds_schedulers_and_is_found_inside_its_jobs(tmp_path: Path) -> None:
    table = BackendTable().with_backend(TOY)
    assert table.names()[-1] == "toy"
    assert isinstance(make_scheduler("toy", local_root=tmp_path, backends=table), LocalScheduler)
    job = table.job_environment({"TOY_JOB": "t-1"})
    assert isinstance(job, ToyJobEnvironment) and job.job_id == "t-1" and job.rank == 0
    with pytest.raises(ValueError, match="already registered"):
        table.with_backend(TOY)
    with pytest.raises(DlhpcError, match="no TOY_JOB or SLURM_JOB_ID or DLHPC_JOB_ID"):
        table.job_environment({})


def test_slurm_wins_over_local_inside_a_slurm_job() -> None:
    env = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "2", "DLHPC_JOB_ID": "local-a_0"}
    job = BackendTable().job_environment({**env, "SLURM_JOB_ID": "9"})
    assert isinstance(job, SlurmJobEnvironment) and job.job_id == "7_2"
    local = BackendTable().job_environment({"DLHPC_JOB_ID": "local-a_0", "DLHPC_RESTART": "2"})
    assert isinstance(local, LocalJobEnvironment) and (local.job_id, local.restart) == (
        "local-a_0",
        2,
    )
    assert local.requeue_self() is None  # nothing requeues a local task


def test_auto_is_slurm_where_sbatch_is_on_path_else_local(tmp_path: Path) -> None:
    table = BackendTable()
    assert table.auto({"PATH": str(tmp_path)}) == "local"
    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\n")
    sbatch.chmod(0o755)
    assert table.auto({"PATH": str(tmp_path)}) == "slurm"


def test_entry_points_register_third_parties_and_may_not_take_a_builtin_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def points(name: str, value: str) -> Any:
        def entry_points(*, group: str) -> list[metadata.EntryPoint]:
            assert group == GROUP
            return [metadata.EntryPoint(name, value, group)]

        return entry_points

    monkeypatch.setattr(metadata, "entry_points", points("toy", f"{__name__}:TOY"))
    table = BackendTable()
    assert table.names() == ["slurm", "local", "toy"] and table.get("toy") is TOY
    monkeypatch.setattr(metadata, "entry_points", points("broken", "no_such_module:X"))
    with pytest.raises(DlhpcError, match="cannot load backend 'broken'"):
        BackendTable().get("broken")
    monkeypatch.setattr(metadata, "entry_points", points("env", f"{__name__}:ToyJobEnvironment"))
    with pytest.raises(DlhpcError, match="ToyJobEnvironment is not a dlhpc Backend descriptor"):
        BackendTable().get("env")
    monkeypatch.setattr(metadata, "entry_points", points("other", f"{__name__}:TOY"))
    with pytest.raises(DlhpcError, match="TOY is named 'toy', not 'other'"):
        BackendTable().get("other")
    monkeypatch.setattr(metadata, "entry_points", points("slurm", f"{__name__}:TOY"))
    with pytest.raises(DlhpcError, match="reuses the built-in backend name 'slurm'"):
        BackendTable().names()


def test_entry_points_are_scanned_only_when_a_name_is_not_built_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans: list[str] = []

    def entry_points(*, group: str) -> list[metadata.EntryPoint]:
        scans.append(group)
        return [
            metadata.EntryPoint("toy", f"{__name__}:TOY", group),
            metadata.EntryPoint("twice", "a:B", group),
            metadata.EntryPoint("twice", "c:D", group),
        ]

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    table = BackendTable()
    assert isinstance(table.get("local"), Backend) and scans == []
    with pytest.raises(DlhpcError, match=r"'twice' is registered more than once \(a:B, c:D\)"):
        table.get("toy")
    assert scans == [GROUP]


def test_a_site_naming_a_builtin_backend_reads_no_entry_points(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every command loads its site: a built-in backend's name costs no scan of the
    installed distributions; a name that is not built-in is looked for among them."""
    scans: list[str] = []

    def entry_points(*, group: str) -> list[metadata.EntryPoint]:
        scans.append(group)
        return [metadata.EntryPoint("toy", f"{__name__}:TOY", group)]

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    env = {"HOME": str(tmp_path), "PATH": str(tmp_path)}
    site_file = tmp_path / "s.yaml"
    site_file.write_text("name: s\nbackend: slurm\n")
    assert load_site(str(site_file), env, backends=BackendTable()).backend == "slurm"
    assert scans == []
    site_file.write_text("name: s\nbackend: toy\n")
    assert load_site(str(site_file), env, backends=BackendTable()).backend == "toy"
    assert scans == [GROUP]
    site_file.write_text("name: s\nbackend: toi\n")
    with pytest.raises(ConfigError, match="backend: must be one of auto, slurm, local, toy, got"):
        load_site(str(site_file), env, backends=BackendTable())


def test_the_environment_hook_adds_or_replaces_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLHPC_SCHEDULERS", f"toy={__name__}:TOY")
    assert BackendTable().get("toy") is TOY
    monkeypatch.setenv("DLHPC_SCHEDULERS", "toy")
    with pytest.raises(DlhpcError, match="not name=module:attribute"):
        BackendTable()


def test_slurm_request_check_refuses_a_percent_in_the_state_folder() -> None:
    assert state_dir_problem(Path("/home/a/.dlhpc")) is None
    assert "contains '%'" in (state_dir_problem(Path("/home/a%u/.dlhpc")) or "")
    assert BackendTable().get("local").request_problem(Path("/a%b")) is None
    assert "contains '%'" in (BackendTable().get("slurm").request_problem(Path("/a%b")) or "")


def test_looking_up_a_job_environment_stays_light() -> None:
    code = (
        "import sys\n"
        "from dlhpc.scheduler.plugins import BackendTable\n"
        "BackendTable().job_environment({'SLURM_JOB_ID': '1'})\n"
        "heavy = ('submitit', 'sqlalchemy', 'dlhpc.config', 'dlhpc.scheduler.base',"
        " 'dlhpc.scheduler.slurm.scheduler', 'dlhpc.scheduler.slurm.checks',"
        " 'dlhpc.scheduler.slurm.site', 'dlhpc.scheduler.local.scheduler')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_config_asks_its_caller_what_auto_means(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": str(tmp_path)}  # no site named, no sbatch
    with pytest.raises(ValueError, match="backend 'auto' needs the scheduler backends"):
        load_site(None, env)
    assert load_site(None, env, backends=BackendTable()).name == "local"
    toy = BackendTable().with_backend(
        Backend("toy", lambda root: LocalScheduler(root), auto_priority=100)
    )
    site = load_site(None, env, backends=toy)  # no toy.yaml: a built-in site of that name
    assert (site.name, site.backend) == ("toy", "toy")
    site_file = tmp_path / "s.yaml"
    site_file.write_text("name: s\nbackend: toy\n")
    assert load_site(str(site_file), env, backends=toy).backend == "toy"
    with pytest.raises(ConfigError, match="backend: must be one of auto, slurm, local, got 'toy'"):
        load_site(str(site_file), env, backends=BackendTable())
