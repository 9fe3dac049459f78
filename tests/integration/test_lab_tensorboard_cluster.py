"""``dlhpc tensorboard`` on the two finished digits experiments of ``finished_lab``:
every trial's points read back with TensorBoard's reader equal the database's, its
HParams session equals what ``dlhpc status --json`` says, and a second export (of
every experiment) writes nothing new."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tensorboard.plugins.hparams import metadata

from dlhpc.store import Store
from tests.unit._tb import accumulator, db_points, float32, read_points

pytestmark = pytest.mark.cluster


def _session_hparams(folder: Path) -> dict[str, Any]:
    content = accumulator(folder).PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    return {name: getattr(value, value.WhichOneof("kind")) for name, value in start.hparams.items()}


def _check_experiment(lab: Any, store: Store, exp_id: int) -> int:
    """Export one experiment; compare every trial with the DB and the status; its points."""
    out = lab.cli.json("tensorboard", str(exp_id))
    (export,) = out["experiments"]
    logdir = Path(export["logdir"])
    assert out["logdir"] == str(logdir) and out["command"].startswith("tensorboard --logdir ")
    assert out["ssh"].startswith("ssh -N -L 6006:localhost:6006 ")
    exp = lab.cli.experiment(exp_id)
    trials = {t["id"]: t for t in exp["trials"]}
    assert sorted(p.name for p in logdir.glob("trial-*")) == [
        f"trial-{t:06d}" for t in sorted(trials)
    ]
    points = 0
    for trial_id, trial in trials.items():
        folder = logdir / f"trial-{trial_id:06d}"
        got = read_points(folder)
        assert got == db_points(store, trial_id), trial_id  # every point, once
        points += sum(map(len, got.values()))
        values = [v for _, v, _ in got[exp["metric"]] if v is not None]
        assert max(values) == float32(trial["best_metric"])  # val_accuracy: larger is better
        assert max(s for pts in got.values() for s, _, _ in pts) == trial["steps_completed"]
        hparams = {k: float(v) if isinstance(v, int) else v for k, v in trial["hparams"].items()}
        assert _session_hparams(folder) == hparams
    assert export["points_written"] == points and export["trials"] == len(trials)
    return points


def test_tensorboard_files_of_both_experiments_match_the_database(finished_lab: Any) -> None:
    lab = finished_lab
    store = Store(lab.cli.home)
    grid_points = _check_experiment(lab, store, lab.grid_id)
    random_points = _check_experiment(lab, store, lab.random_id)
    assert grid_points >= 4 * 5 and random_points >= 8 * 5
    again = json.loads(lab.cli("tensorboard", "--json").stdout)  # every experiment
    assert again["logdir"] == str(lab.cli.home / "runs")
    written = {e["experiment_id"]: e["points_written"] for e in again["experiments"]}
    assert written[lab.grid_id] == 0 and written[lab.random_id] == 0
