"""Commands that act: launch, tick, kill."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.live import Live
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from dlhpc._perms import member_home
from dlhpc.cli._common import (
    backends,
    check_owner,
    echo_json,
    open_store,
    pool_for,
    searchers,
    site_option,
    use_site,
)
from dlhpc.cli._console import console
from dlhpc.cli._tick import tick_line
from dlhpc.cli._views import experiment_view
from dlhpc.config import ExperimentConfig, load_experiment
from dlhpc.errors import LeaseHeldError, UsageError
from dlhpc.orchestrator import kill_experiment, kill_trial, plan_launch
from dlhpc.orchestrator import launch as do_launch
from dlhpc.orchestrator import tick as do_tick
from dlhpc.orchestrator.disk_space import shared_small_filesystem
from dlhpc.orchestrator.pool import SchedulerPool
from dlhpc.report.status import status_data
from dlhpc.scheduler.plugins import BackendTable
from dlhpc.search import expected_trials
from dlhpc.states import ExperimentState
from dlhpc.store import Store, default_home

__all__ = ["COMMANDS"]


@click.command()
@click.argument("experiment", type=click.Path(dir_okay=False, path_type=Path))
@site_option
@click.option("--dry-run", is_flag=True, help="Print the exact sbatch script(s); submit nothing.")
@click.option("--follow", is_flag=True, help="Keep ticking with a live view until it ends.")
@click.option("--json", "as_json", is_flag=True, help="Print {experiment_id, slurm_job_ids}.")
@click.option(
    "--interval", default=10.0, show_default=True, help="Seconds between ticks (--follow)."
)
def launch(
    experiment: Path, site: str | None, dry_run: bool, follow: bool, as_json: bool, interval: float
) -> None:
    """Launch EXPERIMENT (a YAML file) as Slurm job arrays."""
    rules = _ClusterRules(dry_run)
    try:
        cfg = load_experiment(
            experiment, site=site, cluster=rules, backends=backends(), searchers=searchers()
        )
    finally:
        rules.warn()
    use_site(cfg.site)
    home = default_home(cfg.site.state_dir)
    problem = BackendTable().get(cfg.backend).request_problem(home)
    if problem is not None:  # e.g. Slurm's: '%' in a log path is a pattern to sbatch
        raise UsageError(problem)
    small = shared_small_filesystem(home, cfg.checkpoint.dir)
    if small is not None:
        click.echo(f"warning: {small}", err=True)
    if dry_run:
        mine = member_home(home, cfg.site.permissions)  # group mode: the lab's users/<you>
        plan = plan_launch(cfg, mine, SchedulerPool(local_root=mine / "local"))
        if as_json:
            echo_json({"experiment_id": plan.experiment_id, "scripts": plan.scripts})
        else:
            click.echo(plan.render())
        return
    store = Store(home, journal_mode=cfg.site.journal_mode, permissions=cfg.site.permissions)
    pool = pool_for(store)
    if as_json or not sys.stdout.isatty() or _expected_trials(cfg) < _LARGE_LAUNCH:
        result = do_launch(cfg, store, pool)
    else:
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),  # pulses: the launch submits its arrays in one call
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            progress.add_task(f"launching {_expected_trials(cfg)} trials as job arrays", total=None)
            result = do_launch(cfg, store, pool)
    if as_json:
        echo_json({"experiment_id": result.experiment_id, "slurm_job_ids": result.job_ids})
    else:
        jobs = sorted({j.split("_")[0] for j in result.job_ids})
        click.echo(
            f"experiment {result.experiment_id} launched: {len(result.job_ids)} trial(s)"
            f" in job(s) {', '.join(jobs) or '-'}"
        )
    if follow:
        _follow(store, result.experiment_id, interval)


class _ClusterRules:
    """The loader's ``cluster=``: each backend's rules (Slurm: one sinfo, one sacctmgr,
    asked only when a value needs them), made on first need; :meth:`warn` prints the
    checks they skipped. A dry run skips Slurm's where sinfo is not installed (e.g.
    rendering scripts on a laptop), and says so."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.made: list[Any] = []
        self.skipped: list[str] = []

    def __call__(self, backend: str) -> Any:
        if self.dry_run and backend == "slurm" and shutil.which("sinfo") is None:
            self.skipped.append("partition, GPU type, account and QOS not checked: no sinfo here")
            return None
        rules = BackendTable().get(backend).cluster_rules()
        if rules is not None:
            self.made.append(rules)
        return rules

    def warn(self) -> None:
        lines = self.skipped + [w for r in self.made for w in getattr(r, "warnings", [])]
        for line in lines:
            click.echo(f"warning: {line}", err=True)


_LARGE_LAUNCH = 200  # trials: from here on a TTY shows a progress bar while launching


def _expected_trials(cfg: ExperimentConfig) -> int:
    """The trials the launch submits (the first ``max_concurrent_trials`` of the search),
    at most; without asking the searcher."""
    sc = cfg.searcher
    total = expected_trials(sc, cfg.hyperparameters)
    return min(total, sc.max_concurrent_trials or total)


def _follow(store: Store, exp_id: int, interval: float) -> None:
    pool = pool_for(store)
    with Live(console=console, refresh_per_second=2, transient=False) as live:
        while True:
            report = do_tick(store, pool)
            with store.read() as s:
                data = status_data(s, exp_id).experiments[0]
            live.update(experiment_view(data, note=tick_line(report)))
            if ExperimentState(data.state).is_terminal:
                return
            time.sleep(interval)


@click.command()
@click.argument("ident", type=int)
@click.option("--trial", "-t", "is_trial", is_flag=True, help="IDENT is a trial id.")
@site_option
def kill(ident: int, is_trial: bool, site: str | None) -> None:
    """Kill experiment IDENT (or trial IDENT with -t): cancel its jobs, mark it KILLED."""
    store = open_store(site)
    if is_trial:
        check_owner(store, trial_id=ident)
    else:
        check_owner(store, experiment_id=ident)
    pool = pool_for(store)
    for _ in range(30):
        try:
            n = kill_trial(store, pool, ident) if is_trial else kill_experiment(store, pool, ident)
            break
        except LeaseHeldError:
            time.sleep(1)
    else:
        raise LeaseHeldError("a reconciler has held the lease for 30 s; try again")
    what = "trial" if is_trial else "experiment"
    click.echo(f"{what} {ident} killed ({n} job(s) cancelled)")


COMMANDS = [launch, kill]
