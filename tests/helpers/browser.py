"""A real headless Chromium (Debian's package, /usr/bin/chromium) driven over the Chrome DevTools
Protocol on a pipe (``--remote-debugging-pipe``: JSON messages ending in NUL on fds 3 and 4), so
no driver or websocket package is needed. Used to check that HTML pages render: script errors,
console errors, images that loaded."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
]
MAX_MESSAGES = 10_000  # a bound on how many messages to read while waiting for one answer
# a bound on the wait for one message: a page of the tests renders in well under a second, and a
# browser that hangs must fail the test, not stall the suite
MESSAGE_SECONDS = 120


def available() -> bool:
    return os.path.exists(CHROMIUM)


class Browser:
    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="energon-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def child_fds() -> None:
            # copies first: a pipe end may itself be fd 3 or 4 (dup2 onto itself keeps CLOEXEC)
            read_end, write_end = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=child_fds,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._received = bytearray()
        self._readable = select.poll()  # (select.select refuses descriptors past 1023)
        self._readable.register(self._from_child, select.POLLIN)
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def send(self, method: str, params: dict | None = None, session: bool = True) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session is not None:
            message["sessionId"] = self.session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        for _ in range(MAX_MESSAGES):
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise RuntimeError(f"no answer to {method}")

    def wait_for(self, method: str) -> dict:
        for event in self.events:
            if event.get("method") == method:
                return event
        for _ in range(MAX_MESSAGES):
            event = self._read()
            self.events.append(event)
            if event.get("method") == method:
                return event
        raise RuntimeError(f"no {method} event")

    def _read(self) -> dict:
        """The next message (they end in NUL), waiting at most ``MESSAGE_SECONDS`` for it."""
        deadline = time.monotonic() + MESSAGE_SECONDS
        while b"\0" not in self._received:
            left = deadline - time.monotonic()
            if not self._readable.poll(max(0.0, left) * 1000):
                raise RuntimeError(f"chromium sent nothing for {MESSAGE_SECONDS} s")
            data = os.read(self._from_child, 1 << 16)
            if not data:
                raise RuntimeError("chromium closed the pipe")
            self._received += data
        end = self._received.index(b"\0")
        message = bytes(self._received[:end])
        del self._received[: end + 1]
        return json.loads(message)

    def open(self, url: str) -> None:
        """A new page, attached, with runtime/log events on, navigated to ``url`` and loaded."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, False
        )
        self.session = attached["sessionId"]
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.send(domain)
        self.send("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Script exceptions and console/log errors seen so far."""
        out = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                out.append(details.get("exception", {}).get("description") or details["text"])
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                out.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                out.append(params["entry"].get("text", ""))
        return out

    def screenshot(self, path: str) -> None:
        import base64

        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        with open(path, "wb") as f:
            f.write(base64.b64decode(data["data"]))

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False)
        except Exception:
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._from_child)
        os.close(self._to_child)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
