"""Debian's chromium, headless, driven over the Chrome DevTools Protocol with aiohttp.

``launch`` starts the browser in its own session (the ``chromium`` launcher is a shell script
that does not ``exec``, so the browser is its child), reads the DevTools port it chose from
``<user-data-dir>/DevToolsActivePort``, and kills the whole process group when done.

The browser is kept on loopback: background networking, component updates and the like are
off, every host name but ``localhost`` resolves to nothing, and any non-loopback connection
goes to a proxy on 127.0.0.1:9 that is not there.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import anyio
from anyio.abc import TaskGroup

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--autoplay-policy=no-user-gesture-required",
    "--remote-debugging-port=0",
    "--remote-debugging-address=127.0.0.1",
    "--window-size=1024,800",
    "--no-first-run",
    "--no-default-browser-check",
    "--mute-audio",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--no-pings",
    "--metrics-recording-only",
    "--password-store=basic",
    "--use-mock-keychain",
    "--dns-prefetch-disable",
    "--disable-features=OptimizationHints,Translate,MediaRouter,DialMediaRouteProvider,"
    "AutofillServerCommunication,CertificateTransparencyComponentUpdater,"
    "NetworkTimeServiceQuerying",
    "--allow-browser-signin=false",
    "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
]


class CdpError(RuntimeError):
    """A DevTools command failed, or a page script threw."""


class Cdp:
    """One browser-level DevTools connection; page commands carry their ``sessionId``."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._next = 0
        self._waiting: dict[int, tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self.events: list[dict[str, Any]] = []

    async def read(self) -> None:
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            waiter = self._waiting.pop(data["id"], None) if "id" in data else None
            if waiter is not None:
                waiter[1].append(data)
                waiter[0].set()
            elif "method" in data:
                self.events.append(data)
        for event, _ in self._waiting.values():
            event.set()

    async def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        done = anyio.Event()
        box: list[dict[str, Any]] = []
        self._waiting[self._next] = (done, box)
        await self._ws.send_str(json.dumps(message))
        with anyio.fail_after(30):
            await done.wait()
        if not box:
            raise CdpError(f"{method}: the browser closed the connection")
        if "error" in box[0]:
            raise CdpError(f"{method}: {box[0]['error']}")
        result: dict[str, Any] = box[0].get("result", {})
        return result

    def console(self) -> list[str]:
        """The page's console messages, exceptions and browser log entries, in order."""
        lines = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.consoleAPICalled":
                args = [str(a.get("value", a.get("description", ""))) for a in params["args"]]
                lines.append(f"console.{params['type']}: {' '.join(args)}")
            elif event["method"] == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text")
                lines.append(f"exception: {text}")
            elif event["method"] == "Log.entryAdded":
                entry = params["entry"]
                lines.append(f"log.{entry['level']}: {entry['text']} {entry.get('url', '')}")
        return lines


class Page:
    def __init__(self, cdp: Cdp, session: str) -> None:
        self.cdp = cdp
        self.session = session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.cdp.send(method, params, session=self.session)

    async def navigate(self, url: str) -> None:
        result = await self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CdpError(f"navigating to the page failed: {result['errorText']}")

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self) -> bytes:
        result = await self.send("Page.captureScreenshot", {"format": "png"})
        return base64.b64decode(result["data"])

    async def mouse_move(self, x: float, y: float) -> None:
        await self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})


class Browser:
    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, cdp: Cdp) -> None:
        self.proc = proc
        self.log_path = log_path
        self.cdp = cdp

    async def new_page(self) -> Page:
        target = await self.cdp.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.cdp.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self.cdp, attached["sessionId"])
        for domain in ("Page", "Runtime", "Log"):
            await page.send(f"{domain}.enable")
        return page

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the browser's process group, then SIGKILL whatever is left of it."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


async def _devtools_url(profile: Path, proc: subprocess.Popen[bytes], log_path: Path) -> str:
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"chromium exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            )
        lines = port_file.read_text().splitlines() if port_file.exists() else []
        if len(lines) >= 2 and lines[0].strip().isdigit():
            return f"ws://127.0.0.1:{lines[0].strip()}{lines[1].strip()}"
        await anyio.sleep(0.1)
    raise RuntimeError(f"chromium wrote no DevToolsActivePort:\n{log_path.read_text()[-3000:]}")


@asynccontextmanager
async def launch(workdir: Path) -> AsyncIterator[Browser]:
    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "chromium.log"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        url = await _devtools_url(profile, proc, log_path)
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(url, max_msg_size=64 * 1024 * 1024) as ws,
            anyio.create_task_group() as tg,
        ):
            cdp = Cdp(ws)
            tg.start_soon(cdp.read)
            try:
                yield Browser(proc, log_path, cdp)
            finally:
                await _close(tg, ws)
    finally:
        _stop(proc)


async def _close(tg: TaskGroup, ws: aiohttp.ClientWebSocketResponse) -> None:
    with anyio.move_on_after(5, shield=True):
        await ws.close()
    tg.cancel_scope.cancel()
