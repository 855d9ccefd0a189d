"""A real headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages ended by a NUL byte, commands on the browser's fd 3, answers and events on its fd 4),
so the page test needs no driver and no library beyond the browser itself."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900")


def find() -> str | None:
    return next((p for p in map(shutil.which, NAMES) if p), None)


class Browser:
    def __init__(self, binary: str, profile: Path) -> None:
        self.log_path = profile.parent / f"{profile.name}.log"
        to_browser, self._commands = os.pipe()
        self._events, from_browser = os.pipe()
        # the browser wants the pipe at fds 3 and 4: bash puts them there and execs it (dash, Debian's
        # sh, takes no fd number above 9 in a redirection)
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_browser} 4>&{from_browser}', binary, *FLAGS,
             f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            pass_fds=(to_browser, from_browser), stdout=subprocess.DEVNULL,
            stderr=self.log_path.open("wb"))
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []  # every event the browser sent (``Runtime.exceptionThrown``, ...)
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout_s: float = 60.0) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._commands, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise RuntimeError(f"the browser is gone (exit {self.proc.wait(10)}): {self.log()}") from None
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\0" not in self._buffer:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"the browser did not answer {method}: exit {self.proc.poll()}: {self.log()}")
                chunk = os.read(self._events, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"the browser closed its pipe during {method}")
                self._buffer += chunk
            raw, _, self._buffer = self._buffer.partition(b"\0")
            got = json.loads(raw)
            if "method" in got:
                self.events.append(got)
            if got.get("id") == self._next:  # (other answers pass by; events are kept in ``events``)
                if "error" in got:
                    raise RuntimeError(f"{method}: {got['error']}")
                result: dict[str, Any] = got["result"]
                return result

    def log(self) -> str:
        """The end of what the browser wrote to stderr."""
        return self.log_path.read_text(errors="replace")[-2000:]

    def page(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call(method, params, self.session)

    def evaluate(self, expression: str) -> Any:
        got = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True})
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression!r} threw: {got['exceptionDetails']}")
        return got["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout_s: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout_s:g} s in the browser for {what}; it never happened")
            time.sleep(0.1)
        return value

    def errors(self) -> list[dict[str, Any]]:
        """The page's uncaught exceptions and ``console.error`` calls seen so far (after ``Runtime.enable``)."""
        self.evaluate("0")  # a round trip: events sent before it are read
        return [e for e in self.events if e["method"] == "Runtime.exceptionThrown"
                or (e["method"] == "Runtime.consoleAPICalled" and e["params"].get("type") == "error")]

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.page("Page.captureScreenshot", {"format": "png"})["data"]))
        return path

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # a browser that died already
            self.call("Browser.close", timeout_s=10.0)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._commands)
        os.close(self._events)
