"""End to end: the service as a real server on a loopback port, a host client feeding the shipped
real session over HTTP on its (compressed) timeline, a question, the status, and the spans the
JSONL exporter wrote: one per chunk with the attributes the issue names, costs that match the ration."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow.adapters.telemetry import read_jsonl
from shadow.adapters.timeline import replay_timeline
from shadow.adapters.transcripts import demo_transcript, render_turns
from shadow.api.app import create_app
from shadow.api.client import ShadowClient, ShadowHTTPError
from shadow.api.server import BackgroundServer
from tests.conftest import GRID, make_container, make_settings, wait_until

CHUNK_ATTRIBUTES = {"gen_ai.conversation.id", "gen_ai.request.model", "gen_ai.usage.input_tokens",
                    "shadow.window", "shadow.chunk.first_row", "shadow.chunk.rows", "shadow.chunk.device_ms",
                    "shadow.backlog_after"}


def test_a_host_feeds_a_real_session_over_http_and_the_spans_match(checkpoint: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    settings = make_settings(checkpoint, tmp_path, grid=GRID, trace="jsonl", trace_file=str(trace),
                             idle_poll_s=0.05, idle_window_s=2.0)
    turns = render_turns(demo_transcript())
    container = make_container(settings)
    with BackgroundServer(create_app(container)) as server, ShadowClient(server.url) as host:
        assert server.port != settings.port and server.host == "127.0.0.1"
        wait_until(lambda: host.status().slot.state == "loaded", "the model to load")
        reports = replay_timeline(host, "demo", turns, GRID, speed=5.0)
        wait_until(lambda: host.status().sessions["demo"].backlog < GRID, "the idle window to catch up")
        answer = host.ask("demo", "Did the agent finish? A: yes, B: no. Answer with the letter.", ["A", "B"])
        status = host.status()
        with pytest.raises(ShadowHTTPError) as err:
            host.ask("nobody", "?", ["A"])
        assert err.value.status_code == 404
    spans = read_jsonl(trace)  # the server's stop flushed and shut the exporter

    session = status.sessions["demo"]
    held = len(turns[-1].prompt_ids) + len(turns[-1].output_ids)
    assert session.ids == held and session.committed == held // GRID * GRID
    assert answer.behind == session.backlog and status.answers[-1].label == answer.label
    assert status.host.finished_turns == len(turns) and status.host.running == 0

    # one span per chunk read, with every attribute, from both windows
    chunks = [s for s in spans if s["name"] == "shadow.chunk"]
    windows = status.windows
    assert len(chunks) == windows.idle.chunks + windows.ration.chunks
    by_window = {w: [s for s in chunks if s["attributes"]["shadow.window"] == w] for w in ("idle", "ration")}
    assert len(by_window["idle"]) == windows.idle.chunks > 0
    assert len(by_window["ration"]) == windows.ration.chunks > 0
    for s in chunks:
        a = s["attributes"]
        assert set(a) >= CHUNK_ATTRIBUTES, set(a) ^ CHUNK_ATTRIBUTES
        assert a["gen_ai.conversation.id"] == "demo"
        assert a["shadow.chunk.rows"] == GRID == a["gen_ai.usage.input_tokens"]
        assert a["shadow.chunk.first_row"] % GRID == 0 and a["shadow.chunk.device_ms"] > 0
        assert a["shadow.backlog_after"] >= 0 and s["end_ns"] >= s["start_ns"]
    last_committed = max(a["shadow.chunk.first_row"] + GRID for a in (s["attributes"] for s in chunks))
    assert last_committed == session.committed
    assert sum(s["attributes"]["shadow.chunk.device_ms"] for s in chunks) == pytest.approx(
        windows.idle.spent_ms + windows.ration.spent_ms, rel=1e-6, abs=1e-3)

    # the ration, read from the spans: one ration for the device, within its share of the time during which
    # a turn decoded (the turns come one after the other here), plus one chunk; the unspent part of
    # one turn's may be spent at the next's rounds
    longest = max(s["attributes"]["shadow.chunk.device_ms"] for s in chunks)
    slices = [s for s in spans if s["name"] == "shadow.ration"]
    # a turn decodes from its first token until it finishes (HostActivity.decoding_s counts that span)
    decoding_ms = sum((r.turn.finished_s or 0.0) - (r.turn.first_token_s or 0.0) for r in reports) * 1e3
    ration_ms = sum(s["attributes"]["shadow.chunk.device_ms"] for s in by_window["ration"])
    assert ration_ms <= settings.ration * decoding_ms + longest
    for r in reports:
        assert r.turn is not None
        rid = r.turn.request_id
        mine = [s for s in by_window["ration"] if s["attributes"]["shadow.request.id"] == rid]
        spent_ms = sum(s["attributes"]["shadow.chunk.device_ms"] for s in mine)
        assert spent_ms == pytest.approx(r.turn.spent_s * 1e3, abs=1e-6) == pytest.approx(r.ration_spent_ms)
        for sl in (s for s in slices if s["attributes"]["shadow.request.id"] == rid):
            children = [s for s in mine if s["parent_id"] == sl["span_id"]]
            a = sl["attributes"]
            assert a["shadow.ration.chunks"] == len(children)
            assert a["shadow.ration.spent_ms"] == pytest.approx(sum(
                c["attributes"]["shadow.chunk.device_ms"] for c in children))
            assert a["shadow.ration.budget_ms"] <= 150.0
    assert any(r.fresh for r in reports[1:]) or windows.ration.chunks  # the windows did read
    asked, failed = (s for s in spans if s["name"] == "shadow.ask")
    assert failed["status"] == "ERROR" and failed["attributes"]["gen_ai.conversation.id"] == "nobody"
    assert asked["attributes"]["shadow.ask.label"] == answer.label
    assert asked["attributes"]["gen_ai.operation.name"] == "chat"
