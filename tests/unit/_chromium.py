"""A headless Chromium driven over the DevTools protocol, for the report tests.

`Chromium.load(url)` opens a page in a fresh tab and records what a user would not see:
uncaught exceptions, ``console.error`` calls, browser log errors, and every network
request the page attempted. `screenshot()` returns the page as a PNG. Only the
``websocket-client`` package is needed (no Selenium, no Playwright download).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
]
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageLog:
    """What happened while a page loaded."""

    url: str
    exceptions: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for

    def errors(self) -> list[str]:
        return [*self.exceptions, *self.console_errors, *self.log_errors]

    def foreign_requests(self) -> list[str]:
        """Requests for anything but the page itself (data: URLs are no request)."""
        return [u for u in self.requests if u != self.url and not u.startswith("data:")]


class Chromium:
    """One browser process and one DevTools websocket (flattened target sessions)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900) -> None:
        import websocket  # dev dependency: websocket-client

        self._profile = tempfile.mkdtemp(prefix="dlhpc-chromium-")
        self.width, self.height = width, height
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        ws_url = self._wait_for_devtools(timeout=60.0)
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.session = ""
        self._target = ""

    def _wait_for_devtools(self, timeout: float) -> str:
        assert self.proc.stderr is not None
        found: list[str] = []

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.stderr.append(line.rstrip())
                m = _LISTENING.search(line)
                if m and not found:
                    found.append(m.group(1))

        threading.Thread(target=read, daemon=True).start()  # keeps draining stderr after
        deadline = time.monotonic() + timeout
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.stderr[-20:])
                raise RuntimeError(f"chromium did not open its DevTools port:\n{tail}")
            time.sleep(0.05)
        return found[0]

    def send(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        """Send one command (on the page session unless ``session=''``) and wait for it."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        session = kw.get("session", self.session)
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def _drain_until(self, method: str, timeout: float) -> None:
        """Read events until ``method`` arrives (or the timeout)."""
        deadline = time.monotonic() + timeout
        if any(e.get("method") == method for e in self._events):
            return
        while time.monotonic() < deadline:
            self.ws.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                event = json.loads(self.ws.recv())
            except Exception:  # websocket timeout
                break
            self._events.append(event)
            if event.get("method") == method:
                break
        self.ws.settimeout(60)

    def load(self, url: str, settle_s: float = 1.0, timeout: float = 60.0) -> PageLog:
        """Open ``url`` in a new tab, wait for its load event and ``settle_s`` more."""
        if self._target:  # one tab at a time
            self.send("Target.closeTarget", {"targetId": self._target}, session="")
        target = self.send("Target.createTarget", {"url": "about:blank"}, session="")
        self._target = target["targetId"]
        attached = self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, session=""
        )
        self.session = attached["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        self._events.clear()
        self.send("Page.navigate", {"url": url})
        self._drain_until("Page.loadEventFired", timeout)
        self._drain_until("__never__", settle_s)  # late scripts, timers, console calls
        return self._page_log(url)

    def _page_log(self, url: str) -> PageLog:
        log = PageLog(url)
        for e in self._events:
            if e.get("sessionId") != self.session:
                continue  # another tab's (or the browser's) event
            p = e.get("params", {})
            method = e.get("method")
            if method == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                log.exceptions.append(d.get("exception", {}).get("description") or d["text"])
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                args = [str(a.get("value", a.get("description", ""))) for a in p.get("args", [])]
                log.console_errors.append(" ".join(args))
            elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
                log.log_errors.append(f"{p['entry'].get('url', '')}: {p['entry']['text']}")
            elif method == "Network.requestWillBeSent":
                log.requests.append(p["request"]["url"])
            elif method == "Network.webSocketCreated":
                log.requests.append(p["url"])
        return log

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluate failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, full_page: bool = True) -> bytes:
        """The page as a PNG (the whole document when ``full_page``), CSS pixel = 1 px."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
            )
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
            params["captureBeyondViewport"] = True
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            shutil.rmtree(self._profile, ignore_errors=True)


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[Chromium]:
    binary = chromium_binary()
    if binary is None:
        raise RuntimeError("no chromium on PATH")
    browser = Chromium(binary, width, height)
    try:
        yield browser
    finally:
        browser.close()


def chart_boxes(browser: Chromium, min_w: int = 120, min_h: int = 60) -> list[dict[str, float]]:
    """Document-relative boxes of the page's charts (``svg`` and ``canvas`` elements
    at least ``min_w`` x ``min_h`` CSS pixels, not nested in another such chart)."""
    boxes: list[dict[str, float]] = browser.evaluate(
        f"""Array.from(document.querySelectorAll('svg, canvas'))
            .filter(el => !el.parentElement.closest('svg'))
            .map(el => {{ const r = el.getBoundingClientRect();
                return {{x: r.left + window.scrollX, y: r.top + window.scrollY,
                        width: r.width, height: r.height,
                        id: el.id || el.getAttribute('aria-label') || el.tagName}}; }})
            .filter(b => b.width >= {min_w} && b.height >= {min_h})"""
    )
    return boxes


def save_png(data: bytes, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
