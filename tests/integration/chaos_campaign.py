"""A chaos campaign: the digits example launched on the dev cluster, driven by
:class:`~tests.integration.chaos_driver.ChaosDriver` while ``dlhpc tick`` runs, then
checked (:func:`check_campaign`). As a script, a longer one::

    python -m tests.integration.chaos_campaign --long [--seed N] [--keep] [--json PATH]

``--json PATH`` writes the figures of a passing run (:func:`campaign_figures`) in
the envelope of ``scripts/bench/_result.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration._reference import (
    DIGITS,
    References,
    seed_of,
    start_references,
)
from tests.integration.chaos import (
    DEFAULT_SEED,
    STEPS_PER_EPOCH,
)
from tests.integration.chaos_checks import check_campaign, read_only_db
from tests.integration.chaos_cluster import cluster_healthy, restore_cluster
from tests.integration.chaos_driver import ChaosDriver
from tests.integration.conftest import REPO, Cli

__all__ = [
    "CampaignConfig",
    "CampaignResult",
    "campaign_figures",
    "campaign_script",
    "live_job_ids",
    "run_campaign",
    "temp_workdir",
]


@dataclass(frozen=True)
class CampaignConfig:
    """A chaos run of the digits example. The defaults: about 80 s per trial
    uninterrupted (8 epochs of 23 steps, 0.4 s each), one round of the six actions."""

    seed: int = DEFAULT_SEED
    trials: int = 3
    epochs: int = 8
    step_sleep: float = 0.4
    rounds: int = 1
    lead_time_s: int = 60
    timeout_s: float = 300.0  # after the driver is done, for the trials to finish
    echo: bool = False

    @property
    def total_steps(self) -> int:
        return self.epochs * STEPS_PER_EPOCH


@dataclass
class CampaignResult:
    exp_id: int
    exp: dict[str, Any]
    driver: ChaosDriver
    seconds: float
    workdir: Path
    references: References
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # filled by the checks


def experiment_yaml(workdir: Path, cfg: CampaignConfig) -> Path:
    lr = f"{{type: log, minval: -2, maxval: -1, count: {cfg.trials}}}"
    exp = workdir / f"chaos-{cfg.seed}.yaml"
    exp.write_text(
        f"name: chaos-{cfg.seed}\nentrypoint: python train.py\nworkdir: {DIGITS}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        "hyperparameters:\n"
        f"  lr: {lr}\n"
        "  hidden: 32\n  dropout: 0.2\n  batch_size: 64\n"
        f"  step_sleep: {cfg.step_sleep}\n"
        "searcher: {name: grid, metric: val_accuracy, smaller_is_better: false, "
        f"max_length: {cfg.epochs}}}\n"
        "reproducibility: {seed: 7, deterministic: true}\n"
        f"preemption: {{lead_time: '{cfg.lead_time_s}s'}}\n"
        "max_restarts: 2\n"
    )
    return exp


def live_job_ids(db: Path, exp_id: int) -> dict[str, int]:
    """Task id -> trial id of the experiment's unfinished trials (read-only, no CLI;
    a tick's write lock is waited out)."""
    con = read_only_db(db)
    try:
        rows = con.execute(
            "SELECT a.job_id, t.id FROM attempts a JOIN trials t ON a.trial_id = t.id"
            " WHERE t.experiment_id = ? AND t.state NOT IN"
            " ('COMPLETED', 'STOPPED_EARLY', 'FAILED', 'KILLED')",
            (exp_id,),
        ).fetchall()
    finally:
        con.close()
    return {str(j): int(t) for j, t in rows}


def run_campaign(cli: Cli, workdir: Path, cfg: CampaignConfig) -> CampaignResult:
    """Launch, drive the chaos while ticking, tick until the experiment ends.

    Whatever happens, the hog jobs and the experiment's jobs are cancelled
    afterwards if still queued, and the cluster is restored if a daemon is down.
    """
    t0 = time.monotonic()
    exp_id = int(cli.json("launch", str(experiment_yaml(workdir, cfg)))["experiment_id"])
    launched = cli.experiment(exp_id)
    run_dir = Path(launched["run_dir"])
    # the uninterrupted references train meanwhile, at a lower priority
    seeds = {t["id"]: seed_of(cli, t["id"]) for t in launched["trials"]}
    refs = start_references(workdir, launched["trials"], cfg.epochs, seeds, niceness=10)
    db = cli.home / "dlhpc.db"

    def tick() -> None:
        cli("tick", "-q")

    driver = ChaosDriver(
        cfg.seed,
        cli.env,
        lambda: live_job_ids(db, exp_id),
        run_dir=run_dir,
        tick_fn=tick,
        n_trials=cfg.trials,
        rounds=cfg.rounds,
        total_steps=cfg.total_steps,
        lead_time_s=cfg.lead_time_s,
        echo=cfg.echo,
    )
    try:
        driver.run()
        exp = cli.tick_until(
            exp_id, lambda e: e["state"] not in ("ACTIVE", "PAUSED"), timeout=cfg.timeout_s
        )
    except Exception as err:
        raise AssertionError(f"{err}\n{driver.format_log()}") from err
    finally:
        with contextlib.suppress(Exception):  # leave nothing of ours queued
            left = list(live_job_ids(db, exp_id))
            left += [r.target for r in driver.records if r.kind == "hog" and r.target != "-"]
            subprocess.run(["scancel", *left], env=cli.env, capture_output=True, timeout=60)
        if not cluster_healthy(cli.env):
            driver.log("restore", "cluster", detail=restore_cluster(cli.env))
    return CampaignResult(exp_id, exp, driver, time.monotonic() - t0, workdir, refs)


