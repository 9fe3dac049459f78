"""Shared fixtures. Cluster tests live in tests/integration and use the dev cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $DLHPC_HOME for the test."""
    h = tmp_path / "dlhpc-home"
    monkeypatch.setenv("DLHPC_HOME", str(h))
    return h


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run the stress, fuzz and scale tests in their long form (see docs/BENCHMARKS.md)",
    )


@pytest.fixture
def long_run(request: pytest.FixtureRequest) -> bool:
    """True under ``pytest --long`` (or DLHPC_LONG=1): tests scale their work up."""
    return bool(request.config.getoption("--long")) or os.environ.get("DLHPC_LONG") == "1"


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def cluster_required() -> bool:
    """In CI (or when scripts/test set DLHPC_REQUIRE_CLUSTER) a cluster test may not skip."""
    return in_ci() or bool(os.environ.get("DLHPC_REQUIRE_CLUSTER"))


def browser_required() -> bool:
    """In CI (or when scripts/test set DLHPC_REQUIRE_BROWSER) a browser test may not skip."""
    return in_ci() or bool(os.environ.get("DLHPC_REQUIRE_BROWSER"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and cluster_required() and item.get_closest_marker("cluster"):
        report.outcome = "failed"
        report.longrepr = f"cluster test skipped while a cluster is required: {report.longrepr}"
    elif report.skipped and browser_required() and item.get_closest_marker("browser"):
        report.outcome = "failed"
        report.longrepr = f"browser test skipped while chromium is required: {report.longrepr}"
    return None
