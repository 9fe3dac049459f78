"""Commands of the reproducibility record: reproduce, diff."""

from __future__ import annotations

import click

from dlhpc.cli._common import echo_json, open_store, pool_for, site_option
from dlhpc.orchestrator.reproduce import diff_trials, plan_reproduce
from dlhpc.orchestrator.reproduce import reproduce as do_reproduce
from dlhpc.repro import render_differences

__all__ = ["COMMANDS"]


@click.command()
@click.argument("trial_id", type=int)
@click.option(
    "--from-checkpoint", is_flag=True, help="Start from a copy of the trial's newest checkpoint."
)
@click.option(
    "--dry-run", is_flag=True, help="Show what would run and what differs; launch nothing."
)
@click.option("--json", "as_json", is_flag=True, help="Print {experiment_id, trial_id, ...}.")
@site_option
def reproduce(
    trial_id: int, from_checkpoint: bool, dry_run: bool, as_json: bool, site: str | None
) -> None:
    """Run TRIAL_ID again as a new experiment: its code snapshot, config, hyperparameters
    and seed. Prints first what differs now from its record (packages, modules, GPU, data)."""
    store = open_store(site)
    plan = plan_reproduce(store, pool_for(store), trial_id, from_checkpoint=from_checkpoint)
    diffs = [d.as_dict() for d in plan.differences]
    facts = {
        "reproduces": {"trial_id": plan.trial_id, "experiment_id": plan.experiment_id},
        "hparams": plan.hparams,
        "seed": plan.seed,
        "max_length": plan.max_length,
        "code_dir": str(plan.code_dir),
        "checkpoint": str(plan.checkpoint) if plan.checkpoint else None,
        "differences": diffs,
        "notes": plan.notes,
    }
    if not as_json:
        what = f"trial {trial_id} (experiment {plan.experiment_id})"
        if plan.differences:
            click.echo(f"differs now from the record of {what}:")
            for line in render_differences(plan.differences):
                click.echo(f"  {line}")
        else:
            click.echo(f"nothing differs now from the record of {what} (packages, modules, data)")
        for note in plan.notes:
            click.echo(f"note: {note}")
    if dry_run:
        if as_json:
            echo_json({"dry_run": True, **facts})
        else:
            click.echo(
                f"would launch: {plan.cfg.name}, seed {plan.seed}, max_length {plan.max_length},"
                f" hparams {plan.hparams}, code {plan.code_dir}"
                + (f", from checkpoint {plan.checkpoint}" if plan.checkpoint else "")
            )
        return
    result = do_reproduce(store, pool_for(store), plan)
    if as_json:
        echo_json(
            {
                "experiment_id": result.experiment_id,
                "slurm_job_ids": result.job_ids,
                "trial_id": result.trial_id,
                **facts,
            }
        )
    else:
        jobs = sorted({j.split("_")[0] for j in result.job_ids})
        click.echo(
            f"experiment {result.experiment_id} launched: trial {result.trial_id} reproduces"
            f" trial {trial_id} (seed {plan.seed}) in job(s) {', '.join(jobs) or '-'}"
        )


@click.command("diff")
@click.argument("trial_a", type=int)
@click.argument("trial_b", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print {a, b, differences: [...]}.")
@site_option
def diff(trial_a: int, trial_b: int, as_json: bool, site: str | None) -> None:
    """The differences between the records of TRIAL_A and TRIAL_B: code, config,
    hyperparameters, seed, packages, modules, nodes, CPU, GPU/driver, env, data."""
    store = open_store(site)
    diffs = diff_trials(store, trial_a, trial_b)
    if as_json:
        echo_json({"a": trial_a, "b": trial_b, "differences": [d.as_dict() for d in diffs]})
        return
    click.echo(f"trial {trial_a} -> trial {trial_b}: {len(diffs)} difference(s)")
    for line in render_differences(diffs):
        click.echo(f"  {line}")


COMMANDS = [reproduce, diff]
