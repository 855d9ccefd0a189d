"""``shadow proxy`` end to end: a scripted OpenAI-style upstream on loopback, the proxy on loopback
with the tiny model, and an httpx client replaying real sessions from ../shared/data through it.

httpx rather than the official ``openai`` client: the assertions are on the exact bytes, status and
headers the client receives, which ``openai`` parses away; httpx is already a dependency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from shadow.adapters.replay import compare
from shadow.adapters.transcripts import render_turns
from shadow.api.app import create_app
from shadow.api.server import BackgroundServer
from shadow.proxy import create_proxy_app
from tests.conftest import GRID, make_container, make_settings, wait_until
from tests.proxy.conftest import REASONING, TOOLS, chat_body, headers_of, session_of, stream_chat
from tests.proxy.upstream import MODELS, ScriptedUpstream, key, sse_chunks, whole_body


def metric(proxy: Any, family: str) -> float:
    """A counter's value as ``GET /metrics`` reports it (the in-process service's registry)."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {f.name: f for f in text_string_to_metric_families(proxy.counts.metrics.exposition().decode())}
    return sum(s.value for s in found[family].samples if s.name.endswith("_total"))

def test_a_real_session_through_the_proxy_is_byte_identical_and_exact(shared_data: Path, stack_of: Any) -> None:
    path, index, n = REASONING
    transcript = session_of(shared_data, path, index)
    requests = transcript.requests[:n]
    turns = render_turns(transcript, indices=range(n))
    stack = stack_of([transcript])
    session = "swe"
    hdr = {"X-Session-Id": session}
    with httpx.Client(timeout=120.0) as client:
        for i, req in enumerate(requests):
            if i == 1:  # the upstream breaks mid-stream: the client sees the break, then retries
                with pytest.raises(httpx.RemoteProtocolError):
                    stream_chat(client, stack.url, chat_body(req), {**hdr, "x-test-fail-after": "8"})
                stack.idle()
                half = list(stack.service.live.session_ids(session))  # the prompt and what streamed
                assert half[:len(turns[i].prompt_ids)] == turns[i].prompt_ids
                assert len(turns[i].prompt_ids) < len(half) < len(turns[i].prompt_ids) + len(turns[i].output_ids)
            if i == 2:  # the client goes away mid-stream, then retries
                with client.stream("POST", stack.url + "/v1/chat/completions", json=chat_body(req),
                                   headers={**hdr, "x-test-delay": "0.05"}) as r:
                    first = next(r.iter_raw())
                    assert first == sse_chunks(req.response)[0]
                stack.idle()
                half = list(stack.service.live.session_ids(session))
                assert half[:len(turns[i].prompt_ids)] == turns[i].prompt_ids
                assert len(half) < len(turns[i].prompt_ids) + len(turns[i].output_ids)
            status, got = stream_chat(client, stack.url, chat_body(req), hdr)
            assert status == 200
            assert got == b"".join(sse_chunks(req.response)), f"turn {i}: the bytes differ from the upstream's"
            stack.idle()
            ids = list(stack.service.live.session_ids(session))
            assert ids == turns[i].prompt_ids + turns[i].output_ids, f"turn {i}: the session's ids"
        # the headers are the upstream's (less Date, which each server stamps)
        via = client.post(stack.url + "/v1/chat/completions", json=chat_body(requests[-1], stream=False), headers=hdr)
        direct = client.post(stack.upstream_url + "/v1/chat/completions", json=chat_body(requests[-1], stream=False))
        assert via.content == direct.content == whole_body(requests[-1].response)
        assert via.status_code == direct.status_code == 200 and headers_of(via) == headers_of(direct)
        assert len(via.headers.get_list("date")) == 1
    stack.idle()
    sh = stack.service.live
    ids = list(sh.session_ids(session))
    assert ids == turns[-1].prompt_ids + turns[-1].output_ids
    wait_until(lambda: sh.session_status(session).backlog < GRID, "the idle window to catch up")
    with stack.service.hold():
        got_state, want_state = sh.export_state(session), sh.fresh_state(ids)
    assert got_state.keys() == want_state.keys()
    for name in want_state:
        assert got_state[name].equal(want_state[name]), name
    assert compare(got_state, want_state)[0]
    s = stack.service.status()
    assert s.host.running == 0 and s.host.finished_turns == n + 3
    counts = stack.proxy.counts.as_dict()
    # the broken and the abandoned turn were retried within the retry window: retries, not turns
    assert counts["turns"] == n + 1 and counts["retries"] == 2 and counts["not_followed"] == {}
    assert metric(stack.proxy, "shadow_proxy_turns") == counts["turns"]  # GET /metrics counts them too


def test_two_interleaved_sessions_without_a_header_are_told_apart_by_prefix(
        shared_data: Path, stack_of: Any) -> None:
    path, picks, n = TOOLS
    transcripts = [session_of(shared_data, path, i) for i in picks]
    stack = stack_of(transcripts)
    with httpx.Client(timeout=120.0) as client:
        for i in range(n):
            for t in transcripts:
                req = t.requests[i]
                status, got = stream_chat(client, stack.url, chat_body(req), {})
                assert status == 200 and got == b"".join(sse_chunks(req.response))
                stack.idle()
    names = stack.proxy.sessions.names()
    assert len(names) == 2
    sh = stack.service.live
    for name, t in zip(names, transcripts, strict=True):
        last = render_turns(t, indices=range(n))[-1]
        assert list(sh.session_ids(name)) == last.prompt_ids + last.output_ids == stack.proxy.sessions.ids(name)


