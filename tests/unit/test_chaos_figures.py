"""A chaos campaign's ``--json PATH``: the figures its checks counted, written in the
envelope of scripts/bench/_result.py (no cluster)."""

from __future__ import annotations

import argparse
import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration import chaos_campaign
from tests.integration.chaos_checks import Outcome


def test_the_outcome_counts_the_rows_lost_and_the_faults() -> None:
    outcome = Outcome({1: 6, 2: 2}, attempts=5, rows_expected=24, rows_found=21)
    assert outcome.figures({"node_lost": 1, "ctld_outage": 2}) == {
        "faults_survived": {"node_lost": 1, "ctld_outage": 2},
        "trials": 2,
        "attempts": 5,
        "metric_rows": 21,
        "metric_rows_expected": 24,
        "rows_lost": 3,
    }


@dataclass(frozen=True)
class _Config:
    trials: int = 4


@dataclass
class _Result:
    seconds: float = 181.96
    figures: dict[str, Any] = field(default_factory=lambda: {"trials": 4, "rows_lost": 0})


def test_the_figures_are_written_with_the_command_run_as_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = types.ModuleType("__main__")  # as ``python -m`` leaves it
    main.__file__ = "/abs/chaos_infra_campaign.py"
    main.__spec__ = types.SimpleNamespace(name="tests.integration.chaos_infra_campaign")  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["/abs/chaos_infra_campaign.py", "--json", "out.json"])
    monkeypatch.setattr(chaos_campaign, "slurm_version", lambda env: "slurm 24.11.1")
    args = argparse.Namespace(seed=7, long=False)
    figures = chaos_campaign.campaign_figures(
        args, {}, _Config(), _Result(), 215.04, [1.0, 2.0, 3.0]
    )
    out = tmp_path / "chaos" / "out.json"
    chaos_campaign.write_json(out, figures)
    record = json.loads(out.read_text())
    assert record["command"] == ("python -m tests.integration.chaos_infra_campaign --json out.json")
    assert record["result"] == {
        "seed": 7,
        "long": False,
        "slurm": "slurm 24.11.1",
        "config": {"trials": 4},
        "trials": 4,
        "rows_lost": 0,
        "campaign_s": 182.0,
        "total_s": 215.0,
        "loadavg_1_5_15_min_at_start": [1.0, 2.0, 3.0],
    }
    assert len(record["machine"]["loadavg_1_5_15_min_at_end"]) == 3
