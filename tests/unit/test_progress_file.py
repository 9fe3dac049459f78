"""The attempt's progress.json as a TrialContext writes it (dlhpc/harness/_progress.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlhpc.harness import _progress
from dlhpc.harness._progress import Progress
from dlhpc.protocol import PROGRESS_FILE


def _read(folder: Path) -> dict[str, object]:
    body: dict[str, object] = json.loads((folder / PROGRESS_FILE).read_text())
    return body


def test_steps_are_written_at_most_every_few_seconds_a_start_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(_progress.time, "monotonic", lambda: clock[0])
    progress = Progress(tmp_path)
    progress.note(1)  # the first note is written
    assert _read(tmp_path)["step"] == 1
    progress.note(2)
    assert _read(tmp_path)["step"] == 1  # too soon
    clock[0] += _progress.PROGRESS_EVERY_S
    progress.note(None)
    assert _read(tmp_path)["step"] == 2
    progress.started(40)  # a resumed checkpoint: its work is saved
    body = _read(tmp_path)
    assert (body["step"], body["checkpoint_step"], body["start_step"]) == (40, 40, 40)
    progress.started(0)
    assert _read(tmp_path)["start_step"] == 0 and _read(tmp_path)["checkpoint_step"] == 40


def test_without_an_attempt_folder_nothing_is_written(tmp_path: Path) -> None:
    progress = Progress(None)
    progress.started(3)
    progress.note(5)
    assert (progress.step, progress.start_step) == (5, 3) and not list(tmp_path.iterdir())
