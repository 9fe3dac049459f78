"""The Lightning example under ASHA on the dev cluster: weak trials stopped at their
rung, the promoted one requeued mid-rung and resumed from its verified Lightning
checkpoint, ending bitwise as an uninterrupted run; metrics in ``dlhpc status --json``.
Its default logger on, the trials' ``lightning_logs/`` land in their working folders,
and the read-only code snapshot stays the files of the launch record's manifest
(``.gitignore`` rules, a nested one with a negation, applied to both)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from dlhpc.protocol import code_dir, recorded_slug, trial_dir, work_dir
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


# files that .gitignore rules leave out of the code, and one a nested file re-includes
WORKDIR_FILES = {
    ".gitignore": "*.out\n/notes/\n",
    "sub/.gitignore": "!keep.out\n",
    "a.out": "ignored\n",
    "notes/n.txt": "ignored\n",
    "sub/b.out": "ignored\n",
    "sub/keep.out": "kept by the negation\n",
    "sub/c.txt": "kept\n",
}
CODE = {"exp.yaml", "train.py", ".gitignore", "sub/.gitignore", "sub/keep.out", "sub/c.txt"}


def _default_logger_and_ignored_files(work: Path) -> None:
    """Turn Lightning's default logger on (it writes ``lightning_logs/`` in the current
    folder; the run's weights and metrics do not change) and add :data:`WORKDIR_FILES`."""
    train = work / "train.py"
    text = train.read_text()
    assert text.count("logger=False") == 1
    train.write_text(text.replace("logger=False", "logger=True"))
    for rel, content in WORKDIR_FILES.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(content)


def _check_snapshot_and_work_folder(cli: Cli, exp_id: int, trial_id: int) -> None:
    """The snapshot is the launch record's manifest, read-only (its mode bits: what root,
    who ignores them, is shown too); the trial's logger wrote into its working folder."""
    con = sqlite3.connect(cli.home / "dlhpc.db")
    try:
        repro, run_dir = con.execute(
            "SELECT repro_json, run_dir FROM experiments WHERE id = ?", (exp_id,)
        ).fetchone()
    finally:
        con.close()
    code = code_dir(Path(run_dir))
    manifest = json.loads(repro)["code"]["manifest"]
    files = [p for p in code.rglob("*") if p.is_file()]
    shas = {
        p.relative_to(code).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }
    assert shas == manifest, sorted(shas)
    assert set(manifest) == CODE, sorted(manifest)
    writable = [str(p) for p in [code, *code.rglob("*")] if p.lstat().st_mode & 0o222]
    assert writable == []
    tdir = trial_dir(cli.home / "runs", exp_id, trial_id, recorded_slug(exp_id, run_dir))
    logs = [p for p in (work_dir(tdir) / "lightning_logs").rglob("*") if p.is_file()]
    assert logs, sorted(work_dir(tdir).rglob("*"))


def test_lightning_asha_requeued_trial_resumes_bitwise(cli: Cli, tmp_path: Path) -> None:
    require("lightning", "lightning", "sklearn")
    reference = ReferenceOnRequeue(cli, tmp_path / "ref", "lightning", 6)  # started on the requeue
    exp, victim = asha_with_one_requeue(
        cli,
        tmp_path,
        "lightning",
        HPARAMS,
        SEARCHER,
        3,
        on_requeue=reference,
        prepare=_default_logger_and_ignored_files,
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
    _check_snapshot_and_work_folder(cli, exp["id"], victim)
