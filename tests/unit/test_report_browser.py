"""A real headless Chromium opens an HTML page from file:// and we check what it shows.

Chromium is driven over the DevTools protocol (tests/unit/_chromium.py): the page must
raise no exception and log no console error, must not try a single network request
(the report is one self-contained file), and every chart (each ``svg``/``canvas`` box
on the page) must be drawn, not blank, in the screenshot. Marked ``browser``: without
chromium the test skips locally and fails in CI (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from dlhpc.cli.main import cli
from tests.unit._chromium import Chromium, chart_boxes, chromium, chromium_binary

pytestmark = pytest.mark.browser


def _require_browser() -> None:
    missing = [m for m in ("websocket", "PIL") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (pip install -e '.[dev]')")
    if chromium_binary() is None:
        pytest.skip("needs chromium (apt-get install chromium)")


def _region_stats(png: bytes, box: dict[str, float]) -> dict[str, float]:
    """How much is drawn in ``box`` of the screenshot: the pixels' spread, and the share
    of pixels that differ from the box's most common colour (its background)."""
    from PIL import Image, ImageStat

    img = Image.open(io.BytesIO(png)).convert("RGB")
    x0, y0 = max(0, int(box["x"])), max(0, int(box["y"]))
    x1 = min(img.width, int(box["x"] + box["width"]))
    y1 = min(img.height, int(box["y"] + box["height"]))
    region = img.crop((x0, y0, x1, y1))
    colours = region.getcolors(maxcolors=region.width * region.height) or []
    background = max(colours)[0] if colours else 0
    n = region.width * region.height
    saturated = sum(c for c, (r, g, b) in colours if max(r, g, b) - min(r, g, b) > 60)
    return {
        "stddev": max(ImageStat.Stat(region).stddev),
        "drawn": 1.0 - background / n if n else 0.0,
        "coloured": saturated / n if n else 0.0,
    }


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    _require_browser()
    with chromium() as b:
        yield b


def check_page(
    browser: Chromium, html: Path, shot: Path | None = None, min_charts: int = 1
) -> dict[str, Any]:
    """Load ``html`` in Chromium; assert no errors, no requests, drawn charts."""
    url = html.resolve().as_uri()
    log = browser.load(url)
    boxes = chart_boxes(browser)
    png = browser.screenshot()
    if shot is not None:
        shot.write_bytes(png)
    assert log.requests and log.requests[0] == url, log.requests  # the load itself was seen
    assert log.errors() == [], log.errors()
    assert log.foreign_requests() == [], log.foreign_requests()
    assert len(boxes) >= min_charts, boxes
    for box in boxes:
        stats = _region_stats(png, box)
        assert stats["stddev"] > 10 and stats["drawn"] > 0.01, (box, stats)
        assert stats["coloured"] > 0.001, (box, stats)  # a data series, not only axes
    return {"boxes": boxes, "png": png, "log": log}


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>t</title></head>
<body style="font-family: sans-serif">
<h1>chart</h1>
<svg id="static" width="400" height="200" viewBox="0 0 400 200">
  <line x1="30" y1="180" x2="390" y2="180" stroke="#333"/>
  <polyline fill="none" stroke="#1f77b4" stroke-width="3" points="30,170 120,90 250,60 390,20"/>
</svg>
<div id="drawn"></div>
<script>
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", "400"); svg.setAttribute("height", "200");
  const p = document.createElementNS(ns, "polyline");
  p.setAttribute("points", [0, 1, 2, 3, 4].map(i => `${20 + 90 * i},${180 - 35 * i}`).join(" "));
  p.setAttribute("fill", "none"); p.setAttribute("stroke", "#d62728");
  p.setAttribute("stroke-width", "3");
  svg.appendChild(p); document.getElementById("drawn").appendChild(svg);
  console.log("drawn");
