"""``dlhpc tick --loop``: every pass gets new schedulers, as a cron tick does, so a
scheduler that gave up on a command (sacct while slurmdbd was down) is not kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dlhpc.cli import _tick
from dlhpc.cli.main import cli


class _Stop(BaseException):  # not an Exception: the CLI reports those
    pass


def test_each_pass_of_a_loop_builds_its_own_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools: list[object] = []
    real = _tick.pool_for

    def counting(store: Any) -> Any:
        pools.append(real(store))
        return pools[-1]

    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise _Stop

    monkeypatch.setattr(_tick, "pool_for", counting)
    monkeypatch.setattr(_tick.time, "sleep", sleep)
    monkeypatch.setenv("DLHPC_HOME", str(tmp_path / "home"))
    with pytest.raises(_Stop):
        CliRunner().invoke(cli, ["tick", "--site", "local", "--loop", "5", "-q"])
    assert sleeps == [5.0, 5.0]
    assert len(pools) == 2 and pools[0] is not pools[1]