@contextlib.contextmanager
def temp_workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dlhpc-chaos-"))
    try:
        yield path
    finally:
        if not keep:
            from dlhpc._perms import remove_tree

            remove_tree(path, ignore_errors=True)  # it holds read-only code snapshots


def slurm_version(env: dict[str, str]) -> str:
    """What ``scontrol --version`` says (``slurm 24.11.1``)."""
    proc = subprocess.run(
        ["scontrol", "--version"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return proc.stdout.strip()


def campaign_figures(
    args: argparse.Namespace,
    env: dict[str, str],
    cfg: Any,
    result: Any,
    total_s: float,
    load_at_start: list[float],
) -> dict[str, Any]:
    """A passing run's figures: how it was run (seed, ``--long``, the Slurm version, the
    config), what its checks counted (``result.figures``: faults survived by kind,
    trials, attempts, metric rows, rows lost, ...) and how long it took (the campaign,
    and ``total_s`` with the checks and the references) and the load average at its
    start (the envelope has it at the end)."""
    return {
        "seed": args.seed,
        "long": args.long,
        "slurm": slurm_version(env),
        "config": dataclasses.asdict(cfg),
        **result.figures,
        "campaign_s": round(result.seconds, 1),
        "total_s": round(total_s, 1),
        "loadavg_1_5_15_min_at_start": load_at_start,
    }


def write_json(path: Path, figures: dict[str, Any]) -> None:
    """``figures`` written by ``scripts/bench/_result.py``'s ``write_result``."""
    spec = importlib.util.spec_from_file_location(
        "_result", REPO / "scripts" / "bench" / "_result.py"
    )
    if spec is None or spec.loader is None:
        raise ImportError("scripts/bench/_result.py not found")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_result(path, figures)


def campaign_script(
    argv: list[str] | None,
    description: str,
    long_help: str,
    make_config: Callable[[int, bool], Any],
    run_and_check: Callable[[Cli, Path, Any], Any],
) -> int:
    """A campaign as a script: ``[--long] [--seed N] [--keep] [--json PATH]``.
    ``make_config(seed, long)`` gives its config; ``run_and_check(cli, workdir,
    config)`` runs and checks it and returns its result (``notes``, ``seconds``,
    ``figures``). 0 when it passed (then the figures are written to PATH), 1 when a
    check failed, 2 without a dev cluster."""
    from tests.integration.conftest import _slurm_env

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--long", action="store_true", help=long_help)
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (DLHPC_HOME)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write a passing run's figures there")
    args = ap.parse_args(argv)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    env = _slurm_env()
    if env is None:
        print("dev cluster not running (scripts/dev-cluster up)", file=sys.stderr)
        return 2
    cfg = make_config(args.seed, args.long)
    t0 = time.monotonic()
    with temp_workdir(args.keep) as workdir:
        cli = Cli(env, workdir / "home")
        print(f"{cfg} in {workdir}", flush=True)
        try:
            result = run_and_check(cli, workdir, cfg)
        except AssertionError as err:
            print(f"FAILED: {err}", file=sys.stderr)
            return 1
        print("\n".join(result.notes))
        print(f"PASSED in {result.seconds:.0f}s (seed {cfg.seed})")
    if args.json is not None:
        total_s = time.monotonic() - t0
        write_json(args.json, campaign_figures(args, env, cfg, result, total_s, load_at_start))
        print(f"figures written to {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.integration.chaos_campaign [--long] [--seed N] [--keep]
    [--json PATH]``."""

    def config(seed: int, long: bool) -> CampaignConfig:
        if long:
            return CampaignConfig(
                seed=seed, trials=4, epochs=30, rounds=3, timeout_s=900, echo=True
            )
        return CampaignConfig(seed=seed, echo=True)

    def run_and_check(cli: Cli, workdir: Path, cfg: CampaignConfig) -> CampaignResult:
        result = run_campaign(cli, workdir, cfg)
        check_campaign(cli, result, cfg)
        return result

    long_help = "4 trials, 30 epochs, 3 rounds (~12 min)"
    return campaign_script(argv, __doc__.split("\n\n")[0], long_help, config, run_and_check)


if __name__ == "__main__":
    sys.exit(main())
