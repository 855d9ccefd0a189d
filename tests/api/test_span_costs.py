"""The shadow's cost read back from the span file of a real service run: the service on a loopback
port, a host feeding the shipped real session over HTTP on its compressed timeline, the JSONL
exporter's file summed by ``benchmarks.spans`` and compared with what the service and the host
counted themselves."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.ab_cost.spans import costs_of, span_costs
from shadow.adapters.timeline import replay_timeline
from shadow.adapters.transcripts import demo_transcript, render_turns
from shadow.api.app import create_app
from shadow.api.client import ShadowClient
from shadow.api.server import BackgroundServer
from tests.conftest import make_container, make_settings

GRID = 64


def wait_for(ready: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_costs_per_turn_and_per_run_from_a_real_span_file(checkpoint: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    settings = make_settings(checkpoint, tmp_path, grid=GRID, trace="jsonl", trace_file=str(trace),
                             idle_poll_s=0.05, idle_window_s=2.0, ration_scope="turn", ration=0.02)
    turns = render_turns(demo_transcript())
    with BackgroundServer(create_app(make_container(settings))) as server, ShadowClient(server.url) as host:
        wait_for(lambda: host.status().slot.state == "loaded")
        reports = replay_timeline(host, "demo", turns, GRID, speed=8.0)
        wait_for(lambda: host.status().sessions["demo"].backlog < GRID)
        host.ask("demo", "Did the agent finish? A: yes, B: no.", ["A", "B"])
        status = host.status()
    costs = span_costs(trace)  # the server's stop flushed the exporter

    windows = status.windows
    for w, window in (("idle", windows.idle), ("ration", windows.ration)):  # per run, per window: the counters
        assert costs.chunks[w] == window.chunks > 0
        assert costs.device_ms[w] == pytest.approx(window.spent_ms, abs=1e-2)
    assert costs.rows == GRID * (windows.idle.chunks + windows.ration.chunks)
    demo = status.sessions["demo"]
    assert costs.rows == demo.committed + demo.reread  # rows read again after a rollback count twice
    assert dict(costs.by_session_ms) == {"demo": pytest.approx(costs.total_ms)}
    assert costs.asks == 1 and costs.ask_ms > 0

    # per turn: the ration each request spent, as the host heard it round by round
    by_request = {r.turn.request_id: r for r in reports}
    assert set(costs.by_request_ms) <= set(by_request)
    for rid, r in by_request.items():
        assert costs.by_request_ms.get(rid, 0.0) == pytest.approx(r.turn.spent_s * 1e3, abs=1e-6)
        assert costs.by_request_ms.get(rid, 0.0) == pytest.approx(r.ration_spent_ms, abs=1e-6)
    decode_s = {rid: r.turn.last_event_s - (r.turn.first_token_s or 0.0) for rid, r in by_request.items()}
    assert 0 < costs.max_chunk_ms <= costs.total_ms
    for rid, share in costs.ration_share(decode_s).items():
        assert share <= 0.02 + costs.max_chunk_ms / (1e3 * decode_s[rid])  # 2 % plus one chunk


def test_a_ration_chunk_without_its_request_is_refused() -> None:
    bad = {"name": "shadow.chunk", "span_id": "ab", "attributes": {
        "shadow.window": "ration", "shadow.chunk.device_ms": 1.0, "shadow.chunk.rows": 64,
        "gen_ai.conversation.id": "s"}}
    with pytest.raises(ValueError, match=r"span ab: a ration chunk without shadow\.request\.id"):
        costs_of([bad])
