"""The live page in a real headless Chromium: a service with a token on a loopback port, the page
asks for the token once, shows the session the host feeds (the shipped real session, its thoughts
summarised by the narrator) and each summary as it arrives on the event stream; a screenshot is
saved under the test's tmp folder."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shadow.adapters.transcripts import demo_transcript, render_turns
from shadow.api.app import create_app
from shadow.api.client import ShadowClient
from shadow.api.paths import BASE
from shadow.api.server import BackgroundServer
from tests.conftest import FakeClock, make_container, make_settings, wait_until

from .browser import Browser, find

GRID = 256
ROUND = 8
ROUND_S = 20.0  # Qwen's time a round on the fake clock: the share then admits a summary (tests/api/test_narrator.py)
TOKEN = "s3cret"
# where to save the docs' screenshots (docs/page-following.png, docs/page-stopped.png): set to docs/ to refresh them
SCREENSHOTS = Path(os.environ["SHADOW_SCREENSHOTS"]) if os.environ.get("SHADOW_SCREENSHOTS") else None


def feed_turn(host: ShadowClient, clock: FakeClock, rid: str, session: str, prompt: list[int],
              output: list[int]) -> None:
    host.arrived(rid)
    host.started(rid, session, ids=prompt)
    clock.advance(1.0)
    host.first_token(rid)
    rounds = [output[i:i + ROUND] for i in range(0, len(output), ROUND)]
    for ids in rounds[:-1]:
        clock.advance(ROUND_S)
        host.round_ended(rid, ids)
    host.finished(rid, rounds[-1])


@pytest.mark.slow  # a real Chromium following a live service (about 40 s of the inner loop on 2 cores)
def test_the_page_shows_the_session_and_its_narration_as_it_comes(checkpoint: Path, tmp_path: Path) -> None:
    binary = find()
    if binary is None:
        pytest.skip("no Chromium on this machine and none could be installed (Debian: apt-get install chromium; "
                    ".ci/run installs it)")
    turns = render_turns(demo_transcript())[:2]
    clock = FakeClock()  # the narrator's budget; the host's calls advance it from this thread
    settings = make_settings(checkpoint, tmp_path / "home", grid=GRID, narrator="on", narrator_max_tokens=6,
                             idle_poll_s=0.05, token=TOKEN)
    c = make_container(settings, clock)
    browser = Browser(binary, tmp_path / "chromium-profile")
    try:
        with BackgroundServer(create_app(c)) as server, ShadowClient(server.url, token=TOKEN) as host:
            wait_until(lambda: host.status().slot.state == "loaded", "the model to load")
            browser.page("Runtime.enable")  # uncaught exceptions and console errors come as events
            browser.page("Network.enable")
            browser.page("Page.navigate", {"url": server.url + "/"})
            # the page holds no data: it asks for the token, once
            browser.wait_for("(f => f !== null && getComputedStyle(f).display === 'block')"
                             "(document.getElementById('token'))", "the page to ask for the token")
            browser.evaluate(f"document.getElementById('token-value').value = {TOKEN!r};"
                             "document.getElementById('token').requestSubmit(); true")
            browser.wait_for("document.querySelector('#sessions .summary') !== null", "the sessions to show")
            wait_until(lambda: host.status().narrator.subscribers == 1, "the page's event stream")
            for k, t in enumerate(turns):
                feed_turn(host, clock, f"r{k}", "demo", t.prompt_ids, t.output_ids)
            summaries = [n.text for n in host.status().narrator.last]
            assert len(summaries) == len(turns)
            lines = browser.wait_for(
                f"document.querySelectorAll('#narration li').length === {len(turns)} && "
                "[...document.querySelectorAll('#narration li')].map(li => li.lastChild.textContent)",
                "the narration lines")
            assert sorted(lines) == sorted(summaries)
            st = host.status().sessions["demo"]
            row = browser.wait_for(  # the table refreshes every 2 s: the row once it shows the last feed
                "(() => { const r = [...document.querySelectorAll('#sessions tr')].map(tr => "
                "[...tr.cells].map(td => td.textContent.trim())).find(c => c[0] === 'demo');"
                f" return r && r[2] === '{st.ids}' ? r : null; }})()", "the session's row")
            assert row[:5] == ["demo", st.where, str(st.ids), str(st.committed), str(st.backlog)]
            summary = browser.evaluate("document.querySelector('#sessions').textContent")
            assert "ration spent" in summary and "narrator spent" in summary and "of cap" in summary
            # what it runs on as resolved (not "auto"), the narrator's state, a legend for the columns
            assert browser.evaluate("document.getElementById('device').textContent") == "cpu"
            assert browser.evaluate("document.getElementById('kernel').textContent") == "torch"
            assert browser.evaluate("document.getElementById('narrator-state').textContent").startswith("on, 2 written")
            assert "fresh: less than one" in browser.evaluate("document.querySelector('.legend').textContent")
            browser.wait_for("document.getElementById('plot-fresh').getAttribute('points').split(' ').length >= 2",
                             "the plot's fresh share")
            # the token is an HttpOnly cookie the server set: no script of the origin reads it
            jar = browser.page("Network.getCookies", {"urls": [server.url + BASE + "/live"]})["cookies"]
            [cookie] = [c for c in jar if c["name"] == "shadow_token"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/v1/conductor"
            assert "shadow_token" not in browser.evaluate("document.cookie")
            shot = browser.screenshot(tmp_path / "live.png")
            if SCREENSHOTS:
                browser.screenshot(SCREENSHOTS / "page-following.png")
            # the token was asked once: a reload opens straight away with the kept cookie, and shows the
            # summaries written before it opened
            browser.page("Page.reload")
            again = browser.wait_for(
                "document.querySelectorAll('#narration li').length === 2 && "
                "[...document.querySelectorAll('#narration li')].map(li => li.lastChild.textContent)",
                "the reloaded page's narration")
            assert again == lines
            assert browser.evaluate("getComputedStyle(document.getElementById('token')).display") == "none"
            assert browser.evaluate("document.getElementById('banner').hidden")
        # the service stopped with the page open: it says so at once, greys the data, throws nothing
        stopped = browser.wait_for("!document.getElementById('banner').hidden && "
                                   "document.getElementById('banner').textContent", "the disconnected banner", 30.0)
        assert stopped.startswith("disconnected since ")
        assert browser.evaluate("document.body.classList.contains('stale')")
        time.sleep(5)  # two more rounds of the page's reads against nothing
        assert browser.errors() == []
        if SCREENSHOTS:
            browser.screenshot(SCREENSHOTS / "page-stopped.png")
    finally:
        browser.close()
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {shot} ({BASE})")
