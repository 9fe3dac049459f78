"""``dlhpc convert determined EXP.yaml -o OUT.yaml``: another tool's experiment config
as a dlhpc experiment file, checked by dlhpc's own loader before it is written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from dlhpc.cli._common import backends, searchers, site_option
from dlhpc.config import load_experiment
from dlhpc.convert import convert_determined, map_issues
from dlhpc.errors import ConfigError, UsageError

__all__ = ["COMMANDS"]


@click.group()
def convert() -> None:
    """Translate another tool's experiment config into a dlhpc experiment file."""


@convert.command()
@click.argument("experiment", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The dlhpc experiment file to write (replaced atomically).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The Determined context folder (default: EXPERIMENT's folder).",
)
@click.option(
    "--slot-type",
    type=click.Choice(["gpu", "cpu"]),
    default="gpu",
    show_default=True,
    help="What resources.slots_per_trial counts: GPUs, or CPUs (one worker each).",
)
@click.option(
    "--slots-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Split slots_per_trial over nodes of this many slots; one task per node runs the"
    " entrypoint (default: slurm.slots_per_node, else all on one node).",
)
@site_option
def determined(
    experiment: Path,
    output: Path,
    workdir: Path | None,
    slot_type: str,
    slots_per_node: int | None,
    site: str | None,
) -> None:
    """Translate Determined experiment config EXPERIMENT (Core API) into a dlhpc
    experiment file. What cannot be translated is printed to stderr and listed at the
    top of the output; the output must load with dlhpc's loader or nothing is written."""
    if output.resolve() == experiment.resolve():
        raise UsageError("--output must not be the Determined config itself")
    result = convert_determined(
        experiment,
        out_dir=output.parent,
        workdir=workdir,
        slot_type=slot_type,
        slots_per_node=slots_per_node,
    )
    text = result.render()
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".yaml")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            load_experiment(tmp, site=site, backends=backends(), searchers=searchers())
        except ConfigError as err:
            raise map_issues(result, err) from None
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    for note in result.notes:
        click.echo(f"not translated: {note}", err=True)
    click.echo(f"wrote {output} ({len(result.notes)} item(s) not translated)", err=True)


COMMANDS = [convert]
