"""Running the ``dlhpc`` command for the cluster tests: in this process through click's
``CliRunner`` (no interpreter start-up and imports per command), or as a separate
``python -m dlhpc`` process where a test needs one (a failpoint's SIGKILL).

In this process a call sees what the subprocess would see: ``os.environ`` is exactly
``env`` while it runs; stdout and stderr are the command's own; Python's warnings and
logging records reach its stderr as in a fresh interpreter with no logging set up; an
uncaught exception exits 1 with its traceback on stderr; and a call longer than
:data:`TIMEOUT_S` raises :class:`subprocess.TimeoutExpired`. Both return a
:class:`subprocess.CompletedProcess` whose ``args`` is the subprocess's argv.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TextIO

from click.testing import CliRunner

from dlhpc.cli.main import cli
from tests._alarm import time_bound

__all__ = [
    "PROCESS_ONLY_ENV",
    "PROCESS_ONLY_FLAGS",
    "TIMEOUT_S",
    "argv",
    "run_in_process",
    "run_process",
]

TIMEOUT_S = 300
# What a call in this process must not do, as it would end or replace the test run:
# a failpoint SIGKILLs the process that reaches it; `tensorboard --run` execs TensorBoard.
PROCESS_ONLY_ENV = ("DLHPC_FAILPOINTS",)
PROCESS_ONLY_FLAGS = {"tensorboard": ("--run",)}
# The warning categories a fresh interpreter ignores (outside __main__).
_IGNORED_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def argv(args: Sequence[str]) -> list[str]:
    """The command line of ``dlhpc ARGS`` as a separate process."""
    return [sys.executable, "-m", "dlhpc", *args]


def run_process(args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``dlhpc ARGS`` as a separate process with environment ``env``."""
    return subprocess.run(
        argv(args), env=dict(env), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def run_in_process(args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``dlhpc ARGS`` in this process, as :func:`run_process` would run it (module
    docstring). A :data:`PROCESS_ONLY_ENV` variable in ``env`` or a
    :data:`PROCESS_ONLY_FLAGS` flag is a ValueError."""
    command = next((a for a in args if not a.startswith("-")), "")
    named = [key for key in PROCESS_ONLY_ENV if key in env]
    named += [flag for flag in PROCESS_ONLY_FLAGS.get(command, ()) if flag in args]
    if named:
        raise ValueError(f"{', '.join(named)} in a call in this process: use run_process")
    overrides: dict[str, str | None] = {key: None for key in os.environ if key not in env}
    overrides.update(env)
    with _deadline(args), _fresh_warnings(), _last_resort_logging():
        result = CliRunner().invoke(cli, list(args), env=overrides, prog_name="dlhpc")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(argv(args), result.exit_code, result.stdout, stderr)


class _Overran(BaseException):
    """Raised by the alarm in the command's frame. A BaseException, so that neither the
    command's error handling nor CliRunner turns it into an exit code."""


@contextmanager
def _deadline(args: Sequence[str]) -> Iterator[None]:
    """Raise :class:`subprocess.TimeoutExpired` when the block runs past TIMEOUT_S."""
    try:
        with time_bound(TIMEOUT_S, _Overran):
            yield
    except _Overran:
        raise subprocess.TimeoutExpired(argv(args), TIMEOUT_S) from None


def _to_stderr(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextmanager
def _fresh_warnings() -> Iterator[None]:
    """A fresh interpreter's warning filters, shown on ``sys.stderr`` (the command's)
    instead of pytest's record of the test's warnings."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for category in _IGNORED_WARNINGS:
            warnings.simplefilter("ignore", category)
        warnings.showwarning = _to_stderr
        yield


@contextmanager
def _last_resort_logging() -> Iterator[None]:
    """Log records of WARNING and above on ``sys.stderr`` (the command's), as in a
    process that set no logging up (``logging.lastResort``); pytest's capture
    handlers on the root logger, which keep the records from it, stay."""
    handler = logging.lastResort
    root = logging.getLogger()
    if handler is None or handler in root.handlers:
        yield
        return
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
