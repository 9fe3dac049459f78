"""``dlhpc simulate``: what a search would cost on a simulated cluster, per searcher."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from dlhpc._perms import member_home
from dlhpc.cli._common import backends, echo_json, searchers, site_option
from dlhpc.cli._console import console
from dlhpc.config import load_experiment
from dlhpc.errors import UsageError
from dlhpc.search import searcher_names
from dlhpc.simulate import Comparison, SimSettings, compare
from dlhpc.store import default_home

__all__ = ["COMMANDS"]

_DEFAULT_ALTERNATIVES = "grid,random,asha,hyperband"


def _duration(hours: float | None) -> str:
    if hours is None:
        return "-"
    minutes = hours * 60
    if minutes < 90:
        return f"{minutes:.0f} min"
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} d"


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def _gpu_hours(value: float | None) -> str:
    if value is None or value < 100:
        return _num(value, ".3g" if value is None or value < 10 else ".1f")
    return f"{value:,.0f}"


def _searchers(text: str) -> list[str]:
    if text.strip().lower() == "none":
        return []
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    known = searcher_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(
            f"--alternatives: unknown searcher(s) {', '.join(unknown)} (known: {', '.join(known)})"
        )
    return names


def _check(**values: tuple[float, float, bool]) -> None:
    for name, (value, low, inclusive) in values.items():
        if value < low or (value == low and not inclusive):
            rel = ">=" if inclusive else ">"
            raise UsageError(f"--{name.replace('_', '-')} must be {rel} {low:g}, got {value:g}")


def _table(c: Comparison) -> Table:
    s = c.settings
    table = Table(
        title=(
            f"{c.experiment}: {s.gpus} GPUs, queue wait ~{s.queue_wait_s:g} s,"
            f" {s.preempt_rate:g} preemptions/GPU-h, {c.reps} rep(s) each"
        ),
        caption=(
            f"curves: {c.curves}. best = the run's best completed trial is truly in the top"
            f" {s.top:.0%} of the space by final {c.metric}"
        ),
    )
    for col in ("searcher", "GPU-hours", "wall time", "P(best)", f"final {c.metric}"):
        table.add_column(col, justify="left" if col == "searcher" else "right")
    for col in ("trials", "promoted", "stopped", "preempted", "outcome"):
        table.add_column(col, justify="right")
    for summary in c.summaries:
        j = summary.to_json()
        states = ", ".join(f"{k} x{v}" for k, v in j["states"].items())
        table.add_row(
            summary.searcher,
            _gpu_hours(j["median_gpu_hours"]),
            _duration(j["median_wall_hours"]),
            f"{j['p_best']:.0%}",
            _num(j["median_best_metric"], ".4g"),
            _num(j["median_trials"], "g"),
            _num(j["median_promotions"], "g"),
            _num(j["median_stops"], "g"),
            _num(j["median_preemptions"], "g"),
            states,
        )
    return table


@click.command()
@click.argument("experiment", type=click.Path(dir_okay=False, path_type=Path))
@site_option
@click.option("--gpus", default=8, show_default=True, help="GPUs (task slots) in the cluster.")
@click.option(
    "--queue-wait", default=60.0, show_default=True, help="Mean queue wait per task, seconds."
)
@click.option(
    "--preempt-rate", default=0.0, show_default=True, help="Preemptions per running GPU-hour."
)
@click.option(
    "--startup",
    type=float,
    default=None,
    help="Seconds before a job's 1st epoch (default: 30, or the start-up measured in"
    " --curves experiment:ID).",
)
@click.option(
    "--teardown",
    type=float,
    default=None,
    help="Seconds from a job's last epoch to its exit (default: 0, or the time measured in"
    " --curves experiment:ID).",
)
@click.option(
    "--epoch-seconds",
    type=float,
    default=None,
    help="Synthetic curves: seconds per epoch (default: half the time limit / max_length).",
)
@click.option(
    "--curves",
    default="synthetic",
    show_default=True,
    help="'synthetic' or 'experiment:ID' (a finished experiment's curves).",
)
@click.option("--reps", default=5, show_default=True, help="Simulated runs per searcher.")
@click.option(
    "--alternatives",
    default=_DEFAULT_ALTERNATIVES,
    show_default=True,
    help="Comma-separated searchers to compare with the experiment's ('none': only it).",
)
@click.option("--seed", default=0, show_default=True, help="Moves every seed of the runs.")
@click.option("--tick-interval", default=60.0, show_default=True, help="Virtual s between ticks.")
@click.option("--max-days", default=30.0, show_default=True, help="Virtual time limit per run.")
@click.option("--top", default=0.05, show_default=True, help="'Best' = this top fraction.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every run).")
def simulate(
    experiment: Path,
    site: str | None,
    gpus: int,
    queue_wait: float,
    preempt_rate: float,
    startup: float | None,
    teardown: float | None,
    epoch_seconds: float | None,
    curves: str,
    reps: int,
    alternatives: str,
    seed: int,
    tick_interval: float,
    max_days: float,
    top: float,
    as_json: bool,
) -> None:
    """Simulate EXPERIMENT (a YAML file) with its searcher and alternatives on a
    simulated cluster: expected GPU-hours, wall time and the chance of finding
    the best configuration. Runs the real orchestrator; submits nothing."""
    _check(
        gpus=(gpus, 1, True),
        queue_wait=(queue_wait, 0, True),
        preempt_rate=(preempt_rate, 0, True),
        startup=(startup or 0.0, 0, True),
        teardown=(teardown or 0.0, 0, True),
        reps=(reps, 1, True),
        tick_interval=(tick_interval, 0, False),
        max_days=(max_days, 0, False),
        top=(top, 0, False),
    )
    if top >= 1 or (epoch_seconds is not None and epoch_seconds <= 0):
        raise UsageError("--top must be in (0, 1) and --epoch-seconds > 0")
    names = _searchers(alternatives)
    cfg = load_experiment(experiment, site=site, backends=backends(), searchers=searchers())
    settings = SimSettings(
        gpus=gpus,
        queue_wait_s=queue_wait,
        preempt_rate=preempt_rate,
        startup_s=startup,
        teardown_s=teardown,
        tick_interval_s=tick_interval,
        max_days=max_days,
        top=top,
        epoch_s=epoch_seconds,
    )
    home = member_home(default_home(cfg.site.state_dir), cfg.site.permissions)
    if as_json:
        result = compare(cfg, names, settings, curves=curves, reps=reps, seed=seed, home=home)
        echo_json(result.to_json())
        return
    with console.status("simulating") as status:
        result = compare(
            cfg,
            names,
            settings,
            curves=curves,
            reps=reps,
            seed=seed,
            home=home,
            progress=lambda name, rep: status.update(f"simulating {name}, run {rep + 1}/{reps}"),
        )
    console.print(_table(result))
    for name, why in result.skipped.items():
        console.print(f"{name}: skipped: {why}")
    console.print(f"simulated in {result.real_s:.1f} s")


COMMANDS = [simulate]
