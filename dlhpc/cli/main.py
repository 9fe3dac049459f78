"""The ``dlhpc`` command: a click group whose errors are one line and an exit code.

Exit codes: 0 ok, 2 bad input (config errors, unknown ids, bad flags),
1 runtime failure with a one-line cause. ``--debug`` shows tracebacks.
The mapping lives in the group itself, so click's ``CliRunner`` sees the same
exit codes as a shell does.
"""

from __future__ import annotations

import gc
import importlib
import traceback
from typing import Any

import click

from dlhpc._perms import apply_umask
from dlhpc.config import PRIVATE_UMASK
from dlhpc.errors import DlhpcError

__all__ = ["GC_THRESHOLD", "LAZY_COMMANDS", "cli", "main"]

# The cyclic GC's thresholds while a command runs. A command allocates a few hundred
# thousand objects that live to its end (imported modules, rows); at Python's default
# (700, 10, 10) the collector runs often and finds nothing, which a short-lived
# `dlhpc status` or `dlhpc tick` pays for. Garbage cycles are still collected, only later.
GC_THRESHOLD = (100_000, 20, 100)

# Command name -> (module under dlhpc.cli holding it in its COMMANDS, its short help).
# A command's module (and what it imports: the orchestrator, searchers, report HTML...)
# loads only when that command runs, so `dlhpc status` does not pay for `dlhpc launch`.
# The short help lists the commands in `dlhpc --help` without importing them; it is
# each command's own (a unit test holds them equal).
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "checkpoints": (
        "_checkpoints",
        "List EXPERIMENT_ID's checkpoints: size, metric, and why each is kept.",
    ),
    "convert": (
        "_convert",
        "Translate another tool's experiment config into a dlhpc experiment file.",
    ),
    "cron": (
        "_cron",
        "Print the crontab line for this user and site (install it with `crontab -e`).",
    ),
    "db": ("_doctor", "State database upkeep."),
    "diff": (
        "_repro",
        "The differences between the records of TRIAL_A and TRIAL_B: code, config,"
        " hyperparameters, seed, packages, modules, nodes, CPU, GPU/driver, env, data.",
    ),
    "digest": (
        "_cron",
        "What is new since the last digest to the same place: finished experiments, failed"
        " trials, idle GPUs (each idle spell once); a first digest looks back 24 hours.",
    ),
    "doctor": (
        "_doctor",
        "Check that Slurm, accounting, partitions and folders work for this site.",
    ),
    "example": (
        "_example",
        "Write example NAME with its experiment files into FOLDER (default: ./NAME), a new"
        " or empty folder; --list names the examples.",
    ),
    "export": (
        "_checkpoints",
        "Export TRIAL_ID into FOLDER: weights, config, metrics, reproducibility record.",
    ),
    "gc": (
        "_checkpoints",
        "Apply the checkpoint keep policy to EXPERIMENT_ID (default: every experiment).",
    ),
    "kill": (
        "_run",
        "Kill experiment IDENT (or trial IDENT with -t): cancel its jobs, mark it KILLED.",
    ),
    "launch": ("_run", "Launch EXPERIMENT (a YAML file) as Slurm job arrays."),
    "logs": ("_inspect", "Print the log of TRIAL_ID's latest attempt."),
    "model": (
        "_model",
        "The model registry: register a trial's checkpoint as a model version, list, show"
        " and export versions.",
    ),
    "note": (
        "_annotate",
        "Append a note (TEXT) to EXPERIMENT_ID, or to its trial with -t TRIAL_ID.",
    ),
    "pin": ("_checkpoints", "Protect CHECKPOINT_ID from the GC (until unpinned)."),
    "report": (
        "_report",
        "Write EXPERIMENT_ID's report as one self-contained HTML file, or with --all every"
        " experiment's page and an index into --out-dir.",
    ),
    "reproduce": (
        "_repro",
        "Run TRIAL_ID again as a new experiment: its code snapshot, config, hyperparameters"
        " and seed.",
    ),
    "simulate": (
        "_simulate",
        "Simulate EXPERIMENT (a YAML file) with its searcher and alternatives on a simulated"
        " cluster: expected GPU-hours, wall time and the chance of finding the best"
        " configuration.",
    ),
    "site": ("_site", "Site files: describe this cluster for dlhpc."),
    "status": (
        "_inspect",
        "Experiments (newest first) and the newest one's trials, or EXPERIMENT_ID's trials.",
    ),
    "tag": (
        "_annotate",
        "Add (+TAG) or remove (-TAG) tags of EXPERIMENT_ID, or of its trials with -t TRIAL_ID.",
    ),
    "tensorboard": (
        "_tensorboard",
        "Write EXPERIMENT_ID's metrics (default: every experiment's) as TensorBoard event"
        " files, then print the tensorboard and ssh port-forward commands.",
    ),
    "tick": (
        "_tick",
        "One idempotent reconciliation pass over all active experiments (what cron runs).",
    ),
    "unpin": ("_checkpoints", "Let the keep policy decide about CHECKPOINT_ID again."),
}


class _Group(click.Group):
    """The ``dlhpc`` group: commands of :data:`LAZY_COMMANDS` load on first use, and
    errors become one line and an exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*LAZY_COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            module = importlib.import_module(f"dlhpc.cli.{LAZY_COMMANDS[cmd_name][0]}")
            for command in module.COMMANDS:
                self.commands.setdefault(command.name or "", command)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # as click.Group's, from the short help above: `dlhpc --help` imports no command
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows = []
        for name in names:
            cmd = self.commands.get(name) or click.Command(name, help=LAZY_COMMANDS[name][1])
            if not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        # Private until the command knows its site (`use_site` applies the site's umask);
        # the caller's umask is back afterwards (matters in-process, under CliRunner).
        umask = apply_umask(PRIVATE_UMASK)
        thresholds = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLD)
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
        finally:
            apply_umask(umask)
            gc.set_threshold(*thresholds)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dlhpc", prog_name="dlhpc")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Slurm-native, daemon-free orchestration of deep-learning experiments."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main() -> None:
    """Console entry point."""
    cli(prog_name="dlhpc")
