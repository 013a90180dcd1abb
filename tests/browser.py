"""A real headless Chromium for page tests, driven over the DevTools protocol (aiohttp's
websocket client: no selenium, no driver binary).

`open_page(url)` loads a page and returns what a person would notice: console errors and
uncaught exceptions, each image's decoded size and box, and a full-page screenshot.
Chromium comes from Debian (`scripts/browser-setup.sh`; .ci/run runs it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


@dataclass
class PageView:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads
    images: list[dict[str, Any]] = field(default_factory=list)  # alt, complete, natural, box
    screenshot: bytes = b""
    title: str = ""


class _Cdp:
    """One DevTools session on the browser's websocket: the browser's own (session None) or a
    page's (flatten=True). Events of every session are kept in one shared list."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        events: list[dict[str, Any]],
        counter: list[int],
        session: str | None = None,
    ) -> None:
        self.ws, self.events, self.counter, self.session = ws, events, counter, session

    def page(self, session: str) -> _Cdp:
        return _Cdp(self.ws, self.events, self.counter, session)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.counter[0] += 1
        ident = self.counter[0]
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        await self.ws.send_json(msg)
        while True:
            got = await self.ws.receive_json(timeout=60)
            if got.get("id") == ident:
                if "error" in got:
                    raise RuntimeError(f"{method}: {got['error']}")
                return dict(got.get("result", {}))
            self.events.append(got)

    def own_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("sessionId") == self.session]

    async def wait_for(self, method: str, timeout: float = 60) -> None:
        async with asyncio.timeout(timeout):
            while not any(e.get("method") == method for e in self.own_events()):
                self.events.append(await self.ws.receive_json())


async def _view(ws_url: str, url: str) -> PageView:
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        browser = _Cdp(ws, [], [0])
        target = await browser.call("Target.createTarget", url="about:blank")
        attached = await browser.call(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )
        page = browser.page(attached["sessionId"])
        for domain in ("Page", "Runtime", "Log"):
            await page.call(f"{domain}.enable")
        await page.call("Page.navigate", url=url)
        await page.wait_for("Page.loadEventFired")
        view = PageView()
        for event in page.own_events():
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                view.errors.append(" ".join(str(a.get("value")) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                view.errors.append(str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                view.errors.append(str(params["entry"].get("text")))
        probe = (
            "JSON.stringify({title: document.title, images: Array.from(document.images)"
            ".map(i => {const r = i.getBoundingClientRect(); return {alt: i.alt, complete:"
            " i.complete, width: i.naturalWidth, height: i.naturalHeight, x: r.x + "
            "window.scrollX, y: r.y + window.scrollY, w: r.width, h: r.height}})})"
        )
        got = await page.call("Runtime.evaluate", expression=probe, returnByValue=True)
        data = json.loads(got["result"]["value"])
        view.title, view.images = data["title"], data["images"]
        shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        view.screenshot = base64.b64decode(shot["data"])
        for image in view.images:
            if image["w"] and image["h"]:
                clip = {k: image[k[0]] for k in ("x", "y")} | {
                    "width": image["w"],
                    "height": image["h"],
                    "scale": 1,
                }
                part = await page.call(
                    "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True
                )
                image["shot"] = base64.b64decode(part["data"])
        return view


def open_page(url: str, timeout: float = 90) -> PageView:
    """Load `url` in a fresh headless Chromium (its own profile, removed after) and look."""
    binary = chromium()
    assert binary, "no chromium here: run scripts/browser-setup.sh (Debian's chromium)"
    profile = tempfile.mkdtemp(prefix="orch-chromium-")
    errors = Path(profile, "stderr.log")
    with errors.open("w") as err:
        proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "--window-size=1200,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            env={**os.environ, "TMPDIR": profile},  # its scratch files go with the profile
        )
    try:
        ws_url, end = None, time.monotonic() + 60
        while ws_url is None and time.monotonic() < end and proc.poll() is None:
            # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/..."
            if m := re.search(r"DevTools listening on (ws://\S+)", errors.read_text()):
                ws_url = m.group(1)
            time.sleep(0.05)
        assert ws_url, f"chromium did not start its DevTools endpoint: {errors.read_text()[-2000:]}"
        return asyncio.run(asyncio.wait_for(_view(ws_url, url), timeout))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def blankness(png: bytes) -> float:
    """Share of pixels that differ from the image's most common colour (0: blank)."""
    import io

    import matplotlib.image
    import numpy as np

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3].reshape(-1, 3)
    _, counts = np.unique((pixels * 255).astype(np.uint8), axis=0, return_counts=True)
    return float(1 - counts.max() / counts.sum())


def check_page(page: Path, artefacts: Path) -> PageView:
    """The page loads in Chromium with no console error, and every figure is decoded and
    drawn (not blank on screen); the screenshot is kept in `artefacts`."""
    view = open_page(page.as_uri())
    (artefacts / "report-screenshot.png").write_bytes(view.screenshot)
    assert view.errors == []
    assert view.images, "no figure on the page"
    for image in view.images:
        assert image["complete"] and image["width"] > 100 and image["height"] > 50, image
        assert blankness(image["shot"]) > 0.01, f"{image['alt']} is blank on screen"
    assert blankness(view.screenshot) > 0.01
    return view
