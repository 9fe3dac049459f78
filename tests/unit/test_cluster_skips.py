"""Which cluster-test skips are allowed: the hooks of tests/conftest.py and
tests/integration/conftest.py, run by an inner pytest over a small test file.

Where a cluster is required (DLHPC_REQUIRE_CLUSTER), a test that does not apply in
the dev cluster's profile (``needs``, ``profile`` markers) skips with the profile in
the reason; a missing cluster and any skip of a ``smoke`` test are failures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """\
from tests.conftest import pytest_runtest_makereport  # noqa: F401
from tests.integration.conftest import dev_cluster, dev_profile, dev_slurm  # noqa: F401
from tests.integration.conftest import pytest_runtest_setup  # noqa: F401
"""

TESTS = """\
import pytest

pytestmark = pytest.mark.cluster

@pytest.mark.needs("accounting")
def test_needs_accounting(): pass

@pytest.mark.needs("root")
def test_needs_root(): pass

@pytest.mark.smoke
@pytest.mark.needs("accounting")
def test_smoke_needs_accounting(): pass

@pytest.mark.smoke
def test_smoke(dev_slurm, dev_profile):
    print("WHERE", dev_slurm, dev_profile)

def test_missing_cluster():
    pytest.skip("dev cluster not running")

@pytest.mark.profile("strict", "noacct")
def test_strict_or_noacct(): pass
"""


def _outcomes(tmp_path: Path, **env: str) -> dict[str, str]:
    """Run the inner suite under ``env``; test name -> passed, skipped or failed (a
    failure in setup, where these hooks act, is junit's ``error``: failed here too)."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(TESTS)
    xml = tmp_path / "out.xml"
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"CI", "DLHPC_REQUIRE_CLUSTER", "DLHPC_DEV_SLURM", "DLHPC_DEV_PROFILE"}
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
        + ["-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        env={**base, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert xml.exists(), proc.stdout + proc.stderr
    out: dict[str, str] = {}
    for case in ET.parse(xml).iter("testcase"):
        kinds = [c.tag for c in case if c.tag in {"skipped", "failure", "error"}]
        out[case.attrib["name"]] = (
            ("skipped" if kinds == ["skipped"] else "failed") if kinds else "passed"
        )
        for child in case:
            if child.tag == "skipped":
                out[case.attrib["name"] + ":why"] = child.attrib.get("message", "")
    return out


def test_required_noacct_allows_profile_skips_only(tmp_path: Path) -> None:
    got = _outcomes(tmp_path, DLHPC_REQUIRE_CLUSTER="1", DLHPC_DEV_PROFILE="noacct")
    assert got["test_needs_accounting"] == "skipped"
    assert "profile noacct" in got["test_needs_accounting:why"]
    assert got["test_strict_or_noacct"] == "passed"
    assert got["test_smoke"] == "passed"
    assert got["test_smoke_needs_accounting"] == "failed"  # the smoke set never skips
    assert got["test_missing_cluster"] == "failed"  # a missing cluster is no profile skip


def test_required_default_profile_runs_what_applies(tmp_path: Path) -> None:
    got = _outcomes(tmp_path, DLHPC_REQUIRE_CLUSTER="1")
    assert got["test_needs_accounting"] == got["test_smoke_needs_accounting"] == "passed"
    assert got["test_strict_or_noacct"] == "skipped"
    assert "only in the strict, noacct profile" in got["test_strict_or_noacct:why"]
    assert got["test_needs_root"] == ("passed" if os.geteuid() == 0 else "skipped")
    assert got["test_missing_cluster"] == "failed"


def test_without_a_required_cluster_every_skip_stays_a_skip(tmp_path: Path) -> None:
    got = _outcomes(tmp_path, DLHPC_DEV_PROFILE="noacct")
    assert got["test_smoke_needs_accounting"] == got["test_missing_cluster"] == "skipped"


@pytest.mark.parametrize(
    ("var", "value"), [("DLHPC_DEV_SLURM", "23.02"), ("DLHPC_DEV_PROFILE", "lax")]
)
def test_a_cluster_outside_the_matrix_is_an_error_not_a_skip(
    tmp_path: Path, var: str, value: str
) -> None:
    got = _outcomes(tmp_path, **{var: value})
    assert got["test_smoke"] == "failed", got
