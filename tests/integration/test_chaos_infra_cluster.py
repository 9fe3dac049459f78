"""A hostile cluster under an ASHA experiment: the controller, the accounting daemon
and a node fail while two login nodes reconcile at once, and nothing is lost.

:mod:`tests.integration.chaos_infra_campaign` launches the digits example searched
by ``asha`` (trials pause at a rung of 2 epochs; the best are promoted to 6), starts two
login nodes' reconciler loops (one on a clock 10 minutes off, one on a slow
filesystem), and applies a seeded plan of four faults: slurmctld stopped for two
passes, slurmctld restarted with jobs running, slurmdbd stopped while a task ends, a
node set DOWN with its tasks. :func:`~tests.integration.chaos_infra_checks.
check_infra_campaign` then asserts what docs/CHAOS.md lists.

In the three default parts of ``scripts/test`` (``profile("default")``: 22.05's whole
suite, 24.11-default and 26.05-default). ``DLHPC_CHAOS_SEED`` picks another seed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.chaos import DEFAULT_SEED
from tests.integration.chaos_infra import FAULTS, make_fault_plan
from tests.integration.chaos_infra_campaign import InfraConfig, run_infra_campaign
from tests.integration.chaos_infra_checks import check_infra_campaign
from tests.integration.conftest import Cli


def test_fault_plan_is_a_function_of_the_seed_and_covers_every_fault() -> None:
    for seed in (0, 1, DEFAULT_SEED):
        plan = make_fault_plan(seed)
        assert plan == make_fault_plan(seed)
        assert sorted(f.kind for f in plan) == sorted(FAULTS)
    assert [f.kind for f in make_fault_plan(1)] != [f.kind for f in make_fault_plan(2)]
    long = make_fault_plan(5, rounds=3)
    assert all(sorted(f.kind for f in long[i : i + 4]) == sorted(FAULTS) for i in (0, 4, 8))
    noacct = make_fault_plan(5, accounting=False)
    assert sorted(f.kind for f in noacct) == sorted(set(FAULTS) - {"dbd_outage"})


@pytest.mark.cluster
@pytest.mark.profile("default")
@pytest.mark.needs("root", "accounting")  # stops daemons through their pid files
def test_asha_survives_a_hostile_cluster_bitwise_and_exactly_once(cli: Cli, tmp_path: Path) -> None:
    cfg = InfraConfig(seed=int(os.environ.get("DLHPC_CHAOS_SEED", DEFAULT_SEED)), echo=True)
    result = run_infra_campaign(cli, tmp_path, cfg)
    print(result.driver.format_log())  # shown by pytest when an assertion below fails
    check_infra_campaign(cli, result, cfg)
    print(f"chaos seed {cfg.seed}: passed in {result.seconds:.0f}s", *result.notes, sep="\n")
