"""The report's attempt timeline: an attempt whose job setup failed (cause ``setup``,
written by the job script's setup section) has its own colour and legend entry."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from dlhpc.report._html import render_page
from dlhpc.report._load import load_page
from dlhpc.store import Store
from tests.unit.test_report import T0, _experiment, _trial


def _legend(html: str) -> dict[str, str]:
    """The timeline legend's entries: label -> class."""
    (div,) = re.findall(r'<h2>Attempts.*?<div class="legend">(.*?)</div>', html, re.S)
    return {label: cls for cls, label in re.findall(r'<span class="([^"]+)"><i></i>([^<]*)', div)}


def test_a_setup_failure_has_its_own_colour_and_label(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    exp_id = _experiment(store, tmp_path)
    _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.1, "bs": 32},
        state="COMPLETED",
        losses=[0.5],
        attempts=[(0, 1, "setup"), (2, 9, "completed")],
    )
    _trial(
        store,
        exp_id,
        tmp_path,
        hparams={"lr": 0.2, "bs": 32},
        state="FAILED",
        losses=[0.6],
        attempts=[(0, 3, "made-up")],
    )
    html = render_page(load_page(store, exp_id, T0 + timedelta(hours=3)))
    assert html.count('<rect class="c-setup"') == 1 and "attempt 1_0.r0: setup" in html
    assert re.search(r"\.c-setup\{--c:#[0-9a-f]{6}\}", html)  # a colour of its own
    legend = _legend(html)
    assert legend["setup failed (modules, environment.setup)"] == "c-setup"
    assert legend["completed"] == "c-completed"
    assert legend["other"] == "c-other"  # an unknown cause is "other", not "running"
    assert "running / not yet judged" not in legend
