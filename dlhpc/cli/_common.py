"""Helpers shared by CLI commands: where the state lives, output."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console

from dlhpc.config import load_site
from dlhpc.orchestrator.common import SchedulerPool
from dlhpc.store import Store, default_home

__all__ = ["console", "echo_json", "open_store", "pool_for", "site_option"]

# Off a terminal (pipes, cron mail, CI logs) rich would wrap at 80 columns; tables read
# better unwrapped there.
console = Console() if sys.stdout.isatty() else Console(width=200)

site_option = click.option(
    "--site", default=None, help="Site config name or path (default: $DLHPC_SITE, else auto)."
)


def open_store(site: str | None = None) -> Store:
    """The store of the user's state folder ($DLHPC_HOME, else the site's state_dir)."""
    cfg = load_site(site)
    return Store(default_home(cfg.state_dir), journal_mode=cfg.journal_mode)


def pool_for(store: Store) -> SchedulerPool:
    return SchedulerPool(local_root=store.home / "local")


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
