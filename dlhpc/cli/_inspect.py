"""Commands that look: status, logs."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dlhpc.cli._common import open_store, site_option
from dlhpc.cli._logtext import DEFAULT_MAX_BYTES, follow_log
from dlhpc.errors import DlhpcError, UsageError
from dlhpc.report.quota import quota_warning
from dlhpc.report.status import iter_status_json, status_data
from dlhpc.report.status_types import ExperimentStatus, write_json
from dlhpc.store.queries import trial_attempt

if TYPE_CHECKING:  # rich loads only to print a table: not for --json
    from rich.console import Group

__all__ = ["COMMANDS"]

_ROW_LIMIT = 40  # cli._views.ROW_LIMIT, for the help text without importing rich


@click.command()
@click.argument("experiment_id", type=int, required=False)
@site_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Refresh in place every few seconds.")
@click.option("--interval", default=5.0, show_default=True)
@click.option(
    "--all", "show_all", is_flag=True, help=f"List every trial (default: {_ROW_LIMIT}, live first)."
)
@click.option(
    "--tag",
    "tags",
    multiple=True,
    help="Only experiments tagged TAG (repeated: those with every TAG given).",
)
def status(
    experiment_id: int | None,
    site: str | None,
    as_json: bool,
    watch: bool,
    interval: float,
    show_all: bool,
    tags: tuple[str, ...],
) -> None:
    """Experiments (newest first) and the newest one's trials, or EXPERIMENT_ID's trials."""
    if tags and experiment_id is not None:
        raise UsageError("--tag filters the list of experiments: give it without EXPERIMENT_ID")
    if tags:  # the write side's rule (loaded only here: status stays light)
        from dlhpc.orchestrator.annotate import check_tag

        if bad := [why for t in tags if (why := check_tag(t))]:
            raise UsageError("--tag: " + "; ".join(bad))
    store = open_store(site)
    warnings: dict[Path, str | None] = {}  # one `lfs quota` per checkpoint.dir per command

    def with_quota(e: ExperimentStatus) -> ExperimentStatus:
        root = e.disk.checkpoint_root if e.disk else None
        if e.disk is None or not root:
            return e
        ck_dir = Path(root).parent
        if ck_dir not in warnings:
            warnings[ck_dir] = quota_warning(ck_dir)
        return replace(e, disk=e.disk.with_quota(warnings[ck_dir]))

    if as_json:
        with store.read() as s:  # streamed: 100,000s of trials are never held at once
            pieces = iter_status_json(s, experiment_id, tags=tags)
            write_json(pieces, sys.stdout.buffer, finish=with_quota)
        return
    from rich.console import Group
    from rich.live import Live

    from dlhpc.cli._console import console
    from dlhpc.cli._views import ROW_LIMIT, experiment_view, experiments_table

    def render() -> Group:
        limit = None if show_all else ROW_LIMIT
        with store.read() as s:
            data = status_data(s, experiment_id, limit=limit, tags=tags)
        if not data.experiments:
            if tags:
                return Group(f"no experiment tagged {' and '.join(tags)}")
            return Group("no experiments yet: dlhpc launch EXPERIMENT.yaml")
        shown = with_quota(data.experiments[0])  # the one whose trials show
        if experiment_id is not None:
            return Group(experiment_view(shown, limit=limit))
        # the list, then the newest experiment's trials (what one usually wants to see)
        return Group(experiments_table(data), experiment_view(shown, limit=limit))

    if not watch:
        console.print(render())
        return
    with Live(render(), console=console, refresh_per_second=1) as live:
        while True:
            time.sleep(interval)
            live.update(render())


@click.command()
@click.argument("trial_id", type=int)
@site_option
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows.")
@click.option("--stderr/--stdout", "use_err", default=False, help="Which stream (default stdout).")
@click.option(
    "--attempt",
    "key",
    metavar="KEY",
    help="An earlier attempt, by its key (JOB.rN, as `dlhpc status --json` lists them).",
)
@click.option(
    "--max-bytes",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_BYTES,
    show_default=True,
    help="Print at most the log's last N bytes (0: all of it).",
)
@click.option("--raw", is_flag=True, help="Keep terminal control sequences (colours...).")
def logs(
    trial_id: int,
    site: str | None,
    follow: bool,
    use_err: bool,
    key: str | None,
    max_bytes: int,
    raw: bool,
) -> None:
    """Print the log of TRIAL_ID's latest attempt.

    A task the scheduler requeued under its own id writes all its runs into one log.
    Terminal control sequences in it are removed unless --raw."""
    store = open_store(site)
    with store.read() as s:
        attempt, folder = trial_attempt(s, trial_id, key)
    if not attempt.log_path:  # a job whose submission is not recorded yet (adopt fills it)
        raise DlhpcError(
            f"trial {trial_id}: attempt {attempt.attempt_key} (job {attempt.job_id})"
            " has no log file recorded"
        )
    path = Path(attempt.log_path)
    if use_err:
        path = path.with_name(path.name.replace(".out", ".err"))
    if folder is not None and not path.exists():
        click.echo(f"(no log yet at {path}; job {attempt.job_id} may not have started)", err=True)
        if not follow:
            return
    follow_log(
        path,
        follow=follow,
        raw=raw,
        max_bytes=max_bytes,
        out=lambda text: click.echo(text, nl=False, color=True),  # click strips no colour
        note=lambda text: click.echo(text, err=True),
    )


COMMANDS = [status, logs]
