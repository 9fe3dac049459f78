"""The CLI as tests drive it: run a command, read an experiment's status, tick it to its end."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from dlhpc.cli.main import cli

# Reports loss x/step at every step; a trial with x > 0.99 exits with code 3.
TRAIN = (
    "import sys, dlhpc\n"
    "ctx = dlhpc.init()\n"
    "for step in range(1, ctx.max_length + 1):\n"
    "    ctx.report(step, {'loss': ctx.hparams['x'] / step})\n"
    "ctx.close()\n"
    "sys.exit(3 if ctx.hparams['x'] > 0.99 else 0)\n"
)


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def status(exp_id: int) -> dict[str, Any]:
    res = run("status", str(exp_id), "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)["experiments"][0]  # type: ignore[no-any-return]


def local_exp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train: str = TRAIN) -> Path:
    """``tmp_path/exp`` with ``train`` as its ``train.py``, on the local site."""
    monkeypatch.setenv("DLHPC_SITE", "local")
    d = tmp_path / "exp"
    d.mkdir()
    (d / "train.py").write_text(train)
    return d


def tick() -> None:
    assert run("tick", "-q").exit_code == 0


def until_over(
    exp_id: int, step: Callable[[], object] = tick, timeout: float = 120, pause: float = 0.5
) -> dict[str, Any]:
    """Run ``step`` (a tick) until the experiment is no longer ACTIVE; its last status."""
    deadline = time.monotonic() + timeout
    while True:
        step()
        exp = status(exp_id)
        if exp["state"] != "ACTIVE":
            return exp
        assert time.monotonic() < deadline, exp
        time.sleep(pause)
