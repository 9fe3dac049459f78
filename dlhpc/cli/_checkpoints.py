"""Checkpoint commands: checkpoints (list), pin / unpin, gc, export.

``pin``, ``unpin`` and ``gc`` (not ``--dry-run``) take the reconciler lease, as
every write does; while a tick holds it they fail with a one-line message (exit 1)
and can simply be run again. ``checkpoints``, ``gc --dry-run`` and ``export`` only
read the database.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from dlhpc._perms import may_modify
from dlhpc.cli._common import check_owner, echo_json, open_store, site_option
from dlhpc.cli._console import console
from dlhpc.cli._views import human_bytes
from dlhpc.errors import NotFoundError
from dlhpc.orchestrator.checkpoints import GcReport, experiment_plan, gc, set_pinned
from dlhpc.orchestrator.export import export_trial
from dlhpc.states import CheckpointState
from dlhpc.store import Experiment, Store
from dlhpc.store.queries import experiment_checkpoints, experiment_owners

__all__ = ["COMMANDS", "checkpoint_rows"]


def _iso(value: Any) -> str | None:
    return value.isoformat() + "Z" if value else None


def checkpoint_rows(
    store: Store, experiment_id: int, include_deleted: bool
) -> list[dict[str, Any]]:
    """The experiment's checkpoints, oldest first, with why the policy keeps each
    ACTIVE one now (``kept_because``; empty: the next GC deletes it)."""
    with store.read() as s:
        exp = s.get(Experiment, experiment_id)
        if exp is None:
            raise NotFoundError(f"no experiment {experiment_id}")
        _, plan = experiment_plan(s, exp)
        return [
            {
                "id": c.id,
                "trial_id": c.trial_id,
                "step": c.step,
                "metric": c.metric,
                "size_bytes": c.size_bytes,
                "state": c.state,
                "pinned": c.pinned,
                "kept_because": list(plan.keep.get(c.id, ()))
                if c.state == CheckpointState.ACTIVE.value
                else [],
                "path": c.path,
                "created_at": _iso(c.created_at),
                "deleted_at": _iso(c.deleted_at),
            }
            for c in experiment_checkpoints(s, experiment_id, include_deleted)
        ]


@click.command()
@click.argument("experiment_id", type=int)
@site_option
@click.option("--all", "include_deleted", is_flag=True, help="Include deleted checkpoints.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def checkpoints(experiment_id: int, site: str | None, include_deleted: bool, as_json: bool) -> None:
    """List EXPERIMENT_ID's checkpoints: size, metric, and why each is kept."""
    rows = checkpoint_rows(open_store(site), experiment_id, include_deleted)
    if as_json:
        echo_json({"experiment_id": experiment_id, "checkpoints": rows})
        return
    table = Table(title=f"experiment {experiment_id} checkpoints", title_justify="left")
    for col in ("id", "trial", "step", "metric", "size", "state", "pinned", "kept because"):
        table.add_column(col, no_wrap=True, justify="right" if col == "size" else "left")
    for r in rows:
        if r["state"] != CheckpointState.ACTIVE.value:
            why = Text(f"deleted {(r['deleted_at'] or '')[:16].replace('T', ' ')}", style="dim")
        elif r["kept_because"]:
            why = Text(", ".join(r["kept_because"]))
        else:
            why = Text("- (deleted at the next GC)", style="yellow")
        table.add_row(
            str(r["id"]),
            str(r["trial_id"]),
            str(r["step"]),
            "-" if r["metric"] is None else f"{r['metric']:.4g}",
            human_bytes(r["size_bytes"]),
            r["state"],
            "yes" if r["pinned"] else "",
            why,
        )
    console.print(table)
    active = [r for r in rows if r["state"] == CheckpointState.ACTIVE.value]
    click.echo(f"{len(active)} active, {human_bytes(sum(r['size_bytes'] for r in active))}")


def _pin_command(name: str, pinned: bool, doc: str) -> click.Command:
    @click.command(name=name, help=doc)
    @click.argument("checkpoint_id", type=int)
    @site_option
    def command(checkpoint_id: int, site: str | None) -> None:
        store = open_store(site)
        check_owner(store, checkpoint_id=checkpoint_id)
        row = set_pinned(store, checkpoint_id, pinned)
        state = "pinned" if pinned else "unpinned"
        click.echo(f"checkpoint {row['id']} (trial {row['trial_id']}) {state}: {row['path']}")

    return command


pin = _pin_command("pin", True, "Protect CHECKPOINT_ID from the GC (until unpinned).")
unpin = _pin_command("unpin", False, "Let the keep policy decide about CHECKPOINT_ID again.")


def _gc_json(r: GcReport) -> dict[str, Any]:
    return dict(r.__dict__)


@click.command(name="gc")
@click.argument("experiment_id", type=int, required=False)
@site_option
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def gc_command(experiment_id: int | None, site: str | None, dry_run: bool, as_json: bool) -> None:
    """Apply the checkpoint keep policy to EXPERIMENT_ID (default: every experiment)."""
    store = open_store(site)
    skipped: list[int] = []
    if experiment_id is None:  # every experiment this user may change; others' are skipped
        with store.read() as s:
            owners = experiment_owners(s)
        ids = [i for i, user in owners.items() if may_modify(user, store.permissions)]
        skipped = sorted(set(owners) - set(ids))
    else:
        if not dry_run:
            check_owner(store, experiment_id=experiment_id)
        ids = [experiment_id]
    reports = [gc(store, i, dry_run) for i in ids]
    freed = sum(r.bytes_freed for r in reports)
    if as_json:
        echo_json(
            {
                "dry_run": dry_run,
                "bytes_freed": freed,
                "experiments": [_gc_json(r) for r in reports],
                "skipped_not_yours": skipped,
            }
        )
        return
    verb = "would delete" if dry_run else "deleted"
    if skipped:
        click.echo(f"skipped other users' experiments (read-only to you): {skipped}")
    for r in reports:
        line = f"experiment {r.experiment_id}: {verb} {len(r.deleted)} checkpoint(s), "
        line += f"{human_bytes(r.bytes_freed)}; {r.kept} kept"
        if r.missing:
            line += f"; {len(r.missing)} already gone"
        click.echo(line)
        for path in r.deleted:
            click.echo(f"  {verb}: {path}")
        for path in r.refused:
            click.echo(f"  refused (not under the experiment's checkpoint folder): {path}")
        for err in r.errors:
            click.echo(f"  error: {err}", err=True)
    click.echo(f"{'would free' if dry_run else 'freed'} {human_bytes(freed)} ({freed} bytes)")


@click.command()
@click.argument("trial_id", type=int)
@click.argument("folder", type=click.Path(path_type=Path))
@site_option
@click.option("--latest", is_flag=True, help="Export the newest checkpoint, not the best.")
def export(trial_id: int, folder: Path, site: str | None, latest: bool) -> None:
    """Export TRIAL_ID into FOLDER: weights, config, metrics, reproducibility record."""
    result = export_trial(open_store(site), trial_id, folder, latest)
    ck = result.checkpoint
    what = (
        f"checkpoint {ck['id']} (step {ck['step']}, {ck['chosen_as']})"
        if ck
        else "no checkpoint (none left on disk)"
    )
    click.echo(f"exported trial {trial_id} to {result.folder}: {what}; {', '.join(result.files)}")


COMMANDS = [checkpoints, pin, unpin, gc_command, export]
