"""The second chaos campaign: a hostile cluster under an ASHA experiment (see
docs/CHAOS.md). The digits example searched by ``asha`` (trials pause at their rungs,
checkpoint, and are promoted into new tasks) is reconciled by two login nodes' loops
at once (:mod:`tests.integration.chaos_ticker`: one on a clock minutes off, one on a
slow filesystem) while :class:`~tests.integration.chaos_infra.InfraDriver` stops the
controller, the accounting daemon and a node; then
:func:`~tests.integration.chaos_infra_checks.check_infra_campaign`. As a script, a
longer one::

    python -m tests.integration.chaos_infra_campaign --long [--seed N] [--keep] [--json PATH]
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration._reference import DIGITS
from tests.integration.chaos import DEFAULT_SEED
from tests.integration.chaos_campaign import campaign_script, live_job_ids
from tests.integration.chaos_cluster import cluster_healthy, restore_cluster
from tests.integration.chaos_infra import InfraDriver
from tests.integration.chaos_ticker import Pass, read_passes
from tests.integration.conftest import REPO, Cli

__all__ = ["InfraConfig", "InfraResult", "main", "run_infra_campaign"]


@dataclass(frozen=True)
class InfraConfig:
    """An ASHA search of the digits example (rungs of 2 and 6 epochs of 23 steps,
    ``step_sleep`` s each; two trials at a time) under one round of the four faults.
    ``skew_s``: how far the first login node's clock is off (the seed picks the sign);
    ``io_delay_s``: the second's sleep per file operation."""

    seed: int = DEFAULT_SEED
    trials: int = 4
    max_length: int = 6
    divisor: int = 3
    rungs: int = 2
    concurrent: int = 2
    step_sleep: float = 0.25
    rounds: int = 1
    skew_s: float = 600.0
    io_delay_s: float = 0.02
    tick_every_s: float = 2.0
    accounting: bool = True  # False: no slurmdbd (the noacct profile), no dbd_outage
    timeout_s: float = 300.0  # after the driver is done, for the search to end
    echo: bool = False

    @property
    def signed_skew_s(self) -> float:
        return self.skew_s * random.Random(self.seed).choice((1, -1))


@dataclass
class InfraResult:
    exp_id: int
    exp: dict[str, Any]
    driver: InfraDriver
    passes: list[Pass]
    seconds: float
    workdir: Path
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)  # filled by the checks


def experiment_yaml(workdir: Path, cfg: InfraConfig) -> Path:
    exp = workdir / f"chaos-infra-{cfg.seed}.yaml"
    exp.write_text(
        f"name: chaos-infra-{cfg.seed}\nentrypoint: python train.py\nworkdir: {DIGITS}\n"
        "resources: {cpus_per_task: 1, mem: 1G, time: '00:10:00'}\n"
        "hyperparameters:\n"
        "  lr: {type: log, minval: -2.5, maxval: -1}\n"
        "  hidden: {type: int, minval: 16, maxval: 64}\n"
        "  dropout: 0.1\n  batch_size: 64\n"
        f"  step_sleep: {cfg.step_sleep}\n"
        "searcher: {name: asha, metric: val_accuracy, smaller_is_better: false, "
        f"max_trials: {cfg.trials}, max_length: {cfg.max_length}, divisor: {cfg.divisor}, "
        f"max_rungs: {cfg.rungs}, max_concurrent_trials: {cfg.concurrent}, seed: {cfg.seed}}}\n"
        "reproducibility: {seed: 7, deterministic: true}\n"
        "max_restarts: 2\n"
    )
    return exp


@contextlib.contextmanager
def login_nodes(cli: Cli, workdir: Path, cfg: InfraConfig) -> Any:
    """Two login nodes' loops (``login1`` skewed, ``login2`` on a slow filesystem),
    stopped on exit; yields the function that reads their passes."""
    stop, logs = workdir / "logins.stop", [workdir / "login1.jsonl", workdir / "login2.jsonl"]
    extra = [["--skew-s", str(cfg.signed_skew_s)], ["--io-delay-s", str(cfg.io_delay_s)]]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integration.chaos_ticker", f"login{i + 1}"]
            + ["--log", str(log), "--stop", str(stop), "--every", str(cfg.tick_every_s), *more],
            cwd=REPO,
            env=cli.env,
        )
        for i, (log, more) in enumerate(zip(logs, extra, strict=True))
    ]
    try:
        yield lambda: sorted((p for log in logs for p in read_passes(log)), key=lambda p: p.start)
    finally:
        stop.touch()
        for proc in procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_infra_campaign(cli: Cli, workdir: Path, cfg: InfraConfig) -> InfraResult:
    """Launch, start the login nodes' loops, apply the faults, wait for the search to
    end. Whatever happens, the experiment's jobs are cancelled afterwards if still
    queued, and the cluster is restored if a daemon or node is down."""
    t0 = time.monotonic()
    exp_id = int(cli.json("launch", str(experiment_yaml(workdir, cfg)))["experiment_id"])
    run_dir = Path(cli.experiment(exp_id)["run_dir"])
    db = cli.home / "dlhpc.db"
    with login_nodes(cli, workdir, cfg) as passes:
        driver = InfraDriver(
            cfg.seed,
            cli.env,
            lambda: live_job_ids(db, exp_id),
            run_dir=run_dir,
            passes_fn=passes,
            rounds=cfg.rounds,
            accounting=cfg.accounting,
            echo=cfg.echo,
        )
        try:
            driver.run()
            deadline = time.monotonic() + cfg.timeout_s
            while (exp := cli.experiment(exp_id))["state"] in ("ACTIVE", "PAUSED"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the search did not end in {cfg.timeout_s:.0f}s")
                time.sleep(2)
        except Exception as err:
            raise AssertionError(f"{err}\n{driver.format_log()}") from err
        finally:
            with contextlib.suppress(Exception):  # leave nothing of ours queued, held ones too
                left = [
                    a["job_id"] for t in cli.experiment(exp_id)["trials"] for a in t["attempts"]
                ]
                subprocess.run(["scancel", *left], env=cli.env, capture_output=True, timeout=60)
            if not cluster_healthy(cli.env):
                driver.log("restore", "cluster", detail=restore_cluster(cli.env))
    return InfraResult(exp_id, exp, driver, passes(), time.monotonic() - t0, workdir)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.integration.chaos_infra_campaign [--long] [--seed N] [--keep]
    [--json PATH]``."""
    from tests.integration.chaos_infra_checks import check_infra_campaign
    from tests.integration.conftest import current_cluster

    def config(seed: int, long: bool) -> InfraConfig:
        cfg = InfraConfig(seed=seed, accounting=current_cluster().accounting, echo=True)
        if long:
            return dataclasses.replace(
                cfg, trials=12, max_length=16, divisor=2, rungs=4, concurrent=3, rounds=3,
                timeout_s=900,
            )  # fmt: skip
        return cfg

    def run_and_check(cli: Cli, workdir: Path, cfg: InfraConfig) -> InfraResult:
        result = run_infra_campaign(cli, workdir, cfg)
        check_infra_campaign(cli, result, cfg)
        return result

    long_help = "12 trials to 16 epochs, 3 rounds"
    return campaign_script(argv, __doc__.split("\n\n")[0], long_help, config, run_and_check)


if __name__ == "__main__":
    sys.exit(main())
