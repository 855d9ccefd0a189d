"""The live page on `shadow proxy` (at /v1/conductor/shadow) in a real headless Chromium: the token
form sets the HttpOnly cookie through the proxy, the page shows its proxy section (upstream, engine,
turns), and the page's reads through the proxy throw nothing into the console."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shadow.api.paths import BASE
from tests.api.browser import Browser, find

TOKEN = "s3cret"


def test_the_page_on_the_proxy_shows_the_proxy(stack_of: Any, tmp_path: Path) -> None:
    binary = find()
    if binary is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")
    stack = stack_of([], token=TOKEN)
    browser = Browser(binary, tmp_path / "chromium-profile")
    try:
        browser.page("Runtime.enable")
        browser.page("Page.navigate", {"url": stack.url + BASE})
        browser.wait_for("document.getElementById('token')?.hidden === false", "the page to ask for the token")
        browser.evaluate(f"document.getElementById('token-value').value = {TOKEN!r};"
                         "document.getElementById('token').requestSubmit(); true")
        # null-safe: while the form's POST and its redirect load, the document has no such elements yet
        section = browser.wait_for("document.getElementById('proxy')?.hidden === false && "
                                   "document.getElementById('proxy-body')?.textContent", "the proxy section")
        assert f"upstream: {stack.upstream_url}" in section and "engine: transformers" in section
        assert "turns: 0" in section and "engine unreachable: 0" in section
        assert browser.evaluate("location.pathname") == BASE  # back on the page the form was posted from
        assert "shadow_token" not in browser.evaluate("document.cookie")  # HttpOnly
        assert stack.upstream.requests == []  # the page's reads are the proxy's own: none went to the engine
        assert browser.errors() == []
    finally:
        browser.close()
