"""A real headless Chromium driven over the DevTools protocol (JSON over its websocket, with
trio-websocket): open a page, wait on its DOM, run a line of script, take a screenshot.

Debian's ``chromium`` (``.ci/run`` installs it): missing here, a skip that says so; under CI a
failure (``tests.external``). Waits are on the browser's own events or on a promise in the page
that a ``MutationObserver`` settles — bounded, never a sleep.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from trio_websocket import open_websocket_url

from tests import external

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1360,900",
    "--remote-debugging-port=0",
]
START_TIMEOUT = 30
WAIT = 20  # seconds a page has to show what is waited for


class BrowserError(AssertionError):
    pass


def _devtools_url(process: subprocess.Popen, timeout: float) -> str:
    """The browser's websocket address, from the line it prints when it listens."""
    found: list[str] = []
    said: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            said.append(line)
            if line.startswith("DevTools listening on "):
                found.append(line.split(" on ", 1)[1].strip())
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(timeout)
    if not found:
        raise BrowserError("chromium did not start:\n" + "".join(said[-20:]))
    return found[0]


class Tab:
    """One page target, attached (flat sessions) over the browser's socket."""

    def __init__(self, socket, session: str) -> None:
        self.socket = socket
        self.session = session
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    async def call(self, method: str, params: dict | None = None, *, within: float = WAIT):
        ident = next(self.ids)
        message = {"id": ident, "method": method, "params": params or {}}
        message["sessionId"] = self.session
        await self.socket.send_message(json.dumps(message))
        with trio.fail_after(within):
            while True:
                reply = json.loads(await self.socket.get_message())
                if reply.get("id") == ident:
                    if "error" in reply:
                        raise BrowserError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
                if "method" in reply:
                    self.events.append(reply)

    async def event(self, name: str, *, within: float = WAIT) -> dict:
        with trio.fail_after(within):
            while True:
                for i, event in enumerate(self.events):
                    if event["method"] == name:
                        del self.events[: i + 1]
                        return event
                reply = json.loads(await self.socket.get_message())
                if "method" in reply:
                    self.events.append(reply)

    async def open(self, url: str) -> None:
        """Navigate and wait for the page's load event."""
        self.events.clear()
        await self.call("Page.navigate", {"url": url})
        await self.event("Page.loadEventFired")

    async def submit(self, selector: str) -> None:
        """Click the button ``selector`` names and wait for the page its form leads to."""
        self.events.clear()
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
        await self.event("Page.loadEventFired")

    async def evaluate(self, expression: str, *, within: float = WAIT):
        result = await self.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            within=within + 5,
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}…: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, condition: str, *, what: str, within: float = WAIT) -> None:
        """Until the JavaScript ``condition`` is true of the page, re-checked on every change of
        its DOM; a failure after ``within`` seconds says ``what`` was awaited."""
        script = f"""new Promise((resolve, reject) => {{
            const check = () => {{
                try {{ return !!({condition}); }} catch (e) {{ return false; }}
            }};
            if (check()) {{ resolve(true); return; }}
            const seen = new MutationObserver(() => {{
                if (check()) {{ seen.disconnect(); resolve(true); }}
            }});
            seen.observe(document, {{subtree: true, childList: true, characterData: true,
                                     attributes: true}});
            setTimeout(() => {{ seen.disconnect(); reject(new Error("timed out")); }},
                       {int(within * 1000)});
        }})"""
        try:
            await self.evaluate(script, within=within)
        except BrowserError:
            body = await self.evaluate("document.body ? document.body.innerText : ''")
            raise BrowserError(f"the page never showed {what}; it shows:\n{body[:3000]}") from None

    async def screenshot(self, path: Path, *, dark: bool = False) -> Path:
        scheme = "dark" if dark else "light"
        await self.call(
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
        )
        shot = await self.call("Page.captureScreenshot", {"format": "png"})
        await trio.Path(path).write_bytes(base64.b64decode(shot["data"]))
        return path


@asynccontextmanager
async def chromium() -> AsyncIterator[Tab]:
    """A fresh headless Chromium (its own profile, gone afterwards) and one tab in it."""
    path = external.command("chromium")
    profile = tempfile.mkdtemp(prefix="swamp-chromium-")
    process = _start(path, profile)
    try:
        url = await trio.to_thread.run_sync(_devtools_url, process, START_TIMEOUT)
        async with open_websocket_url(url, max_message_size=64 * 1024 * 1024) as socket:
            target = await _browser_call(socket, "Target.createTarget", {"url": "about:blank"})
            attached = await _browser_call(
                socket, "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
            )
            tab = Tab(socket, attached["sessionId"])
            await tab.call("Page.enable")
            await tab.call("Runtime.enable")
            yield tab
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _start(path: str, profile: str) -> subprocess.Popen:
    return subprocess.Popen(
        [path, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


_browser_ids = itertools.count(1_000_000)


async def _browser_call(socket, method: str, params: dict) -> dict:
    ident = next(_browser_ids)
    await socket.send_message(json.dumps({"id": ident, "method": method, "params": params}))
    with trio.fail_after(WAIT):
        while True:
            reply = json.loads(await socket.get_message())
            if reply.get("id") == ident:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply["result"]
