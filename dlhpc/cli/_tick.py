"""``dlhpc tick``: what cron runs. It imports no rich (it prints lines), and none of
the launch and view code: its start-up is part of every pass."""

from __future__ import annotations

import time
from datetime import datetime

import click

from dlhpc.cli import _attention
from dlhpc.cli._common import echo_json, open_store, pool_for, site_option
from dlhpc.orchestrator import TickReport
from dlhpc.orchestrator import tick as do_tick
from dlhpc.store import Store

__all__ = ["COMMANDS", "tick_line"]


def tick_line(r: TickReport) -> str:
    calls = ", ".join(f"{k}={v}" for k, v in sorted(r.scheduler_calls.items())) or "none"
    return (
        f"tick: {r.experiments} active, {r.polled_jobs} jobs polled, "
        f"{r.ingested_files} files / {r.metrics} metrics ingested, "
        f"{r.submitted} submitted, scheduler calls: {calls}, {r.duration_s:.2f} s"
    )


@click.command()
@site_option
@click.option("--json", "as_json", is_flag=True, help="Print the tick report as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="Print only problems (for cron).")
@click.option("--loop", "loop_s", type=float, default=None, help="Repeat every N seconds.")
def tick(site: str | None, as_json: bool, quiet: bool, loop_s: float | None) -> None:
    """One idempotent reconciliation pass over all active experiments (what cron runs).

    Exits 1 with one line when the state database cannot commit (its disk full).
    With ``--loop``, each pass gets new schedulers, as a cron tick would: a Slurm
    command that failed in one pass (sacct while slurmdbd is down) is tried again."""
    store = open_store(site)
    while True:
        since = _attention.utcnow()
        report = do_tick(store, pool_for(store))
        if as_json:
            echo_json(report.__dict__)
        elif report.stalled is not None:
            click.echo(f"error: {report.stalled}", err=True)
        elif report.lease_held_elsewhere:
            if not quiet:
                click.echo("tick: another reconciler holds the lease; nothing to do")
        else:
            for err in report.errors:
                click.echo(f"warning: {err}", err=True)
            for line in _attention_lines(store, since):
                click.echo(f"warning: {line}", err=True)
            if not quiet:
                click.echo(tick_line(report))
        if loop_s is None:
            if report.stalled is not None:
                raise SystemExit(1)  # a runtime failure: cron mails the line
            return
        time.sleep(loop_s)


def _attention_lines(store: Store, since: datetime) -> list[str]:
    """What this pass found that needs a person: trials failed and experiments ended
    FAILED during it, and GPUs newly idle (each idle spell once)."""
    att = _attention.collect(store, since, _attention.utcnow())
    lines = [
        f"experiment {e['id']} ({e['name']}) ended FAILED"
        for e in att.finished
        if e["state"] == "FAILED"
    ]
    lines += [_attention.failed_line(t) for t in att.failed]
    idle_file = _attention.state_dir(store) / "tick-idle.json"
    lines += [_attention.idle_line(g) for g in _attention.new_idle(att.idle, idle_file)]
    return lines


COMMANDS = [tick]
