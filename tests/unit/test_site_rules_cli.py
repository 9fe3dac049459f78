"""``dlhpc launch`` (and ``--dry-run``) against a fake Slurm cluster: an unknown
account, QOS, partition or GPU type exits 2 with file:line:field and the valid
values, and nothing is submitted; without accounting the account check is
skipped with a warning line. Slurm is scripts on ``$PATH`` that log their calls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from dlhpc.cli.main import cli

SINFO = "debug*|gpu:a100:2(S:0-1)\ndebug*|gpu:v100:2\nhigh|gpu:a100:2\ncpu|(null)\n"
SACCTMGR_OK = "printf 'dlhpc-lab|dlhpc-qos,normal\\n'"
SACCTMGR_DOWN = (
    "echo 'sacctmgr: error: Problem talking to the database: Connection refused' >&2; exit 1"
)


@pytest.fixture
def slurm(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake sinfo/sacctmgr/sbatch/squeue/sacct/scontrol first on $PATH; returns the log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    answers = {"sinfo": f"printf '{SINFO}'", "sacctmgr": SACCTMGR_OK}
    for name in ("sinfo", "sacctmgr", "sbatch", "squeue", "sacct", "scontrol", "scancel"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} >> '{log}'\n{answers.get(name, 'exit 1')}\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("DLHPC_SITE", raising=False)
    monkeypatch.delenv("DLHPC_SITE_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    return log


def _experiment(tmp_path: Path, resources: str) -> Path:
    (tmp_path / "train.py").write_text("")
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"name: site rules\nentrypoint: python train.py\nsite: generic\nresources:\n{resources}"
    )
    return exp


def _launch(exp: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["launch", str(exp), *extra])
    return result.exit_code, result.output


def _calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            "  gpus_per_node: h100:2\n",
            "5: resources.gpus_per_node: GPU type 'h100' is not on partition 'debug' of this "
            "Slurm cluster; did you mean 'v100'? (valid: a100, v100)",
        ),
        (
            "  partition: cpu\n  gpus_per_node: a100:1\n",
            "6: resources.gpus_per_node: GPU type 'a100' is not on partition 'cpu' of this Slurm "
            "cluster; (valid: none; its GPUs are untyped: ask for gpus_per_node: 1)",
        ),
        (
            "  partition: gpu\n",
            "5: resources.partition: partition 'gpu' does not exist on this Slurm cluster; "
            "(valid: cpu, debug, high)",
        ),
        (
            "  account: dlhpc-lib\n",
            "5: resources.account: account 'dlhpc-lib' is not one of your Slurm associations; "
            "did you mean 'dlhpc-lab'? (valid: dlhpc-lab)",
        ),
        (
            "  qos: dlhpc-qso\n",
            "5: resources.qos: QOS 'dlhpc-qso' is not allowed for your associations; "
            "did you mean 'dlhpc-qos'? (valid: dlhpc-qos, normal)",
        ),
    ],
)
def test_unknown_values_exit_2_and_nothing_is_submitted(
    tmp_path: Path, home: Path, slurm: Path, resources: str, message: str, dry_run: bool
) -> None:
    exp = _experiment(tmp_path, resources)
    code, out = _launch(exp, *(["--dry-run"] if dry_run else []))
    assert code == 2, out
    assert out == f"error: {exp}:{message}\n"
    assert not home.exists()
    assert set(_calls(slurm)) <= {"sinfo", "sacctmgr"}
    assert _calls(slurm).count("sinfo") <= 1 and _calls(slurm).count("sacctmgr") <= 1


def test_valid_values_render_the_typed_request(tmp_path: Path, home: Path, slurm: Path) -> None:
    exp = _experiment(tmp_path, "  gpus_per_node: v100:2\n  account: dlhpc-lab\n  qos: normal\n")
    code, out = _launch(exp, "--dry-run")
    assert code == 0, out
    assert "#SBATCH --gpus-per-node=v100:2\n" in out and "#SBATCH --ntasks-per-node=2\n" in out
    assert _calls(slurm) == ["sinfo", "sacctmgr", "scontrol"]  # scontrol: MaxArraySize
    assert not home.exists()


def test_without_accounting_a_warning_line_and_the_partition_still_checked(
    tmp_path: Path, home: Path, slurm: Path
) -> None:
    sacctmgr = slurm.parent / "bin" / "sacctmgr"
    sacctmgr.write_text(f"#!/bin/sh\necho sacctmgr >> '{slurm}'\n{SACCTMGR_DOWN}\n")
    exp = _experiment(tmp_path, "  account: anything\n  gpus_per_node: a100:2\n")
    code, out = _launch(exp, "--dry-run")
    assert code == 0, out
    warning = (
        "warning: account and QOS not checked against Slurm: sacctmgr failed (exit 1): "
        "sacctmgr: error: Problem talking to the database: Connection refused\n"
    )
    assert out.startswith(warning) and "#SBATCH --account=anything\n" in out
    exp = _experiment(tmp_path, "  account: anything\n  partition: nope\n")
    code, out = _launch(exp)
    assert code == 2 and out.startswith(warning), out
    assert "resources.partition: partition 'nope' does not exist" in out
    assert "sbatch" not in _calls(slurm) and not home.exists()


def test_no_account_or_qos_asks_no_sacctmgr(tmp_path: Path, home: Path, slurm: Path) -> None:
    code, out = _launch(_experiment(tmp_path, "  gpus_per_node: 1\n"), "--dry-run")
    assert code == 0 and "#SBATCH --gpus-per-node=1\n" in out, out
    assert _calls(slurm) == ["scontrol"]  # nothing checked: no partition, type or account
