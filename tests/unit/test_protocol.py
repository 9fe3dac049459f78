"""The run-folder layout is an on-disk contract between jobs and the reconciler: the
paths below are spelled out literally so that a change to them is a visible decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlhpc.protocol import layout


def test_layout_paths(tmp_path: Path) -> None:
    exp = layout.experiment_dir(tmp_path, 7)
    trial = layout.trial_dir(tmp_path, 7, 42)
    assert exp == tmp_path / "exp-000007"
    assert trial == exp / "trials" / "trial-000042"
    assert layout.experiment_file(exp) == exp / "experiment.json"
    assert layout.entry_script(exp) == exp / "entry.sh"
    assert layout.code_dir(exp) == exp / "code"
    assert layout.jobs_dir(exp) == exp / "jobs"
    assert layout.trial_file(trial) == trial / "trial.json"
    key = layout.attempt_key("123_4", 1)
    assert key == "123_4.r1"
    assert layout.attempt_dir(trial, key) == trial / "attempts" / "123_4.r1"
    ckpt = layout.checkpoint_trial_dir(tmp_path / "ck", 7, 42)
    assert ckpt == tmp_path / "ck" / "exp-000007" / "trial-000042"
    assert ckpt.parent == layout.checkpoint_experiment_dir(tmp_path / "ck", 7)
    with pytest.raises(ValueError, match="unsafe job id"):
        layout.attempt_key("1/../2", 0)


def test_stop_file_round_trip(tmp_path: Path) -> None:
    trial = layout.trial_dir(tmp_path, 1, 1)
    trial.mkdir(parents=True)
    assert not layout.stop_requested(trial)
    layout.request_stop(trial)
    assert layout.stop_requested(trial)
    assert layout.stop_file(trial) == trial / "stop.json"
    assert json.loads((trial / "stop.json").read_text()) == {"reason": "searcher"}


def test_every_protocol_module_is_under_400_lines() -> None:
    """The protocol is split by responsibility (the checkpoint format: reading in
    ``checkpoint_read``, publishing and pruning in ``checkpoint``), each module small
    enough to read whole."""
    package = Path(layout.__file__).parent
    sizes = {p.name: len(p.read_text().splitlines()) for p in package.glob("*.py")}
    assert "checkpoint_read.py" in sizes
    assert {name: n for name, n in sizes.items() if n > 400} == {}
