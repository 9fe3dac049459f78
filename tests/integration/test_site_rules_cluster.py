"""Site rules on the real dev cluster: partition, GPU type and account
checked against Slurm itself at launch; typed GPU requests rendered and run.

What the cluster offers depends on its profile (``$DLHPC_DEV_PROFILE``, absent =
default; see scripts/dev-cluster): ``default`` and ``noacct`` have untyped gres
(``gpu:2`` per node), ``strict`` has ``gpu:a100:2`` on node1 and ``gpu:v100:2`` on
node2; ``noacct`` has no slurmdbd, so ``sacctmgr`` fails. Every test asserts what
its profile must do (a typed request runs where the gres are typed and is refused,
listing the valid types, where they are not), so none skips on a running cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import Cli

pytestmark = [pytest.mark.cluster, pytest.mark.profile("default", "strict", "noacct")]

PROFILE = os.environ.get("DLHPC_DEV_PROFILE", "default")
#: The GPU types of each profile's partitions (both nodes are in debug and high).
TYPES = {"default": (), "noacct": (), "strict": ("a100", "v100")}

PROBE = """\
import json, os
import dlhpc

ctx = dlhpc.init()
keys = ("SLURM_JOB_NODELIST", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_NTASKS_PER_NODE")
if ctx.rank == 0:
    with open(os.environ["PROBE_OUT"], "w") as f:
        json.dump({k: os.environ.get(k) for k in keys}, f)
ctx.report(1, {"loss": 0.0})
ctx.close()
"""


def _types() -> tuple[str, ...]:
    if PROFILE not in TYPES:
        pytest.fail(f"unknown DLHPC_DEV_PROFILE {PROFILE!r}; this file knows {sorted(TYPES)}")
    return TYPES[PROFILE]


def _experiment(folder: Path, resources: str, name: str = "site rules") -> Path:
    """An experiment in ``folder``; ``resources`` lines start on line 4."""
    folder.mkdir(exist_ok=True)
    (folder / "probe.py").write_text(PROBE)
    exp = folder / "exp.yaml"
    exp.write_text(
        f"name: {json.dumps(name)}\nentrypoint: python probe.py\n"
        f"resources:\n{resources}  time: '00:10:00'\n"
        f"environment:\n  vars: {{PROBE_OUT: {json.dumps(str(folder / 'probe.json'))}}}\n"
    )
    return exp


def _submitted(cli: Cli, folder: Path) -> list[str]:
    """Jobs in the queue or accounting whose workdir is ``folder``, and any state written."""
    queued = subprocess.run(
        ["squeue", "-h", "-a", "--states=all", "-o", "%i %Z"],
        env=cli.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ln for ln in queued if str(folder) in ln] + [str(p) for p in cli.home.glob("*")]


def _refused(cli: Cli, tmp_path: Path, exp: Path, *args: str) -> str:
    proc = cli("launch", str(exp), *args, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert _submitted(cli, tmp_path) == []
    return proc.stderr


@pytest.mark.parametrize("dry_run", [False, True])
def test_an_unknown_partition_exits_2(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    exp = _experiment(tmp_path / "exp", "  partition: hihg\n  gpus_per_node: 1\n")
    err = _refused(cli, tmp_path, exp, "--site", "generic", *(["--dry-run"] * dry_run))
    assert err == (
        f"error: {exp}:4: resources.partition: partition 'hihg' does not exist on this Slurm "
        "cluster; did you mean 'high'? (valid: debug, high)\n"
    )


def test_an_unknown_gpu_type_exits_2_listing_the_valid_ones(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    types = _types()
    exp = _experiment(tmp_path / "exp", "  gpus_per_node: h200:2\n")
    valid = ", ".join(types) if types else "none; its GPUs are untyped: ask for gpus_per_node: 2"
    err = _refused(cli, tmp_path, exp)
    assert err.startswith(
        f"error: {exp}:4: resources.gpus_per_node: GPU type 'h200' is not on partition 'debug' "
        "of this Slurm cluster; "
    ), err
    assert err.endswith(f"(valid: {valid})\n"), err


@pytest.mark.parametrize("gpu_request", ["gpus-per-node", "gres"])
def test_a_typed_request_renders_and_runs_where_the_gres_are_typed(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu_request: str
) -> None:
    """``gpus_per_node: a100:2`` on the strict profile: rendered as the site says, run
    on node1 (the a100 node) with two tasks; elsewhere refused with the valid types."""
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "dev-typed.yaml"
    shipped = Path(__file__).resolve().parents[2] / "site-configs" / "dev-cluster.yaml"
    site.write_text(shipped.read_text() + f"\ngpu_request: {gpu_request}\n")
    exp = _experiment(tmp_path / "exp", "  gpus_per_node: a100:2\n", name="Typed GPUs: a100 × 2")
    if "a100" not in _types():
        err = _refused(cli, tmp_path, exp, "--site", str(site), "--dry-run")
        assert err == (
            f"error: {exp}:4: resources.gpus_per_node: GPU type 'a100' is not on partition "
            "'debug' of this Slurm cluster; (valid: none; its GPUs are untyped: ask for "
            "gpus_per_node: 2)\n"
        )
        return
    dry = cli("launch", str(exp), "--site", str(site), "--dry-run")
    flag = "--gpus-per-node=a100:2" if gpu_request == "gpus-per-node" else "--gres=gpu:a100:2"
    assert f"#SBATCH {flag}\n" in dry.stdout and "#SBATCH --ntasks-per-node=2\n" in dry.stdout
    exp_id = cli.json("launch", str(exp), "--site", str(site))["experiment_id"]
    done = cli.tick_until(exp_id, lambda e: e["state"] in ("COMPLETED", "FAILED", "KILLED"))
    assert done["state"] == "COMPLETED", done
    assert done["name"] == "Typed GPUs: a100 × 2"
    scripts = [p.read_text() for p in cli.home.rglob("*_submission.sh")]
    assert scripts and all(f"#SBATCH {flag}\n" in s for s in scripts), scripts
    seen = json.loads((tmp_path / "exp" / "probe.json").read_text())
    assert seen["SLURM_JOB_NODELIST"] == "node1", seen  # the a100 node, never v100's node2
    assert seen["SLURM_NTASKS_PER_NODE"] == "2", seen


def test_an_unknown_account_exits_2_or_warns_without_accounting(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    exp = _experiment(tmp_path / "exp", "  account: no-such-account\n")
    if PROFILE == "noacct":
        proc = cli("launch", str(exp), "--dry-run")
        assert proc.stderr.startswith(
            "warning: account and QOS not checked against Slurm: sacctmgr failed"
        ), proc.stderr
        assert "#SBATCH --account=no-such-account\n" in proc.stdout
        assert _submitted(cli, tmp_path) == []
        return
    err = _refused(cli, tmp_path, exp)
    assert err.startswith(
        f"error: {exp}:4: resources.account: account 'no-such-account' is not one of your "
        "Slurm associations; "
    ), err
    assert ("dlhpc-lab" if PROFILE == "strict" else "(valid: ") in err, err
