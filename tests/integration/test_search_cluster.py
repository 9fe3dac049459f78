"""Adaptive search on the real dev Slurm cluster: the digits example.

Under the default search, weak array tasks end at their rung (PAUSED, their
allocation freed) and are stopped early; promoted trials resume from their
checkpoint in a new array task (``resumed at epoch`` in the new job's log), also
after a preemption; every promotion and stop is a decision with a measured latency.
A second experiment uses ASHA's ``stop_once`` so weak trials are stopped while their
jobs run.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration._reference import hog_argv
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


#: The search the README recommends, as a user writes it: no proposer (the default, tpe).
DEFAULT_SEARCH = (
    "{name: asha, metric: val_accuracy, smaller_is_better: false, max_trials: 9,"
    " max_length: 9, divisor: 3, max_rungs: 3, max_concurrent_trials: 4, seed: 3}"
)


def _deep(exp: dict[str, Any]) -> list[int]:
    """The trials part-way through the longest grant (past the 3-epoch rung)."""
    return [t["id"] for t in exp["trials"] if t["state"] == "RUNNING" and t["steps_completed"] >= 4]


@pytest.mark.smoke
def test_default_search_promotes_from_checkpoints_stops_and_survives_preemption(
    cli: Cli, tmp_path: Path
) -> None:
    """The default search on the digits example: weak trials end STOPPED_EARLY, promoted
    ones resume from their checkpoints in new array tasks; a high-priority job preempts
    the running trials once one is past its second rung (about 1.8 s an epoch: seconds
    before it ends), and the search goes on from their checkpoints, each metric
    recorded once."""
    exp_id = cli.json("launch", str(_example(tmp_path, DEFAULT_SEARCH, step_sleep=0.08)))[
        "experiment_id"
    ]
    exp = cli.tick_until(exp_id, lambda e: _done(e) or bool(_deep(e)), timeout=600, poll_s=1)
    assert exp["state"] == "ACTIVE", exp
    deep = _deep(exp)
    hog = subprocess.run(
        hog_argv(5), env=cli.env, capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        exp = cli.tick_until(exp_id, _done, timeout=600)
    finally:
        subprocess.run(["scancel", hog], env=cli.env, check=False)
    assert exp["state"] == "COMPLETED", exp
    states = [t["state"] for t in exp["trials"]]
    assert len(states) == 9 and set(states) == {"COMPLETED", "STOPPED_EARLY"}, states
    assert all(t["steps_completed"] == 9 for t in exp["trials"] if t["state"] == "COMPLETED")
    causes = {t["id"]: [a["cause"] for a in t["attempts"]] for t in exp["trials"]}
    # the preemption caught the trials seen past their second rung
    caught = [tid for tid in deep if "preempted" in causes[tid]]
    promoted = [tid for tid, c in causes.items() if "paused" in c[:-1]]
    assert caught and promoted, (deep, causes)

    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        (state,) = con.execute("SELECT searcher_state FROM experiments").fetchone()
        rows = con.execute("SELECT kind, result_time, acted_at FROM decisions").fetchall()
        logs = con.execute(
            "SELECT a.trial_id, a.log_path, COUNT(m.step) FROM attempts a"
            " LEFT JOIN metrics m ON m.attempt_id = a.id GROUP BY a.id ORDER BY a.id"
        ).fetchall()
        twice = con.execute(
            "SELECT trial_id, step, name FROM metrics GROUP BY trial_id, step, name"
            " HAVING COUNT(*) > 1"
        ).fetchall()
    finally:
        con.close()
    assert json.loads(state)["proposer"]["name"] == "tpe"
    assert {kind for kind, _, _ in rows} >= {"promote"}, rows
    assert all(result is not None and acted is not None for _, result, acted in rows)
    assert twice == []
    # every attempt that trained after a pause, or after the preemption of a trial past
    # its second rung, resumed from the trial's checkpoint (an attempt preempted as it
    # started trained nothing)
    for tid in {*caught, *promoted}:
        attempts = [(path, reports) for t, path, reports in logs if t == tid]
        trained = [path for path, reports in attempts[1:] if reports]
        assert trained and all("resumed at epoch" in Path(p).read_text() for p in trained), tid
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
