"""``dlhpc model``: the model registry (register, list, show, export).

``register`` takes the reconciler lease (while a tick holds it, it fails with a
one-line message, exit 1, and can simply be run again); ``list``, ``show`` and
``export`` only read the database. Bad input (an unknown trial, checkpoint, name
or version, a bad name, a checkpoint that is deleted or does not verify, a
non-empty export folder) exits 2 and changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from dlhpc.cli._common import check_owner, echo_json, open_store, site_option
from dlhpc.cli._console import console
from dlhpc.orchestrator.model_registry import export_version, register, version_facts
from dlhpc.store.model_registry import check_model_name, version_rows

__all__ = ["COMMANDS"]


def _metric(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


@click.group()
def model() -> None:
    """The model registry: register a trial's checkpoint as a model version, list,
    show and export versions."""


@model.command("register")
@click.argument("trial_id", type=int)
@click.argument("name")
@click.option("--checkpoint", "checkpoint_id", type=int, help="This checkpoint id, not the best.")
@click.option("--note", default="", help="A note stored with the version.")
@site_option
def register_command(
    trial_id: int, name: str, checkpoint_id: int | None, note: str, site: str | None
) -> None:
    """Register the next version of NAME for a checkpoint of TRIAL_ID: --checkpoint,
    else the trial's best by the experiment's metric, else its newest. NAME is a
    letter or digit, then up to 127 letters, digits, '.', '_' or '-'."""
    check_model_name(name)  # before the database is opened
    store = open_store(site)
    check_owner(store, trial_id=trial_id)
    r = register(store, trial_id, name, checkpoint_id, note)
    metric = _metric(r.metric)
    click.echo(
        f"registered model {r.ref}: trial {r.trial_id} (experiment {r.experiment_id}),"
        f" checkpoint {r.checkpoint_id} at step {r.step} ({r.chosen_as}), metric {metric}:"
        f" {r.path}"
    )


@model.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@site_option
def list_command(as_json: bool, site: str | None) -> None:
    """Every registered model version, by name then version."""
    store = open_store(site)
    with store.read() as s:
        rows = version_rows(s)
    if as_json:
        echo_json({"models": [r.as_dict() for r in rows]})
        return
    if not rows:
        click.echo("no registered models (dlhpc model register TRIAL_ID NAME)")
        return
    table = Table(title="registered models", title_justify="left")
    for col in ("model", "trial", "experiment", "step", "metric", "checkpoint", "user", "date"):
        table.add_column(col, no_wrap=col != "experiment")
    table.add_column("note")
    for r in rows:
        ckpt = f"{r.checkpoint_id}" + ("" if r.checkpoint_state == "ACTIVE" else " (deleted)")
        table.add_row(
            Text(r.ref),  # Text: user input is never read as rich markup
            str(r.trial_id),
            Text(f"{r.experiment_id} {r.experiment_name}"),
            str(r.step),
            Text(f"{r.metric_name} {_metric(r.metric)}"),
            ckpt,
            Text(r.user),
            f"{r.created_at:%Y-%m-%d %H:%M}",
            Text(r.note),
        )
    console.print(table)


def _show_lines(f: dict[str, Any]) -> list[str]:
    rec = f["record"]
    code, env = rec["code"], rec["environment"]
    lines = [
        f"model {f['name']}:{f['version']} (registered by {f['user'] or '?'},"
        f" {f['created_at'][:16].replace('T', ' ')} UTC)",
        f"  trial        {f['trial_id']} of experiment {f['experiment_id']}"
        f" ({f['experiment_name']})",
        f"  checkpoint   {f['checkpoint_id']} at step {f['step']}"
        f" ({f['checkpoint_state']}): {f['checkpoint_path']}",
        f"  metric       {f['metric_name']} = {_metric(f['metric'])}",
        f"  note         {f['note'] or '-'}",
        f"  hparams      {f['hparams']} (seed {f['seed']}, length {f['max_length']})",
    ]
    if not rec["recorded"]["experiment"]:
        lines.append("  code         (no launch record)")
    else:
        dirty = {True: " (dirty)", False: " (clean)"}.get(code.get("dirty"), "")
        what = code.get("commit") or code.get("digest") or code.get("error") or "?"
        lines.append(f"  code         {code.get('kind') or '?'} {what}{dirty}")
    for d in rec["data"]:
        sha = d.get("content_sha256") or d.get("listing_sha256") or ""
        lines.append(
            f"  data         {d.get('path')}: {d.get('files')} file(s), {d.get('bytes')} B"
            f"{', sha256 ' + str(sha)[:12] if sha else ''}"
        )
    gpus = ", ".join(str(g) for g in env["gpus"]) or "none"
    lines.append(
        f"  environment  Python {env['python'] or '?'}, {env['packages']} packages,"
        f" scheduler {env['scheduler_version'] or '?'}, site {env['site'] or '?'},"
        f" nodes {env['nodes'] or '?'}, GPUs {gpus}"
        + (f" (driver {env['gpu_driver']})" if env["gpu_driver"] else "")
    )
    return lines


@model.command("show")
@click.argument("ref", metavar="NAME[:VERSION]")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@site_option
def show_command(ref: str, as_json: bool, site: str | None) -> None:
    """One model version (the latest without :VERSION): its trial, experiment, step,
    metric, checkpoint, note, user, date and what its reproducibility record says."""
    facts = version_facts(open_store(site), ref)
    if as_json:
        echo_json(facts)
        return
    for line in _show_lines(facts):
        click.echo(line)


@model.command("export")
@click.argument("ref", metavar="NAME:VERSION")
@click.argument("folder", type=click.Path(path_type=Path))
@site_option
def export_command(ref: str, folder: Path, site: str | None) -> None:
    """Export a model version into FOLDER (new or empty): weights, config, metrics,
    reproducibility record, and a README saying what is what."""
    row, result = export_version(open_store(site), ref, folder)
    click.echo(
        f"exported model {row.ref} (trial {row.trial_id}, checkpoint {row.checkpoint_id},"
        f" step {row.step}) to {result.folder}: {', '.join(result.files)}"
    )


COMMANDS = [model]
