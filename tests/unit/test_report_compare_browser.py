"""The compare page in a real headless Chromium (tests/unit/_chromium.py): it renders
its charts, raises no error, makes no network request, and XSS canaries put in the
experiments' names, a metric name, hyperparameter names and values and the launch
record show as text and never run. Marked ``browser`` (skips locally without
chromium, fails in CI)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlhpc.report.compare import load_compare, write_compare
from dlhpc.store import Experiment, Store
from tests.unit._chromium import Chromium, chromium
from tests.unit.test_report import _experiment, _trial
from tests.unit.test_report_browser import _require_browser, check_page

pytestmark = pytest.mark.browser

CANARIES = (
    "<script>window.__xss=1</script>",
    '"><img src=x onerror="window.__xss=2">',
    '\'><svg onload="window.__xss=3">',
    "</title><script>window.__xss=4</script>",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    _require_browser()
    with chromium() as b:
        yield b


def _hostile_pages(store: Store, root: Path) -> tuple[Path, Path]:
    """A page comparing two experiments and one comparing two trials, canaries in
    every user string that reaches them."""
    c0, c1, c2, c3 = CANARIES
    space = {
        "lr": {"type": "log", "minval": -4, "maxval": -1},
        c2: {"type": "categorical", "vals": [c3, c1]},
        "width": {"type": "int", "minval": 16, "maxval": 128},
    }
    e1 = _experiment(store, root / "a", name=c0, metric=c1, space=space)
    e2 = _experiment(store, root / "b", name=c1, metric=c1, space=space)
    with store.write() as s:
        for eid, version in ((e1, c0), (e2, "2.5")):
            e = s.get(Experiment, eid)
            assert e is not None
            e.repro_json = json.dumps({"packages": {"items": {c3: version}}})
    att = [(0.0, 10.0, "completed")]
    trials = []
    for i, eid in enumerate((e1, e2, e1, e2, e2)):
        hp = {"lr": 10 ** -(1 + i % 4), c2: CANARIES[3 - i % 2], "width": 16 * (i + 1)}
        losses = [1.0 / (k + i + 1) for k in range(6)]
        trials.append(
            _trial(
                store,
                eid,
                root,
                hparams=hp,
                state="COMPLETED",
                losses=losses,
                attempts=att,
                metric=c1,
            )  # fmt: skip
        )
    by_exp = root / "experiments.html"
    write_compare(store, load_compare(store, [e1, e2]), by_exp)
    by_trial = root / "trials.html"
    write_compare(store, load_compare(store, [], [trials[0], trials[1]]), by_trial)
    return by_exp, by_trial


def test_the_compare_page_renders_offline_and_runs_no_canary(
    browser: Chromium, tmp_path: Path
) -> None:
    store = Store(tmp_path / "home")
    for page in _hostile_pages(store, tmp_path):
        result = check_page(browser, page, shot=page.with_suffix(".png"), min_charts=2)
        charts = [b["id"] for b in result["boxes"]]
        assert any("learning curves" in c for c in charts), charts
        assert any("parallel coordinates" in c for c in charts), charts
        assert browser.evaluate("typeof window.__xss") == "undefined"
        assert browser.evaluate("document.querySelectorAll('img, script').length") == 1
        text = browser.evaluate("document.body.innerText")
        assert CANARIES[0] in text and CANARIES[1] in text, text[:400]
        shown = browser.evaluate("document.title")
        assert shown.startswith("dlhpc compare:"), shown
        lines = browser.evaluate("document.querySelectorAll('polyline.pc').length")
        assert lines == (5 if page.name == "experiments.html" else 2)
