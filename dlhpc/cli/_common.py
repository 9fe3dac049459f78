"""Helpers shared by CLI commands: where the state lives, output."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from dlhpc import _perms
from dlhpc._perms import apply_umask
from dlhpc.config import SiteConfig, load_site
from dlhpc.store import Store, default_home
from dlhpc.store.queries import experiment_owner

if TYPE_CHECKING:  # the orchestrator loads only for the commands that act
    from dlhpc.orchestrator.pool import SchedulerPool
    from dlhpc.scheduler.plugins import BackendTable
    from dlhpc.search.plugins import SearcherTable

__all__ = [
    "backends",
    "check_owner",
    "echo_json",
    "open_store",
    "pool_for",
    "searchers",
    "site_option",
    "use_site",
]

site_option = click.option(
    "--site", default=None, help="Site config name or path (default: $DLHPC_SITE, else auto)."
)


def backends() -> BackendTable:
    """The scheduler backends, for the config loaders (``backends=``): the backend
    names a site may use and what ``backend: auto`` means here (Slurm where ``sbatch``
    is on ``PATH``, else local). Config, below the schedulers, gets them from the CLI."""
    from dlhpc.scheduler.plugins import BackendTable  # light, but only when asked

    return BackendTable()


def searchers() -> SearcherTable:
    """The searchers, for the experiment loader (``searchers=``): the names a file may
    use, each checking its own settings. Config, below the searchers, gets them here."""
    from dlhpc.search.plugins import SearcherTable  # imports every built-in searcher

    return SearcherTable()


def use_site(cfg: SiteConfig) -> SiteConfig:
    """Apply the site's permission policy (its umask) to this process; returns ``cfg``.
    The CLI calls it once it knows its site, before it creates anything."""
    apply_umask(cfg.permissions.umask)
    return cfg


def open_store(site: str | None = None) -> Store:
    """The store of the user's state folder ($DLHPC_HOME, else the site's state_dir),
    with the site's permission policy applied."""
    cfg = use_site(load_site(site, backends=backends()))
    return Store(
        default_home(cfg.state_dir), journal_mode=cfg.journal_mode, permissions=cfg.permissions
    )


def check_owner(
    store: Store,
    *,
    experiment_id: int | None = None,
    trial_id: int | None = None,
    checkpoint_id: int | None = None,
) -> None:
    """Refuse (:class:`~dlhpc.errors.NotPermittedError`, exit 2) to change another user's
    experiment unless the site allows it (``permissions.others_experiments: write``).
    An unknown id passes: the command itself reports it."""
    with store.read() as s:
        row = experiment_owner(
            s, experiment_id=experiment_id, trial_id=trial_id, checkpoint_id=checkpoint_id
        )
    if row is not None:
        _perms.check_may_modify(row[1], f"experiment {row[0]}", store.permissions)


def pool_for(store: Store) -> SchedulerPool:
    from dlhpc.orchestrator.pool import SchedulerPool

    return SchedulerPool(local_root=store.home / "local")


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
