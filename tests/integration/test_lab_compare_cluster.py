"""`dlhpc report --compare` on the dev cluster: the two finished digits experiments of
the ``finished_lab`` fixture side by side, then two of their trials; an unknown id
exits 2 and writes nothing. Only reads the lab (and writes pages under tmp_path)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cluster


def _best(exp: dict[str, Any]) -> dict[str, Any]:
    """The experiment's best trial (val_accuracy: larger is better; ties: lower id)."""
    scored = [t for t in exp["trials"] if t["best_metric"] is not None]
    return max(scored, key=lambda t: (t["best_metric"], -t["id"]))


def test_compare_two_finished_experiments_and_two_trials(finished_lab: Any, tmp_path: Path) -> None:
    cli, grid, rand = finished_lab.cli, finished_lab.grid_id, finished_lab.random_id
    page = tmp_path / "experiments.html"
    out = cli("report", "--compare", str(grid), str(rand), "-o", str(page))
    assert f"wrote {page}" in out.stdout
    html = page.read_text()
    assert "Comparing 2 experiments" in html
    assert "digits-grid" in html and "digits-random" in html
    assert html.count('class="pc"') == 4 + 8  # a line per trial in parallel coordinates
    assert 'aria-label="learning curves of val_accuracy"' in html
    assert "lr (log)" in html  # a log-type hyperparameter on a log axis
    for exp_id in (grid, rand):  # each experiment's best trial named in the summary
        assert f"trial {_best(cli.experiment(exp_id))['id']}</td>" in html
    # the record diff: the two example files differ, their code snapshot does not
    assert re.search(r"<td>config</td><td>.*?source</td>", html)
    assert "<td>code</td>" not in html

    a = cli.experiment(grid)["trials"][0]["id"]
    b = _best(cli.experiment(rand))["id"]
    page = tmp_path / "trials.html"
    cli("report", "--compare", "-t", str(a), "-t", str(b), "-o", str(page), "-q")
    html = page.read_text()
    assert "Comparing 2 trials" in html and html.count('class="pc"') == 2
    assert f"trial {a}" in html and f"trial {b}" in html

    bad = tmp_path / "bad.html"
    proc = cli("report", "--compare", str(grid), "999999", "-o", str(bad), check=False)
    assert proc.returncode == 2 and "no experiment 999999" in proc.stderr + proc.stdout
    proc = cli(
        "report", "--compare", str(grid), "-t", str(b), "-t", str(a), "-o", str(bad), check=False
    )
    assert proc.returncode == 2 and "belongs to experiment" in proc.stderr + proc.stdout
    assert not bad.exists()
