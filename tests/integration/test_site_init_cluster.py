"""``dlhpc site init`` on the real dev cluster, in every Slurm version and profile: the
site file it writes passes ``dlhpc doctor`` unchanged, and says what each profile
offers (strict: typed GPUs of two kinds, a required account, QOS limits; noacct: no
accounting, so no sacctmgr; default: untyped GPUs, the user's account)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.integration.conftest import Cli, DevCluster

pytestmark = pytest.mark.cluster


@pytest.mark.smoke
@pytest.mark.every_part  # what it reads differs by version (scrontab) and profile
def test_site_init_writes_a_site_that_doctor_passes(
    cli: Cli, dev_cluster: DevCluster, tmp_path: Path
) -> None:
    home, scratch = tmp_path / "user-home", tmp_path / "scratch"
    home.mkdir()
    scratch.mkdir()
    out = cli("site", "init", "probe", HOME=str(home), SCRATCH=str(scratch)).stdout
    site_file = home / ".config" / "dlhpc" / "sites" / "probe.yaml"
    text = site_file.read_text()
    assert f"wrote {site_file} (2 partition(s))" in out, out

    # without $SCRATCH: the file holds its value
    doctor = json.loads(cli("doctor", "--site", "probe", "--json", HOME=str(home)).stdout)
    checks = {c["name"]: c for c in doctor["checks"]}
    assert doctor["site"] == "probe"
    assert [c for c in checks.values() if c["status"] == "fail"] == []
    assert checks["site partitions"]["status"] == "ok"
    assert checks["checkpoint folder writable"]["detail"] == str(scratch / "dlhpc")
    assert 'partition: "debug"' in text and "    preemptible: true" in text

    if dev_cluster.profile == "strict":
        assert 'account: "dlhpc-lab"' in text and "jobs need an association" in text
        assert "MaxSubmitJobs 8, MaxJobs 4, MaxWall 02:00:00" in text
        assert text.count("# EDIT: gpu_type: the nodes have a100, v100") == 2
        assert checks["site account and QOS"] == {
            "name": "site account and QOS",
            "status": "ok",
            "detail": "dlhpc-lab / -",
        }
    elif dev_cluster.profile == "noacct":
        assert "No accounting: AccountingStorageType=" in text
        assert re.search(r"^account:", text, re.MULTILINE) is None
        assert "site account and QOS" not in checks
    else:
        assert re.search(r'^account: "[a-z0-9_.-]+"', text, re.MULTILINE), text
        assert checks["site account and QOS"]["status"] == "ok"
        assert "untyped GPUs" in text

    again = cli("site", "init", "probe", check=False, HOME=str(home))
    assert again.returncode == 2 and "exists; not replaced" in again.stderr
    assert site_file.read_text() == text
