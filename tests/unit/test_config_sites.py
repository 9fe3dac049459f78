"""The shipped site files (site-configs/*.yaml) load cleanly and say what they promise."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlhpc.config import builtin_sites, list_sites
from tests._config import load_experiment, load_site

SHIPPED = sorted(builtin_sites().glob("*.yaml"))
REPO = Path(__file__).resolve().parents[2]
ENV = {"HOME": "/home/alice", "USER": "alice", "PATH": "/nonexistent"}


def test_the_required_site_files_are_shipped() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"dev-cluster", "generic", "local"} <= names
    assert len([n for n in names if n.startswith("template-")]) >= 2


def test_the_built_in_sites_are_the_checkouts_site_configs() -> None:
    # one source: the package's folder is a link to the top-level one, not a copy
    assert builtin_sites().resolve() == REPO / "site-configs"
    assert [p.name for p in SHIPPED] == sorted(p.name for p in (REPO / "site-configs").iterdir())


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_site_file_loads(path: Path) -> None:
    site = load_site(str(path), ENV)
    assert site.source == path
    assert load_site(path.stem, ENV) == site  # found by name on the search path
    assert list_sites(ENV)[path.stem] == path


def test_dev_cluster_matches_scripts_dev_cluster() -> None:
    site = load_site("dev-cluster", ENV)
    assert (site.backend, site.partition) == ("slurm", "debug")
    debug, high = site.partitions["debug"], site.partitions["high"]
    # untyped, as the default profile's gres (the strict profile's types differ per node)
    assert (debug.gpus_per_node, debug.gpu_type, debug.preemptible) == (2, None, True)
    assert (high.gpus_per_node, high.preemptible) == (2, False)
    assert site.state_dir == Path("/home/alice/.dlhpc")
    assert site.scratch == Path("/home/alice/.dlhpc/scratch")
    isolated = load_site("dev-cluster", {**ENV, "DLHPC_HOME": "/tmp/t"})
    assert (isolated.state_dir, isolated.scratch) == (Path("/tmp/t"), Path("/tmp/t/scratch"))


def test_generic_and_local_backends() -> None:
    assert load_site("generic", ENV).backend == "slurm"
    assert load_site("local", ENV).backend == "local"


def test_template_university_gpu_expands_user() -> None:
    site = load_site("template-university-gpu", ENV)
    assert site.scratch == Path("/scratch/alice/dlhpc")
    assert site.partitions["scavenger"].preemptible
    assert site.modules and site.account


def test_an_experiment_on_each_shipped_site(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: t\nentrypoint: python t.py\nresources: {time: '00:30:00'}\n")
    for path in SHIPPED:
        cfg = load_experiment(exp, site=path.stem, environ=ENV)
        assert cfg.site.source == path
