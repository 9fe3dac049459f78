"""Shared fixtures. Cluster tests live in tests/integration and use the dev cluster."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private $DLHPC_HOME for the test."""
    h = tmp_path / "dlhpc-home"
    monkeypatch.setenv("DLHPC_HOME", str(h))
    return h


#: Signals the harness takes over in-process (a stop ignores them while it exits).
_TRIAL_SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    """Each test leaves the stop signals' handlers as it found them: a handler or an
    ignore left behind would be inherited by every process a later test starts."""
    saved = {sig: signal.getsignal(sig) for sig in _TRIAL_SIGNALS}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


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


@pytest.fixture
def fewer() -> bool:
    """True under DLHPC_TEST_FEWER=1 (``scripts/test-pythons`` sets it: the Pythons besides
    the whole suite's): a test that runs one check at a scale, or on many examples, runs a
    smaller scale or fewer of them, and says so."""
    return os.environ.get("DLHPC_TEST_FEWER") == "1"


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def cluster_required() -> bool:
    """In CI (or when scripts/test set DLHPC_REQUIRE_CLUSTER) a cluster test may not skip."""
    return in_ci() or bool(os.environ.get("DLHPC_REQUIRE_CLUSTER"))


def browser_required() -> bool:
    """In CI (or when scripts/test set DLHPC_REQUIRE_BROWSER) a browser test may not skip."""
    return in_ci() or bool(os.environ.get("DLHPC_REQUIRE_BROWSER"))


#: Set by tests/integration/conftest.py on an item that does not apply where the tests run
#: (a ``needs``/``profile`` marker the dev cluster's profile lacks): the skip's reason.
PROFILE_SKIP = pytest.StashKey[str]()


def forbidden_cluster_skip(item: pytest.Item) -> str | None:
    """Why a skip of ``item`` must count as a failure, or None when it may skip.

    Under CI or DLHPC_REQUIRE_CLUSTER a cluster test may skip only because it does not
    apply in the dev cluster's profile (PROFILE_SKIP), and a ``smoke`` test never may."""
    if not cluster_required():
        return None
    if item.get_closest_marker("smoke"):
        return "smoke test skipped while a cluster is required (the smoke set never skips)"
    if item.get_closest_marker("cluster") and item.stash.get(PROFILE_SKIP, None) is None:
        return "cluster test skipped while a cluster is required"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    why = forbidden_cluster_skip(item) if report.skipped else None
    if why is not None:
        report.outcome = "failed"
        report.longrepr = f"{why}: {report.longrepr}"
    elif report.skipped and browser_required() and item.get_closest_marker("browser"):
        report.outcome = "failed"
        report.longrepr = f"browser test skipped while chromium is required: {report.longrepr}"
    return None
