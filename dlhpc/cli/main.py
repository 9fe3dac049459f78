"""The ``dlhpc`` command: a click group whose errors are one line and an exit code.

Exit codes: 0 ok, 2 bad input (config errors, unknown ids, bad flags),
1 runtime failure with a one-line cause. ``--debug`` shows tracebacks.
The mapping lives in the group itself, so click's ``CliRunner`` sees the same
exit codes as a shell does.
"""

from __future__ import annotations

import traceback
from typing import Any

import click

from dlhpc import __version__
from dlhpc.cli import _checkpoints, _cron, _doctor, _inspect, _run, _simulate
from dlhpc.cli import _report as _report_cmds
from dlhpc.cli import _repro as _repro_cmds
from dlhpc.errors import DlhpcError

__all__ = ["cli", "main"]


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DlhpcError as err:
            if (ctx.obj or {}).get("debug"):
                traceback.print_exc()
            for line in str(err).splitlines() or [type(err).__name__]:
                click.echo(f"error: {line}", err=True)
            ctx.exit(err.exit_code)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as err:  # a bug: one line unless debugging
            if (ctx.obj or {}).get("debug"):
                raise
            click.echo(
                f"error: internal error: {type(err).__name__}: {err} (rerun with --debug)", err=True
            )
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dlhpc")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Slurm-native, daemon-free orchestration of deep-learning experiments."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


for command in (
    *_run.COMMANDS,
    *_inspect.COMMANDS,
    *_doctor.COMMANDS,
    *_simulate.COMMANDS,
    *_checkpoints.COMMANDS,
    *_cron.COMMANDS,
    *_repro_cmds.COMMANDS,
    *_report_cmds.COMMANDS,
):
    cli.add_command(command)


def main() -> None:
    """Console entry point."""
    cli(prog_name="dlhpc")
