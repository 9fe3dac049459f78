"""Adaptive search on the real dev Slurm cluster: the digits example under ASHA.

Weak array tasks end at their rung (PAUSED, their allocation freed) and are
stopped early; promoted trials resume from their checkpoint in a new array task
(``resumed at epoch`` in the new job's log); the best trial completes; every
promotion and stop is a decision with a measured latency. A second experiment
uses ``stop_once`` so weak trials are stopped while their jobs run.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, Cli

pytestmark = pytest.mark.cluster

DIGITS = REPO / "templates" / "examples" / "digits"


def _example(tmp_path: Path, searcher: str, step_sleep: float = 0.0) -> Path:
    d = tmp_path / "digits"
    d.mkdir()
    shutil.copy(DIGITS / "train.py", d / "train.py")
    text = (DIGITS / "asha.yaml").read_text()
    head = text[: text.index("searcher:")]
    head = head.replace(
        "  batch_size: {type: categorical, vals: [32, 64, 128]}\n",
        f"  batch_size: {{type: categorical, vals: [32, 64, 128]}}\n  step_sleep: {step_sleep}\n",
    )
    (d / "exp.yaml").write_text(head + f"searcher: {searcher}\n")
    return d / "exp.yaml"


def _done(exp: dict[str, Any]) -> bool:
    return bool(exp["state"] != "ACTIVE")


@pytest.mark.smoke
def test_asha_promotes_paused_trials_from_checkpoints_and_stops_the_rest(
    cli: Cli, tmp_path: Path
) -> None:
    yaml = _example(
        tmp_path,
        "{name: asha, metric: val_accuracy, smaller_is_better: false, max_trials: 9,"
        " max_length: 9, divisor: 3, max_rungs: 3, max_concurrent_trials: 4, seed: 3}",
    )
    exp_id = cli.json("launch", str(yaml))["experiment_id"]
    exp = cli.tick_until(exp_id, _done, timeout=600)
    assert exp["state"] == "COMPLETED", exp
    states = [t["state"] for t in exp["trials"]]
    assert len(states) == 9 and states.count("COMPLETED") == 1, states
    assert states.count("STOPPED_EARLY") == 8
    (best,) = [t for t in exp["trials"] if t["state"] == "COMPLETED"]
    assert best["steps_completed"] == 9
    assert best["best_metric"] == max(t["best_metric"] for t in exp["trials"])

    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        grants = sorted(r[0] for r in con.execute("SELECT max_length FROM trials"))
        assert grants == [1] * 6 + [3] * 2 + [9]  # rung sizes 9, 3, 1
        rows = con.execute(
            "SELECT kind, length, result_time, acted_at FROM decisions ORDER BY id"
        ).fetchall()
        promotes = sorted(length for kind, length, _, _ in rows if kind == "promote")
        assert promotes == [3, 3, 3, 9]
        assert all(acted is not None and result is not None for _, _, result, acted in rows)
        # the best trial ran three array tasks: rung 1, then resumed for 3, then for 9
        attempts = con.execute(
            "SELECT job_id, cause, log_path FROM attempts WHERE trial_id = ? ORDER BY id",
            (best["id"],),
        ).fetchall()
    finally:
        con.close()
    assert [cause for _, cause, _ in attempts] == ["paused", "paused", "completed"]
    assert len({job for job, _, _ in attempts}) == 3
    for _, _, log in attempts[1:]:
        assert "resumed at epoch" in Path(log).read_text(), log
    text = cli("status", str(exp_id)).stdout
    assert "STOPPED_EARLY" in text and "decision" in text.lower()


def test_asha_stop_once_stops_weak_trials_while_their_jobs_run(cli: Cli, tmp_path: Path) -> None:
    yaml = _example(
        tmp_path,
        "{name: asha, stop_once: true, metric: val_accuracy, smaller_is_better: false,"
        " max_trials: 6, max_length: 9, divisor: 3, max_rungs: 3, max_concurrent_trials: 6,"
        " seed: 3}",
        step_sleep=0.1,  # ~2.3 s per epoch: the stop lands while the job runs
    )
    exp_id = cli.json("launch", str(yaml))["experiment_id"]
    exp = cli.tick_until(exp_id, _done, timeout=600)
    assert exp["state"] == "COMPLETED", exp
    stopped = [t for t in exp["trials"] if t["state"] == "STOPPED_EARLY"]
    assert stopped and any(t["state"] == "COMPLETED" for t in exp["trials"])
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        rows = con.execute(
            "SELECT a.exit_code, a.cause, t.steps_completed FROM attempts a"
            " JOIN trials t ON t.id = a.trial_id WHERE t.state = 'STOPPED_EARLY'"
        ).fetchall()
    finally:
        con.close()
    # the harness saw the stop file and exited at its next step (not scancel'ed)
    assert any(code == 75 and cause == "stopped" and 0 < steps < 9 for code, cause, steps in rows)
