"""``dlhpc report``: self-contained HTML reports (one file per experiment, and an index)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dlhpc.cli._common import open_store, site_option
from dlhpc.errors import UsageError
from dlhpc.report.build import INDEX_FILE, MODELS_FILE, page_file, write_all, write_report
from dlhpc.store import Store

__all__ = ["COMMANDS"]


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


@click.command()
@click.argument("experiment_ids", metavar="[EXPERIMENT_ID]...", type=int, nargs=-1)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The page to write for EXPERIMENT_ID (default: ./exp-<id>.html; with --compare:"
    " ./compare-<ids>.html).",
)
@click.option(
    "--compare",
    is_flag=True,
    help="One page comparing the EXPERIMENT_IDs (or the trials given with -t): curves,"
    " hyperparameters, record differences, parallel coordinates.",
)
@click.option(
    "-t",
    "--trial",
    "trial_ids",
    metavar="TRIAL_ID",
    type=int,
    multiple=True,
    help="With --compare: a trial to compare (repeat it; the EXPERIMENT_IDs, if given, must"
    " hold them).",
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
    experiment_ids: tuple[int, ...],
    output: Path | None,
    compare: bool,
    trial_ids: tuple[int, ...],
    all_: bool,
    out_dir: Path | None,
    force: bool,
    publish: bool,
    quiet: bool,
    site: str | None,
) -> None:
    """Write EXPERIMENT_ID's report as one self-contained HTML file, or with --all
    every experiment's page and an index into --out-dir. Pages are replaced
    atomically and make no network request (open them from file://, mail them).

    With --compare, one page that compares two or more experiments (every trial's
    learning curve, each one's best in bold) or, with -t, two or more trials."""
    if compare:
        _compare(
            experiment_ids, trial_ids, output, all_ or out_dir is not None or force, quiet, site
        )
        return
    experiment_id = _one_id(experiment_ids, trial_ids)
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
    assert out_dir is not None  # checked above: --all needs --out-dir
    _write_every_page(store, out_dir, force=force, publish=publish, quiet=quiet)


def _write_every_page(
    store: Store, out_dir: Path, *, force: bool, publish: bool, quiet: bool
) -> None:
    """``report --all``: every experiment's page, models.html and the index into
    ``out_dir``, with a progress bar on a terminal and one summary line."""
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
    if quiet:
        return
    pages = sum(p.name not in (MODELS_FILE, INDEX_FILE) for p, _ in result.written)
    total = sum(n for _, n in result.written)
    kept = f", {len(result.kept)} unchanged page(s) kept" if result.kept else ""
    click.echo(
        f"wrote {pages} page(s), {out_dir / MODELS_FILE} and {out_dir / INDEX_FILE}"
        f" ({_size(total)} in all){kept}"
    )
    if publish:
        click.echo(f"published: {out_dir} and its pages are readable by others")


def _one_id(experiment_ids: tuple[int, ...], trial_ids: tuple[int, ...]) -> int | None:
    """The one EXPERIMENT_ID of a page (None: none given); without --compare, several
    ids or -t are refused."""
    if trial_ids:
        raise UsageError("-t/--trial goes with --compare")
    if len(experiment_ids) > 1:
        raise UsageError("one EXPERIMENT_ID (to compare several, add --compare)")
    return experiment_ids[0] if experiment_ids else None


def _compare(
    experiment_ids: tuple[int, ...],
    trial_ids: tuple[int, ...],
    output: Path | None,
    with_all: bool,
    quiet: bool,
    site: str | None,
) -> None:
    """``report --compare``: everything is checked and read before the page is written."""
    from dlhpc.orchestrator.reproduce import volatile_env
    from dlhpc.report.compare import compare_file, load_compare, write_compare
    from dlhpc.scheduler.plugins import BackendTable

    if with_all:
        raise UsageError("--compare makes one page: not with --all, --out-dir or --force")
    store = open_store(site)
    model = load_compare(store, experiment_ids, trial_ids, volatile_env(BackendTable()))
    path = output or Path(compare_file(experiment_ids, trial_ids))
    size = write_compare(store, model, path)
    if not quiet:
        click.echo(f"wrote {path} ({_size(size)})")


COMMANDS = [report]
