#!/usr/bin/env python3
"""The screenshot of the compare page in the docs (docs/img/compare.png).

Runs the two digits examples (templates/examples/digits/grid.yaml and random.yaml,
copied into the work folder) to their end on the local site in a temporary DLHPC_HOME, writes
``dlhpc report --compare GRID RANDOM``, opens it in headless Chromium
(tests/unit/_chromium.py) and saves the page as a PNG, scaled to ``--width``
pixels and reduced to a 256-colour palette so it stays small (under 250 KB).
Needs chromium, websocket-client and Pillow (``pip install -e '.[dev]'``), and the
digits example's torch and scikit-learn.

    .venv/bin/python scripts/figures/compare_screenshot.py [--out docs/img/compare.png] [--keep DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.unit._chromium import chromium  # noqa: E402

DIGITS = REPO / "templates" / "examples" / "digits"


def dlhpc(env: dict[str, str], *args: str) -> str:
    """Run ``dlhpc ARGS`` as a user would; its stdout (raises on a failure)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dlhpc", *args], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"dlhpc {' '.join(args)} -> {proc.returncode}\n{proc.stderr}")
    return proc.stdout


def finish(env: dict[str, str], exp_ids: list[int], timeout: float = 1200.0) -> None:
    """Tick until every experiment has ended; exit unless each COMPLETED."""
    deadline = time.monotonic() + timeout
    while True:
        dlhpc(env, "tick", "-q")
        states = [
            json.loads(dlhpc(env, "status", str(e), "--json"))["experiments"][0]["state"]
            for e in exp_ids
        ]
        if "ACTIVE" not in states:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"not finished after {timeout:.0f} s: {states}")
        time.sleep(1.0)
    if any(s != "COMPLETED" for s in states):
        raise SystemExit(f"the experiments ended {states}")


def shrink(png: bytes, width: int) -> bytes:
    """``png`` scaled to ``width`` pixels wide, as a 256-colour palette PNG."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    if img.width > width:
        img = img.resize((width, round(img.height * width / img.width)), Image.LANCZOS)
    out = io.BytesIO()
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, "PNG", optimize=True)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "compare.png")
    ap.add_argument("--width", type=int, default=1000, help="pixels (default 1000)")
    ap.add_argument(
        "--keep", type=Path, help="run in this folder and keep it (default: a temp one)"
    )
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="dlhpc-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    digits = work / "digits"  # a copy: the page shows where the files were, not this checkout
    shutil.copytree(DIGITS, digits, dirs_exist_ok=True)
    env = {**os.environ, "DLHPC_HOME": str(work / "home"), "DLHPC_SITE": "local"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    ids = [
        int(
            json.loads(dlhpc(env, "launch", str(digits / f"{name}.yaml"), "--json"))[
                "experiment_id"
            ]
        )
        for name in ("grid", "random")
    ]
    finish(env, ids)
    page = work / "compare.html"
    dlhpc(env, "report", "--compare", *map(str, ids), "-o", str(page))
    with chromium(width=1100, height=900) as browser:
        log = browser.load(page.resolve().as_uri())
        if log.errors() or log.foreign_requests():
            raise SystemExit(f"the page failed: {log.errors()} {log.foreign_requests()}")
        png = shrink(browser.screenshot(), args.width)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(png)
    print(f"wrote {args.out} ({len(png) / 1024:.0f} KiB) from {page}")


if __name__ == "__main__":
    main()
