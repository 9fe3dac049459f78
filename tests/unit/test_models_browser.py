"""The models index page (`models.html`) in a real headless Chromium: it renders,
makes no network request, and the XSS canaries in model names and notes stay text.

With ``DLHPC_DOCS_SCREENSHOTS=1`` the clean demo page's screenshot is written to
``docs/img/models-index.png`` (how that image was made); otherwise to pytest's tmp
folder. Marked ``browser`` (skips without Chromium, fails under CI).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from dlhpc.report.models_index import write_models_index
from dlhpc.store import Checkpoint, ModelVersion, Store
from tests.unit._chromium import Chromium, chromium, save_png
from tests.unit._db import add_experiment, add_trial
from tests.unit.test_report_browser import _require_browser

pytestmark = pytest.mark.browser

CANARY_NAME = '"><img src=x onerror="window.__pwned=1">'
CANARY_NOTE = (
    '<script>window.__pwned=2</script></td></tr></table><img src=x onerror="window.__pwned=3">'
)
DOCS_PNG = Path(__file__).resolve().parents[2] / "docs" / "img" / "models-index.png"


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    _require_browser()
    with chromium(width=1100, height=400) as b:
        yield b


def _models_site(tmp: Path, canaries: bool) -> Path:
    """Two experiments and their model versions (rows written directly, with no
    checkpoint folders: the CLI refuses a name like the canary, but the page must not
    trust the database)."""
    store = Store(tmp / "home")
    t0 = datetime(2026, 11, 20, 9, 30)
    with store.write() as s:
        grid = add_experiment(s, tmp, name="digits-grid", metric="val_acc", smaller_is_better=False)
        asha = add_experiment(s, tmp, name="digits-asha", metric="val_acc", smaller_is_better=False)
        trials = [add_trial(s, e, hparams_json=json.dumps({"lr": 0.01})) for e in (grid, asha)]
        rows = [
            ("digits-cnn", 1, trials[0], 115, 0.9611, "grid winner, lr 0.01", "alice"),
            (
                "digits-cnn",
                2,
                trials[1],
                243,
                0.9733,
                "ASHA rung 3; candidate for the paper",
                "bob",
            ),
            ("digits-mlp-small", 1, trials[0], 46, 0.9124, "", "alice"),
        ]
        if canaries:
            rows.append((CANARY_NAME, 1, trials[1], 7, 0.5, CANARY_NOTE, "<b>eve</b>"))
        for i, (name, version, trial, step, metric, note, user) in enumerate(rows):
            ckpt = Checkpoint(trial_id=trial.id, step=step, path=f"/ckpt/{i}", created_at=t0)
            s.add(ckpt)
            s.flush()
            s.add(
                ModelVersion(
                    name=name,
                    version=version,
                    experiment_id=trial.experiment_id,
                    trial_id=trial.id,
                    checkpoint_id=ckpt.id,
                    step=step,
                    metric=metric,
                    note=note,
                    user=user,
                    created_at=t0 + timedelta(hours=5 * i),
                )
            )
    try:
        return write_models_index(store, tmp / "site", now=t0 + timedelta(days=1))
    finally:
        store.close()


def test_models_index_renders_offline_and_canaries_stay_text(
    browser: Chromium, tmp_path: Path
) -> None:
    page = _models_site(tmp_path, canaries=True)
    log = browser.load(page.resolve().as_uri())
    assert log.errors() == [], log.errors()
    assert log.foreign_requests() == [], log.foreign_requests()  # an <img src=x> would ask
    assert browser.evaluate("window.__pwned === undefined") is True
    assert browser.evaluate("document.images.length") == 0
    headings = browser.evaluate(
        "Array.from(document.querySelectorAll('h2')).map(h => h.textContent)"
    )
    assert headings == [
        f"{CANARY_NAME} 1 version",
        "digits-cnn 2 versions",
        "digits-mlp-small 1 version",
    ]
    text = browser.evaluate("document.body.innerText")
    assert CANARY_NOTE in text and "<b>eve</b>" in text
    links = browser.evaluate("Array.from(document.links).map(a => a.getAttribute('href'))")
    assert links.count("exp-000001.html") == 2 and links.count("exp-000002.html") == 2
    assert "index.html" in links


def test_models_index_screenshot(browser: Chromium, tmp_path: Path) -> None:
    page = _models_site(tmp_path, canaries=False)
    log = browser.load(page.resolve().as_uri())
    assert log.errors() == [] and log.foreign_requests() == []
    png = browser.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(png) < 200_000, len(png)
    save_png(png, DOCS_PNG if os.environ.get("DLHPC_DOCS_SCREENSHOTS") else tmp_path / "models.png")
