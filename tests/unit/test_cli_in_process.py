"""The cluster tests' way of running ``dlhpc`` in their own process
(tests/integration/_invoke.py) gives what a ``python -m dlhpc`` process gives."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import warnings
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from tests.integration import _invoke
from tests.integration._invoke import run_in_process, run_process


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "DLHPC_HOME": str(home), "DLHPC_SITE": "local"}


def test_a_call_in_process_prints_and_exits_as_the_command_in_its_own_process(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "missing.yaml")
    calls = [("status", "--json"), ("status", "99"), ("status", "--nope"), ("launch", missing)]
    for args in calls:
        there = run_process(args, _env(tmp_path / "there"))
        here = run_in_process(args, _env(tmp_path / "here"))
        assert (here.returncode, here.stdout, here.stderr) == (
            there.returncode,
            there.stdout,
            there.stderr,
        ), args
        assert here.args == there.args == _invoke.argv(args)


def test_a_call_sees_exactly_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variable of this process that ``env`` lacks is unset during the call, and each
    call's DLHPC_HOME is its own; the process's environment is back afterwards."""
    monkeypatch.setenv("DLHPC_SITE", "no-such-site")
    env = {k: v for k, v in _env(tmp_path / "a").items() if k != "DLHPC_SITE"}
    assert run_in_process(("status", "--json"), env).returncode == 0
    assert os.environ["DLHPC_SITE"] == "no-such-site"
    refused = run_in_process(("status",), {**env, "DLHPC_SITE": "no-such-site"})
    assert refused.returncode == 2 and "no-such-site" in refused.stderr
    run_in_process(("status",), _env(tmp_path / "b"))
    assert (tmp_path / "a" / "dlhpc.db").exists() and (tmp_path / "b" / "dlhpc.db").exists()


def test_what_would_end_this_process_is_refused(tmp_path: Path) -> None:
    env = _env(tmp_path)
    with pytest.raises(ValueError, match="DLHPC_FAILPOINTS"):
        run_in_process(("tick",), {**env, "DLHPC_FAILPOINTS": "tick.after_ingest"})
    with pytest.raises(ValueError, match="--run"):
        run_in_process(("tensorboard", "--run"), env)


def test_a_call_past_the_timeout_raises_timeout_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_invoke, "TIMEOUT_S", 1)
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_process(("tick", "--loop", "30"), _env(tmp_path))


def test_warnings_and_log_records_reach_the_calls_stderr() -> None:
    """As in a fresh interpreter with no logging set up: a UserWarning and a WARNING
    record are printed, a DeprecationWarning and an INFO record are not."""
    err = io.StringIO()
    with redirect_stderr(err), _invoke._fresh_warnings(), _invoke._last_resort_logging():
        warnings.warn("careful", UserWarning, stacklevel=1)
        warnings.warn("old", DeprecationWarning, stacklevel=1)
        logging.getLogger("dlhpc.test").warning("the queue is slow")
        logging.getLogger("dlhpc.test").info("detail")
    lines = err.getvalue().splitlines()
    assert any(line.endswith("UserWarning: careful") for line in lines), lines
    assert "the queue is slow" in lines and "detail" not in lines
    assert not any("old" in line for line in lines), lines
