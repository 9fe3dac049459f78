"""The lab pages in a real headless Chromium: the experiment page with its
tags, notes and model versions, and the index with its per-user filter, each holding
XSS canaries in every user string (tests/unit/_lab_pages.py). No canary may run or
become an element, the pages make no network request and log no error, and the
filter hides the other users' rows. Marked ``browser`` (skips without chromium
locally, fails in CI)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit._chromium import Chromium, chromium
from tests.unit._cli import run
from tests.unit._lab_pages import CANARIES, OTHER_USER, Lab, make_lab
from tests.unit.test_report_browser import _require_browser

pytestmark = pytest.mark.browser

# what a canary would leave behind had it run or become markup
_INJECTED = (
    "[window.__xss === undefined,"
    " document.querySelectorAll('img, script:not(:last-of-type), body svg[onload]').length,"
    " document.scripts.length]"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    _require_browser()
    with chromium() as b:
        yield b


@pytest.fixture
def pages(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Lab, Path]:
    monkeypatch.setenv("DLHPC_SITE", "local")
    lab = make_lab(home)
    assert run("note", str(lab.mine), "-t", str(lab.trials[1]), CANARIES[1]).exit_code == 0
    res = run("report", "--all", "--out-dir", str(tmp_path / "site"))
    assert res.exit_code == 0, res.output
    return lab, tmp_path / "site"


def _load(browser: Chromium, page: Path) -> None:
    url = page.resolve().as_uri()
    log = browser.load(url)
    assert log.requests and log.requests[0] == url, log.requests
    assert log.errors() == [], log.errors()
    assert log.foreign_requests() == [], log.foreign_requests()
    ran, elements, scripts = browser.evaluate(_INJECTED)
    assert ran and elements == 0 and scripts == 1, (ran, elements, scripts)


def test_experiment_page_shows_the_canaries_as_text(
    browser: Chromium, pages: tuple[Lab, Path]
) -> None:
    lab, site = pages
    _load(browser, site / f"exp-{lab.mine:06d}.html")
    text = browser.evaluate("document.body.innerText")
    for canary in CANARIES:
        assert canary in text, canary  # shown as written, never interpreted
    tags = browser.evaluate("Array.from(document.querySelectorAll('.tag'), e => e.textContent)")
    assert "best" in tags and CANARIES[1] in tags and CANARIES[2] in tags
    assert OTHER_USER in text  # a note's author
    shot = browser.screenshot()
    (site / "lab-page.png").write_bytes(shot)
    assert len(shot) > 10_000


def test_index_filters_by_user(browser: Chromium, pages: tuple[Lab, Path]) -> None:
    lab, site = pages
    _load(browser, site / "index.html")
    shown = (
        "Array.from(document.querySelectorAll('#experiments tbody tr'))"
        ".filter(r => !r.hidden).map(r => r.cells[0].textContent)"
    )
    assert sorted(browser.evaluate(shown)) == sorted([str(lab.mine), str(lab.other)])
    pick = (
        "(function(v){var f=document.getElementById('user-filter');f.value=v;"
        "f.dispatchEvent(new Event('change'));})(%s)"
    )
    browser.evaluate(pick % json.dumps(OTHER_USER))
    assert browser.evaluate(shown) == [str(lab.other)]
    browser.evaluate(pick % json.dumps("*"))
    assert len(browser.evaluate(shown)) == 2
    users = browser.evaluate(
        "Array.from(document.querySelectorAll('#experiments td.user'), e => e.textContent)"
    )
    assert OTHER_USER in users