def test_other_paths_pass_through_and_failures_are_the_upstreams(shared_data: Path, stack_of: Any) -> None:
    path, index, _ = REASONING
    transcript = session_of(shared_data, path, index)
    stack = stack_of([transcript])
    with httpx.Client(timeout=60.0) as client:
        models = client.get(stack.url + "/v1/models")
        assert models.status_code == 200 and models.content == MODELS
        echo = client.build_request("POST", stack.url + "/v1/embeddings/a%2Fb?x=1", content=b'"anything"')
        sent = [(b"Content-Type", b"application/json"), (b"X-Mixed", b"a"), (b"x-mixed", b"b")]
        # nothing but these from the client (and Host, Content-Length, which it must send)
        echo.headers = httpx.Headers([("Host", echo.headers["host"]), ("Content-Length", "10"), *sent])
        echo = client.send(echo)
        assert echo.status_code == 418 and echo.headers["x-upstream"] == "echo"
        assert echo.json() == {"path": "/v1/embeddings/a/b", "raw_path": "/v1/embeddings/a%2Fb", "query": "x=1",
                               "body": '"anything"'}
        # the request as it came: no header added (User-Agent, Accept, Accept-Encoding, ...), none lost
        upstream_saw = [(k, v) for k, v in stack.upstream.raw_headers[-1] if k not in (b"host", b"content-length")]
        assert upstream_saw == [(k.lower(), v) for k, v in sent]
        moved = client.get(stack.url + "/v1/moved")
        assert moved.status_code == 307 and moved.headers["location"] == "/v1/models"
        unknown = client.post(stack.url + "/v1/chat/completions",
                              json={"model": "qwen", "messages": [{"role": "user", "content": "not scripted"}]})
        assert unknown.status_code == 404 and unknown.content == b'{"error":"no such turn"}'
        bad = client.post(stack.url + "/v1/chat/completions", json={"model": "qwen", "messages": []})
        assert bad.status_code == 404  # forwarded although the shadow cannot follow it
        status = client.get(stack.url + "/v1/conductor/shadow/status")
        assert status.status_code == 200 and "slot" in status.json()
    stack.idle()
    assert stack.service.status().host.running == 0
    stack.proxy.upstream = "http://127.0.0.1:9"  # nothing listens on the discard port
    with httpx.Client(timeout=60.0) as client:
        gone = client.get(stack.url + "/v1/models")
    assert gone.status_code == 502 and "failed" in gone.json()["error"]["message"]


def test_the_proxy_fronts_a_shadow_in_another_process_through_the_host_protocol(
        shared_data: Path, checkpoint: Path, tmp_path: Path) -> None:
    """``--shadow URL``: the proxy tells a ``shadow serve`` over HTTP (``ShadowClient``), with the
    proxy's token; the shadow's own routes through the proxy reach that service."""
    path, index, _ = REASONING
    transcript = session_of(shared_data, path, index)
    turns = render_turns(transcript, indices=range(2))
    settings = make_settings(checkpoint, tmp_path, idle_poll_s=0.05, idle_window_s=2.0, token="s3cret")
    container = make_container(settings)
    servers = [BackgroundServer(create_app(container)),
               BackgroundServer(ScriptedUpstream({key(r.messages): r.response for r in transcript.requests}),
                                lifespan="off")]
    for s in servers:
        s.start()
    proxy = create_proxy_app(servers[1].url, make_container(settings), timeout_s=60.0, engine="transformers",
                             shadow_url=servers[0].url)
    servers.append(BackgroundServer(proxy, server_header=False, date_header=False))
    servers[2].start()
    service = container.service()
    try:
        wait_until(lambda: service.slot.state == "loaded", "the model to load")
        hdr = {"X-Session-Id": "remote", "X-Shadow-Token": "s3cret"}
        with httpx.Client(timeout=120.0) as client:
            for i, turn in enumerate(turns):
                req = transcript.requests[i]
                status, got = stream_chat(client, servers[2].url, chat_body(req), hdr)
                assert status == 200 and got == b"".join(sse_chunks(req.response))
                wait_until(lambda: proxy.in_flight == 0 and service.activity.counts()[:2] == (0, 0),
                           "the turn to finish", 60.0)
                assert list(service.live.session_ids("remote")) == turn.prompt_ids + turn.output_ids
            remote = client.get(servers[2].url + "/v1/conductor/shadow/status", headers=hdr)
            assert remote.status_code == 200 and remote.json()["host"]["finished_turns"] == 2
            assert client.get(servers[2].url + "/v1/conductor/shadow/status").status_code == 401
            gone = client.delete(servers[2].url + "/v1/conductor/shadow/sessions/remote", headers=hdr)
            assert gone.status_code == 204 and proxy.sessions.names() == []
    finally:
        for s in reversed(servers):
            s.stop()
    assert proxy.counts.as_dict()["turns"] == 2
