"""Broken config on the real dev cluster: an unknown partition or an impossible memory is
a config error.

The partition is checked against the site's list when it has one (dev-cluster),
then against the cluster's own (one ``sinfo`` at launch).
Either way: exit 2, the file:line of the ``partition`` field, the valid
partitions in the message, and nothing submitted or written.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import Cli

pytestmark = pytest.mark.cluster

HEAD = "name: part-check\nentrypoint: python train.py\n"


def _experiment(folder: Path, partition: str | None) -> Path:
    """An experiment in ``folder``; ``partition`` (when given) is on line 4."""
    folder.mkdir()
    (folder / "train.py").write_text("raise SystemExit(0)\n")
    exp = folder / "exp.yaml"
    exp.write_text(HEAD + (f"resources:\n  partition: {partition}\n" if partition else ""))
    return exp


def _jobs_from(cli: Cli, folder: Path) -> list[str]:
    """Queued or accounted jobs (this hour) whose script or workdir lies under ``folder``."""
    queued = subprocess.run(
        ["squeue", "-h", "-a", "--states=all", "-o", "%i %o %Z"],
        env=cli.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    accounted = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-a", "-S", "now-1hours", "-o", "JobID,WorkDir"],
        env=cli.env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    return [line for line in queued + accounted if str(folder) in line]


def _assert_nothing_happened(cli: Cli, folder: Path) -> None:
    assert not cli.home.exists(), sorted(cli.home.rglob("*"))  # no DB, no run folder
    assert _jobs_from(cli, folder) == []


@pytest.mark.parametrize(
    ("site", "message"),
    [
        (
            "dev-cluster",
            "partition 'nope' is not listed by site 'dev-cluster'; (valid: debug, high)",
        ),
        ("generic", "partition 'nope' does not exist on this Slurm cluster; (valid: debug, high)"),
    ],
)
def test_unknown_partition_exits_2_and_submits_nothing(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)  # submitted jobs would have it as their workdir
    exp = _experiment(tmp_path / "exp", "nope")
    proc = cli("launch", str(exp), "--site", site, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: {exp}:4: resources.partition: {message}\n"
    assert "Traceback" not in proc.stdout + proc.stderr
    _assert_nothing_happened(cli, tmp_path)


def test_the_sites_default_partition_is_checked_against_slurm(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "lab.yaml"
    site.write_text("name: lab\nbackend: slurm\npartition: debug,hihg\n")
    exp = _experiment(tmp_path / "exp", None)
    proc = cli("launch", str(exp), "--site", str(site), check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: {site}:3: partition: partition 'hihg' does not exist on this Slurm cluster; "
        "did you mean 'high'? (valid: debug, high)\n"
    )
    _assert_nothing_happened(cli, tmp_path)


def test_a_partition_the_site_lists_but_the_cluster_lacks_is_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "lab.yaml"
    site.write_text("name: lab\nbackend: slurm\npartitions:\n  gpu: {}\n  debug: {}\n")
    exp = _experiment(tmp_path / "exp", "gpu")
    proc = cli("launch", str(exp), "--site", str(site), check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: {exp}:4: resources.partition: partition 'gpu' does not exist on this Slurm "
        "cluster; (valid: debug, high)\n"
    )
    _assert_nothing_happened(cli, tmp_path)


def test_a_real_partition_passes_the_check(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same check accepts what the cluster has (a dry run: it submits nothing).
    monkeypatch.chdir(tmp_path)
    exp = _experiment(tmp_path / "exp", "high")
    proc = cli("launch", str(exp), "--site", "generic", "--dry-run")
    assert "#SBATCH --partition=high" in proc.stdout
    _assert_nothing_happened(cli, tmp_path)


def test_a_memory_over_the_bound_exits_2_and_submits_nothing(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    exp = _experiment(tmp_path / "exp", None)
    exp.write_text(HEAD + "resources:\n  mem: 999999999999T\n")
    proc = cli("launch", str(exp), "--site", "dev-cluster", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: {exp}:4: resources.mem: must be under 10^12 megabytes, got '999999999999T'\n"
    )
    _assert_nothing_happened(cli, tmp_path)
