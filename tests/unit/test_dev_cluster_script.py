"""scripts/dev-cluster's interface and generated configs, without root and without daemons.

The script is sourced (it runs nothing then) and only its config writer is called, into a
scratch state folder; the running clusters are the integration tests' business.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dev-cluster"
_OVERRIDES = ("DLHPC_DEV_CLUSTER_DIR", "DLHPC_DEV_CLUSTER_PORT_BASE", "DLHPC_DEV_CHROOT_CACHE")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OVERRIDES}
    return {**env, **extra}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=_env(), capture_output=True, text=True, check=False
    )


def _configs(tmp_path: Path, version: str, profile: str) -> dict[str, str]:
    """The files write_configs leaves in a scratch state folder for (version, profile)."""
    state = tmp_path / "state"
    code = (
        f'. "$1"; SLURM_VERSION={version}; PROFILE={profile}; configure; '
        'install -d -m 0700 "$STATE_DIR/mariadb"; write_configs'
    )
    subprocess.run(
        ["bash", "-c", code, "bash", str(SCRIPT)],
        env=_env(DLHPC_DEV_CLUSTER_DIR=str(state)),
        check=True,
        capture_output=True,
    )
    return {p.name: p.read_text() for p in state.iterdir() if p.is_file()}


@pytest.mark.parametrize(
    ("version", "profile", "folder", "chroot"),
    [
        ("22.05", "default", "/var/tmp/dlhpc-dev-cluster", None),
        ("22.05", "noacct", "/var/tmp/dlhpc-dev-cluster-22.05-noacct", None),
        ("24.11", "strict", "/var/tmp/dlhpc-dev-cluster-24.11-strict", "chroot-trixie"),
        ("26.05", "default", "/var/tmp/dlhpc-dev-cluster-26.05-default", "chroot-forky"),
    ],
)
def test_env_prints_the_clusters_exports(
    version: str, profile: str, folder: str, chroot: str | None
) -> None:
    out = _run("env", "--slurm", version, "--profile", profile)
    assert out.returncode == 0, out.stderr
    want = [
        f"export SLURM_CONF={folder}/slurm.conf",
        f"export DLHPC_DEV_SLURM={version}",
        f"export DLHPC_DEV_PROFILE={profile}",
    ]
    if chroot:
        want.append(f"export DLHPC_DEV_CHROOT=/var/cache/dlhpc-dev/{chroot}")
    assert out.stdout.splitlines() == want


def test_no_flags_mean_2205_default() -> None:
    assert _run("env").stdout == _run("env", "--slurm", "22.05", "--profile", "default").stdout


@pytest.mark.parametrize(
    "args",
    [
        ("env", "--slurm", "23.02"),
        ("env", "--profile", "lax"),
        ("up", "--user", "dlhpc-user"),
        ("env", "--slurm"),
        ("status", "extra"),
        ("exec", "--slurm", "24.11"),
        ("bogus",),
    ],
)
def test_bad_arguments_exit_2(args: tuple[str, ...]) -> None:
    assert _run(*args).returncode == 2


def test_original_cluster_config_has_no_new_lines(tmp_path: Path) -> None:
    files = _configs(tmp_path, "22.05", "default")
    conf = files["slurm.conf"]
    assert "SlurmctldPort=16817" in conf
    assert "NodeAddr=127.0.2.1 Port=16821" in conf and "NodeAddr=127.0.2.2 Port=16822" in conf
    assert "Gres=gpu:2 " in conf
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    for absent in ("FirstJobId", "ScronParameters", "AccountingStorageEnforce", "JobSubmit"):
        assert absent not in conf
    assert "cgroup.conf" not in files and "job_submit.lua" not in files
    assert "StoragePort=16806" in files["slurmdbd.conf"]


def test_strict_chroot_cluster_has_limits_typed_gpus_scrontab_and_cgroup_off(
    tmp_path: Path,
) -> None:
    files = _configs(tmp_path, "24.11", "strict")
    conf = files["slurm.conf"]
    assert "SlurmctldPort=17917" in conf  # 16800 + 1000 * 1 + 100 * 1 + 17
    assert "NodeAddr=127.0.6.1 Port=17921" in conf  # 127.0.(2 + 3 * 1 + 1).1
    assert "Gres=gpu:a100:2 " in conf and "Gres=gpu:v100:2 " in conf
    assert "AccountingStorageEnforce=associations,limits,qos" in conf
    assert "ScronParameters=enable" in conf
    assert "FirstJobId=400000" in conf
    assert "NodeName=node1 Name=gpu Type=a100 File=" in files["gres.conf"]
    assert "CgroupPlugin=disabled" in files["cgroup.conf"]
    # a site policy the no-requeue test asks for through the job's comment
    assert "JobSubmitPlugins=lua" in conf
    lua = files["job_submit.lua"]
    assert '"dlhpc-site-no-requeue"' in lua and "job_desc.requeue = 0" in lua


def test_noacct_cluster_has_no_accounting_and_no_slurmdbd_config(tmp_path: Path) -> None:
    files = _configs(tmp_path, "22.05", "noacct")
    conf = files["slurm.conf"]
    assert "AccountingStorageType=accounting_storage/none" in conf
    assert "JobAcctGatherType=jobacct_gather/none" in conf
    assert "AccountingStoragePort" not in conf
    assert "ScronParameters" not in conf  # Debian 12's 22.05 ships no scrontab command
    assert "slurmdbd.conf" not in files
