"""Tags, notes and the lab index on two experiments finished on the dev cluster,
through the real ``dlhpc`` command: tag and note the experiments and a
trial, filter ``dlhpc status --tag``, and find them all, with who ran each, on the
``report --all`` pages. Bad input exits 2 and changes nothing.

Uses the session's ``finished_lab`` (only adds tags and notes: tests/integration/_lab.py);
its tags are prefixed ``pages-`` so that other lab tests' tags do not matter.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest

from dlhpc._perms import current_user
from tests.integration._lab import FinishedLab

pytestmark = pytest.mark.cluster


def _lab_state(lab: FinishedLab) -> Any:
    """Every tag and newest note of both experiments and their trials."""
    out = {}
    for exp_id in (lab.grid_id, lab.random_id):
        e = lab.cli.experiment(exp_id)
        out[exp_id] = (e["tags"], e["note"], [(t["tags"], t["note"]) for t in e["trials"]])
    return out


def test_tags_notes_status_and_the_lab_index(finished_lab: FinishedLab, tmp_path: Path) -> None:
    lab, cli = finished_lab, finished_lab.cli
    grid, rand = lab.grid_id, lab.random_id
    trial = cli.experiment(grid)["trials"][0]["id"]
    other_trial = cli.experiment(rand)["trials"][0]["id"]
    cli("tag", str(grid), "+pages-best", "+pages-digits", "-pages-draft")
    cli("tag", str(rand), "+pages-digits")
    cli("tag", str(grid), "+pages-keep", "-t", str(trial))
    cli("note", str(grid), "grid <b>beats</b> random")
    cli("note", str(grid), "-t", str(trial), "--", "-ish: the best lr")

    before = _lab_state(lab)
    for bad in (
        ("tag", str(grid), "+pages-ok", "+bad/x"),
        ("tag", str(grid), "+pages-ok", "-t", str(other_trial)),
        ("tag", "999999", "+pages-ok"),
        ("note", str(grid), "esc \x1b[31m"),
        ("note", str(rand), "x", "-t", str(trial)),
    ):
        proc = cli(*bad, check=False)
        assert proc.returncode == 2, (bad, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("error: "), proc.stderr
    assert _lab_state(lab) == before

    def listed(*tags: str) -> list[int]:
        flags = [x for t in tags for x in ("--tag", t)]
        return [e["id"] for e in cli.json("status", *flags)["experiments"]]

    assert listed("pages-best") == [grid]
    assert listed("pages-digits") == sorted([grid, rand], reverse=True)
    assert listed("pages-digits", "pages-best") == [grid]
    e = cli.experiment(grid)
    assert {"pages-best", "pages-digits"} <= set(e["tags"]) and e["user"] == current_user()
    assert e["note"]["text"] == "grid <b>beats</b> random"
    t = next(t for t in e["trials"] if t["id"] == trial)
    assert "pages-keep" in t["tags"] and t["note"]["text"] == "-ish: the best lr"
    assert "pages-best" in cli("status", str(grid)).stdout

    site = tmp_path / "site"
    cli("report", "--all", "--out-dir", str(site), "-q")
    index = (site / "index.html").read_text()
    for exp_id in (grid, rand):
        row = index[index.index(f"exp-{exp_id:06d}.html") :].split("</tr>")[0]
        assert f'<td class="user">{html.escape(current_user())}</td>' in row, row
        assert '<span class="tag">pages-digits</span>' in row
    assert f'<option value="{html.escape(current_user())}">' in index
    page = (site / f"exp-{grid:06d}.html").read_text()
    assert "grid &lt;b&gt;beats&lt;/b&gt; random" in page and "<b>beats" not in page
    assert "-ish: the best lr" in page and '<span class="tag">pages-keep</span>' in page
