"""``dlhpc tensorboard [EXPERIMENT_ID] [--port N] [--run]``: export, then how to look.

Writes the experiment's metrics (or every experiment's) as TensorBoard event files
(:func:`dlhpc.report.tensorboard.export_tensorboard`: reads the database only, takes no
lease), then prints the ``tensorboard --logdir`` command for this (login) node and the
``ssh -N -L`` line that forwards its port to a laptop. The login host in that line is
``$DLHPC_LOGIN_HOST`` when set (when this node's own name is not the one a laptop reaches
it by; it must reach this same node, where TensorBoard runs), else this machine's fully
qualified name (``socket.getfqdn()``); the user is ``$USER``'s
account (:func:`dlhpc._perms.current_user`). ``--run`` then replaces this process with
TensorBoard (the same Python: ``python -m tensorboard.main``).
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

import click
from sqlalchemy import select

from dlhpc._perms import current_user, may_modify
from dlhpc.cli._common import echo_json, open_store, site_option
from dlhpc.errors import NotFoundError
from dlhpc.report.tensorboard import (
    TensorboardExport,
    export_tensorboard,
    require_tensorboard,
    tensorboard_dir,
)
from dlhpc.store import Experiment, Store

__all__ = ["COMMANDS", "login_host", "view_lines"]

LOGIN_HOST_ENV = "DLHPC_LOGIN_HOST"


def login_host() -> str:
    """The host a laptop reaches this node by: ``$DLHPC_LOGIN_HOST``, else the FQDN."""
    return os.environ.get(LOGIN_HOST_ENV, "").strip() or socket.getfqdn()


def tensorboard_argv(logdir: Path, port: int) -> list[str]:
    """The TensorBoard command for ``logdir`` on ``port`` (localhost only: the ssh
    forward reaches it, other users of the login node do not)."""
    return ["tensorboard", "--logdir", str(logdir), "--port", str(port)]


def view_lines(logdir: Path, port: int, user: str, host: str) -> dict[str, str]:
    """The three lines a user needs: the command here, the forward there, the address."""
    return {
        "command": shlex.join(tensorboard_argv(logdir, port)),
        "ssh": f"ssh -N -L {port}:localhost:{port} {user}@{host}",
        "url": f"http://localhost:{port}",
    }


def _export(
    store: Store, experiment_id: int | None
) -> tuple[Path, list[TensorboardExport], list[str]]:
    """Export one experiment (logdir: its ``tensorboard`` folder) or all of them (logdir:
    the runs folder); the logdir, the exports, and why experiments were left out
    (another user's that we may not change: its files stay as its owner's last export
    wrote them; a run folder that is gone)."""
    with store.read() as s:
        rows = s.execute(select(Experiment.id, Experiment.user, Experiment.run_dir)).all()
    found = {exp_id: (user, run_dir) for exp_id, user, run_dir in rows}
    if experiment_id is not None and experiment_id not in found:
        raise NotFoundError(f"no experiment {experiment_id}")
    ids = sorted(found) if experiment_id is None else [experiment_id]
    exports, notes = [], []
    for exp_id in ids:
        user, run_dir = found[exp_id]
        if not may_modify(user, store.permissions):
            notes.append(
                f"experiment {exp_id}: not exported, it is {user}'s (its files are as"
                f" {user}'s last export left them)"
            )
        elif not Path(run_dir).is_dir():
            notes.append(f"experiment {exp_id}: not exported, its run folder {run_dir} is gone")
        else:
            exports.append(export_tensorboard(store, exp_id))
    if experiment_id is None:
        return store.runs_root, exports, notes
    return tensorboard_dir(found[experiment_id][1]), exports, notes


def _json(
    logdir: Path, exports: list[TensorboardExport], notes: list[str], lines: dict[str, str]
) -> Any:
    return {
        "logdir": str(logdir),
        **lines,
        "experiments": [
            {
                "experiment_id": r.experiment_id,
                "logdir": str(r.logdir),
                "trials": r.trials,
                "points_written": r.points,
                "files_written": r.files,
                "rewritten_trials": r.rewritten,
            }
            for r in exports
        ],
        "skipped": notes,
    }


@click.command()
@click.argument("experiment_id", type=int, required=False)
@site_option
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=6006,
    show_default=True,
    help="TensorBoard's port on the login node and on the laptop.",
)
@click.option("--run", "run_it", is_flag=True, help="Then start TensorBoard here.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def tensorboard(
    experiment_id: int | None, site: str | None, port: int, run_it: bool, as_json: bool
) -> None:
    """Write EXPERIMENT_ID's metrics (default: every experiment's) as TensorBoard event
    files, then print the tensorboard and ssh port-forward commands."""
    require_tensorboard()  # before anything is read or written
    store = open_store(site)
    logdir, exports, notes = _export(store, experiment_id)
    lines = view_lines(logdir, port, current_user(), login_host())
    if as_json:
        echo_json(_json(logdir, exports, notes, lines))
    else:
        for r in exports:
            rewritten = f", {len(r.rewritten)} trial(s) rewritten" if r.rewritten else ""
            click.echo(
                f"experiment {r.experiment_id}: {r.points} new point(s) of {r.trials} trial(s)"
                f" in {r.logdir}{rewritten}"
            )
        for note in notes:
            click.echo(note)
        click.echo(f"on the login node:  {lines['command']}")
        click.echo(f"from your laptop:   {lines['ssh']}")
        click.echo(f"then open           {lines['url']}")
    if run_it:
        sys.stdout.flush()
        argv = [sys.executable, "-m", "tensorboard.main", *tensorboard_argv(logdir, port)[1:]]
        os.execv(sys.executable, argv)


COMMANDS = [tensorboard]
