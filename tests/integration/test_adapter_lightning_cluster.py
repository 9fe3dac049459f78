"""The Lightning example under ASHA on the dev cluster: weak trials stopped at their
rung, the promoted one requeued mid-rung and resumed from its verified Lightning
checkpoint, ending bitwise as an uninterrupted run; metrics in ``dlhpc status --json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration._adapters import (
    ReferenceOnRequeue,
    asha_with_one_requeue,
    attempt_exits,
    checkpoint_dir,
    db_metrics,
    job_logs,
    trial_seed,
)
from tests.integration.conftest import Cli
from tests.unit._adapters import lightning_weights_sha, require

pytestmark = pytest.mark.cluster

HPARAMS = (
    "  lr: {type: log, minval: -2.5, maxval: -1}\n"
    "  hidden: {type: int, minval: 16, maxval: 64}\n"
    "  dropout: 0.1\n  batch_size: 64\n  step_sleep: 0.1\n"  # ~2.3 s of sleep per epoch
)
# 4 trials train 2 epochs; the best one is promoted to 6 and requeued during epochs 4-5
SEARCHER = (
    "{name: asha, metric: val_accuracy, smaller_is_better: false, max_trials: 4,"
    " max_length: 6, divisor: 3, max_rungs: 2, max_concurrent_trials: 4, seed: 2}"
)


def test_lightning_asha_requeued_trial_resumes_bitwise(cli: Cli, tmp_path: Path) -> None:
    require("lightning", "lightning", "sklearn")
    reference = ReferenceOnRequeue(cli, tmp_path / "ref", "lightning", 6)  # started on the requeue
    exp, victim = asha_with_one_requeue(
        cli, tmp_path, "lightning", HPARAMS, SEARCHER, 3, on_requeue=reference
    )
    assert exp["state"] == "COMPLETED", json.dumps(exp, indent=1)
    states = sorted(t["state"] for t in exp["trials"])
    assert states == ["COMPLETED"] + ["STOPPED_EARLY"] * 3, states
    (t,) = [t for t in exp["trials"] if t["id"] == victim]
    assert t["state"] == "COMPLETED" and t["steps_completed"] == 6
    causes = [a["cause"] for a in t["attempts"]]
    assert "requeued" in causes and causes[-1] == "completed", causes
    assert t["crashes"] == 0, job_logs(cli, exp["id"])  # what the crashed attempt said
    # the adapter saw TERM, saved where needed and exited for requeue itself
    assert ("requeued", 75) in attempt_exits(cli, victim), attempt_exits(cli, victim)
    assert 0.0 < t["best_metric"] <= 1.0  # val_accuracy, reported by the callback
    page = tmp_path / "page.html"  # the report page has the curves and the other metrics
    cli("report", str(exp["id"]), "-o", str(page))
    assert "Other metrics recorded:" in page.read_text() and "train_loss" in page.read_text()

    ((ref, proc),) = reference.runs  # the uninterrupted run, with the victim's hparams and seed
    assert ref.hparams == {**t["hparams"], "step_sleep": 0.0}, (ref.hparams, t)
    assert ref.seed == trial_seed(cli, victim)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    got = lightning_weights_sha(checkpoint_dir(cli, exp["id"], victim))
    assert got == lightning_weights_sha(ref.checkpoint_dir), "final weights differ"
    metrics = db_metrics(cli, victim)
    assert metrics == ref.metrics(), "metrics differ from the uninterrupted run"
    assert set(metrics[6]) == {"train_loss", "val_loss", "val_accuracy"}
