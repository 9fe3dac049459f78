"""``dlhpc report``: self-contained HTML reports (one file per experiment, and an index)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dlhpc.cli._common import open_store, site_option
from dlhpc.errors import UsageError
from dlhpc.report.build import INDEX_FILE, page_file, write_all, write_report

__all__ = ["COMMANDS"]


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


@click.command()
@click.argument("experiment_id", type=int, required=False)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The page to write for EXPERIMENT_ID (default: ./exp-<id>.html).",
)
@click.option("--all", "all_", is_flag=True, help="Every experiment, plus index.html.")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="With --all: the folder of the pages.",
)
@click.option(
    "--force", is_flag=True, help="With --all: rewrite the pages of ended experiments too."
)
@click.option(
    "--publish",
    is_flag=True,
    help="With --all: make the folder and pages readable by others (a web-served folder).",
)
@click.option("-q", "--quiet", is_flag=True, help="Print errors only.")
@site_option
def report(
    experiment_id: int | None,
    output: Path | None,
    all_: bool,
    out_dir: Path | None,
    force: bool,
    publish: bool,
    quiet: bool,
    site: str | None,
) -> None:
    """Write EXPERIMENT_ID's report as one self-contained HTML file, or with --all
    every experiment's page and an index into --out-dir. Pages are replaced
    atomically and make no network request (open them from file://, mail them)."""
    if all_ == (experiment_id is not None):
        raise UsageError("give an EXPERIMENT_ID or --all (not both)")
    if all_ and out_dir is None:
        raise UsageError("--all needs --out-dir DIR")
    if all_ and output is not None:
        raise UsageError("-o/--output is for one experiment; with --all use --out-dir")
    if not all_ and (out_dir is not None or force or publish):
        raise UsageError(
            "--out-dir, --force and --publish go with --all; for one experiment use -o FILE"
        )
    store = open_store(site)
    if experiment_id is not None:
        path = output or Path(page_file(experiment_id))
        size = write_report(store, experiment_id, path)
        if not quiet:
            click.echo(f"wrote {path} ({_size(size)})")
        return
    assert out_dir is not None
    err = Console(stderr=True)
    with Progress(
        TextColumn("report"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=quiet or not err.is_terminal,
    ) as bar:
        task = bar.add_task("pages", total=None)
        result = write_all(
            store,
            out_dir,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
            force=force,
            publish=publish,
        )
    if not quiet:
        pages = len(result.written) - 1
        total = sum(n for _, n in result.written)
        kept = f", {len(result.kept)} unchanged page(s) kept" if result.kept else ""
        click.echo(
            f"wrote {pages} page(s) and {out_dir / INDEX_FILE} ({_size(total)} in all){kept}"
        )
        if publish:
            click.echo(f"published: {out_dir} and its pages are readable by others")


COMMANDS = [report]