</script>
</body></html>
"""


def test_chromium_harness_sees_charts_errors_and_requests(
    browser: Chromium, tmp_path: Path
) -> None:
    """The harness itself: a good page passes; a blank chart, a console error, an
    exception and a network request are each caught."""
    good = tmp_path / "good.html"
    good.write_text(_PAGE)
    result = check_page(browser, good, min_charts=2)
    assert len(result["boxes"]) == 2

    bad = tmp_path / "bad.html"
    bad.write_text(
        _PAGE.replace('stroke="#1f77b4"', 'stroke="none"').replace(
            'console.log("drawn");',
            'console.error("boom"); fetch("http://192.0.2.1/x").catch(() => {});'
            ' setTimeout(() => { throw new Error("late failure"); }, 10);',
        )
    )
    log = browser.load(bad.resolve().as_uri())
    boxes = chart_boxes(browser)
    png = browser.screenshot()
    assert any("boom" in e for e in log.console_errors), log
    assert any("late failure" in e for e in log.exceptions), log
    assert log.foreign_requests() == ["http://192.0.2.1/x"], log.requests
    stats = {b["id"]: _region_stats(png, b) for b in boxes}
    assert stats["static"]["coloured"] == 0.0  # the blank chart would fail check_page


# ------------------------------------------------------------ a real experiment's report


def _cli(*args: str) -> Result:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


@pytest.fixture(scope="module")
def asha_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ASHA experiment run to its end on the local backend, and its report pages."""
    tmp = tmp_path_factory.mktemp("asha")
    mp = pytest.MonkeyPatch()
    mp.setenv("DLHPC_HOME", str(tmp / "home"))
    mp.setenv("DLHPC_SITE", "local")
    try:
        (tmp / "train.py").write_text(
            "import dlhpc\n"
            "ctx = dlhpc.init()\n"
            "lr = ctx.hparams['lr']\n"
            "for step in range(1, ctx.max_length + 1):\n"
            "    loss = 1.0 / (1.0 + lr * step) + 0.01 * ctx.hparams['noise']\n"
            "    ctx.report(step, {'val_loss': loss, 'train_loss': 0.9 * loss})\n"
            "ctx.close()\n"
        )
        (tmp / "asha.yaml").write_text(
            "name: browser-asha\nentrypoint: python train.py\n"
            "hyperparameters:\n"
            "  lr: {type: log, minval: -2, maxval: 0}\n"
            "  noise: {type: double, minval: 0.0, maxval: 1.0}\n"
            "searcher: {name: asha, metric: val_loss, max_trials: 9, max_length: 9,\n"
            "           divisor: 3, max_rungs: 3, max_concurrent_trials: 4, seed: 3}\n"
        )
        exp_id = json.loads(_cli("launch", str(tmp / "asha.yaml"), "--json").output)[
            "experiment_id"
        ]
        deadline = time.monotonic() + 240
        while True:
            _cli("tick", "-q")
            exp = json.loads(_cli("status", str(exp_id), "--json").output)["experiments"][0]
            if exp["state"] != "ACTIVE":
                break
            assert time.monotonic() < deadline, exp
            time.sleep(0.3)
        assert exp["state"] == "COMPLETED", exp
        _cli("report", str(exp_id), "-o", str(tmp / "report.html"))
        _cli("report", "--all", "--out-dir", str(tmp / "all"), "-q")
    finally:
        mp.undo()
    return tmp


def test_a_generated_report_renders_offline(
    browser: Chromium, asha_report: Path, request: pytest.FixtureRequest
) -> None:
    """`dlhpc report EXP -o FILE`: charts drawn, no error, no request; the screenshot is
    kept next to the report (pytest's tmp folder) for a look."""
    shot = asha_report / "report.png"
    result = check_page(browser, asha_report / "report.html", shot=shot, min_charts=2)
    assert shot.stat().st_size > 10_000
    assert len(result["boxes"]) >= 2


def test_the_report_index_and_pages_load_offline(browser: Chromium, asha_report: Path) -> None:
    """`dlhpc report --all`: the index and every page load without errors or requests."""
    pages = sorted((asha_report / "all").glob("*.html"))
    assert any(p.name == "index.html" for p in pages) and len(pages) >= 2, pages
    for page in pages:
        overview = page.name in ("index.html", "models.html")  # tables, no charts
        check_page(browser, page, min_charts=0 if overview else 2)
