"""The ``dlhpc`` group loads each command's module on first use (``LAZY_COMMANDS``)."""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from dlhpc.cli.main import GC_THRESHOLD, LAZY_COMMANDS, cli

_MODULES = sorted({module for module, _ in LAZY_COMMANDS.values()})


def test_every_command_is_registered_with_its_own_short_help() -> None:
    for module in _MODULES:
        for command in importlib.import_module(f"dlhpc.cli.{module}").COMMANDS:
            assert command.name in LAZY_COMMANDS, command.name
            where, short = LAZY_COMMANDS[command.name]
            assert where == module, command.name
            assert short == command.get_short_help_str(limit=10_000), command.name


def test_help_lists_every_command_as_the_commands_themselves_would() -> None:
    lazy = CliRunner().invoke(cli, ["--help"], terminal_width=70)
    assert lazy.exit_code == 0, lazy.output
    listed = lazy.output.split("Commands:", 1)[1]
    for name in LAZY_COMMANDS:  # loaded now: click's own format_commands lists the same
        cli.get_command(None, name)  # type: ignore[arg-type]
        short = cli.commands[name].get_short_help_str(limit=70 - 6 - 11)
        assert f"  {name}" in listed and short in listed, name


def test_help_and_status_import_no_other_command() -> None:
    code = (
        "import json, sys\n"
        "from dlhpc.cli.main import cli\n"
        "try:\n"
        "    cli(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "first = sorted(m for m in sys.modules if m.startswith('dlhpc.cli.'))\n"
        "heavy = [m for m in ('sqlalchemy', 'rich.table') if m in sys.modules]\n"
        "cli.get_command(None, 'status')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('dlhpc.orchestrator',"
        " 'dlhpc.search', 'dlhpc.scheduler', 'dlhpc.simulate', 'dlhpc.report.build',"
        " 'dlhpc._entrypoints')))\n"
        "print(json.dumps([first, heavy, loaded]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    first, heavy, loaded = json.loads(out.splitlines()[-1])
    assert first == ["dlhpc.cli.main"]
    assert heavy == []
    assert loaded == []


def test_tick_imports_neither_rich_nor_the_launch_and_view_code() -> None:
    code = (
        "import json, sys\n"
        "from dlhpc.cli.main import cli\n"
        "cli.get_command(None, 'tick')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('rich',"
        " 'dlhpc.cli.')))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out.splitlines()[-1])
    assert "dlhpc.cli._tick" in loaded
    assert not [m for m in loaded if m.startswith("rich")], loaded
    assert not {"dlhpc.cli._run", "dlhpc.cli._views", "dlhpc.cli._console"} & set(loaded)


def test_a_command_runs_with_the_raised_gc_thresholds_and_restores_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[int, int, int]] = []

    @click.command("probe")
    def probe() -> None:
        seen.append(gc.get_threshold())

    monkeypatch.setitem(cli.commands, "probe", probe)
    before = gc.get_threshold()
    result = CliRunner().invoke(cli, ["probe"])
    assert result.exit_code == 0, result.output
    assert seen == [GC_THRESHOLD] and before != GC_THRESHOLD
    assert gc.get_threshold() == before
