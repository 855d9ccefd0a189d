"""Hostile and failing input on a scripted upstream: what the proxy refuses before forwarding, what it
forwards without following, and what the engine refuses or never answers. In every case the bytes
the client gets are the upstream's, and every session is left exact (equal to a fresh prefill of
its ids) or untouched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shadow.adapters.transcripts import render_turns
from shadow.api.paths import BASE
from tests.proxy.conftest import REASONING, chat_body, exact, session_of, stream_chat
from tests.proxy.upstream import INJECT_AT, sse_chunks

DEEP = 100_000


def _event(obj: str) -> bytes:
    return b"data: " + obj.encode() + b"\n\n"


BAD_EVENTS = {
    "choices-5": _event('{"choices":5}'),
    "delta-x": _event('{"choices":[{"index":0,"delta":"x"}]}'),
    "tool-calls-5": _event('{"choices":[{"index":0,"delta":{"tool_calls":5}}]}'),
    "function-x": _event('{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":"x"}]}}]}'),
    "index-list": _event('{"choices":[{"index":[1],"delta":{"content":"a"}}]}'),
    "deep": _event('{"choices":[{"index":0,"delta":{"content":' + "[" * DEEP + "]" * DEEP + "}}]}"),
}


def test_unparseable_events_are_relayed_byte_for_byte_and_the_session_stays_exact(
        shared_data: Path, stack_of: Any) -> None:
    path, index, _ = REASONING
    transcript = session_of(shared_data, path, index)
    req = transcript.requests[0]
    turn = render_turns(transcript, indices=range(1))[0]
    stack = stack_of([transcript])
    stack.upstream.inject.update(BAD_EVENTS)
    want = sse_chunks(req.response)
    with httpx.Client(timeout=120.0) as client:
        for name, event in BAD_EVENTS.items():
            status, got = stream_chat(client, stack.url, chat_body(req), {"X-Session-Id": name, "x-test-inject": name})
            assert status == 200
            assert got == b"".join(want[:INJECT_AT] + [event] + want[INJECT_AT:]), name
    stack.idle()
    for name in BAD_EVENTS:
        ids = exact(stack, name)
        # the prompt, then what the events before the bad one settled: nothing after it
        assert ids[:len(turn.prompt_ids)] == turn.prompt_ids
        assert ids == turn.prompt_ids + turn.output_ids[:len(ids) - len(turn.prompt_ids)]
        assert len(ids) < len(turn.prompt_ids) + len(turn.output_ids)
    counts = stack.proxy.counts.as_dict()
    assert counts["not_followed"] == {"unparseable_event": len(BAD_EVENTS)}
    assert counts["turns"] == len(BAD_EVENTS)
    stopped = [s for s in stack.spans.all("shadow.proxy.turn") if s.attributes["shadow.proxy.stopped"]]
    assert sorted(s.attributes["gen_ai.conversation.id"] for s in stopped) == sorted(BAD_EVENTS)
    assert {s.attributes["shadow.proxy.stopped"] for s in stopped} == {"unparseable_event"}


def test_a_session_over_its_limit_stops_following_and_the_bytes_still_flow(shared_data: Path, stack_of: Any) -> None:
    path, index, _ = REASONING
    transcript = session_of(shared_data, path, index)
    req = transcript.requests[0]
    turn = render_turns(transcript, indices=range(1))[0]
    limit = len(turn.prompt_ids) + 20
    stack = stack_of([transcript], max_session_ids=limit)
    with httpx.Client(timeout=120.0) as client:
        status, got = stream_chat(client, stack.url, chat_body(req), {"X-Session-Id": "long"})
    assert status == 200 and got == b"".join(sse_chunks(req.response))
    stack.idle()
    ids = exact(stack, "long")
    assert turn.prompt_ids == ids[:len(turn.prompt_ids)] and len(ids) <= limit
    assert ids == turn.prompt_ids + turn.output_ids[:len(ids) - len(turn.prompt_ids)]
    assert stack.proxy.counts.as_dict()["not_followed"] == {"shadow_refused": 1}
    assert stack.service.status().host.running == 0


def test_a_body_nested_100k_deep_is_forwarded_unfollowed(shared_data: Path, stack_of: Any) -> None:
    stack = stack_of([session_of(shared_data, REASONING[0], REASONING[1])])
    body = ('{"model":"qwen","messages":[{"role":"user","content":"hi"}],"x":' + "[" * DEEP + "]" * DEEP
            + "}").encode()
    with httpx.Client(timeout=60.0) as client:
        r = client.post(stack.url + "/v1/chat/completions", content=body,
                        headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.content == b'{"error":"bad body"}'  # the upstream's answer
    assert stack.upstream.requests[-1] == ("POST", "/v1/chat/completions", body)
    assert stack.proxy.counts.as_dict()["not_followed"] == {"undecodable_body": 1}
    assert stack.proxy.sessions.names() == []


def test_the_chat_route_refuses_what_the_api_refuses(shared_data: Path, stack_of: Any) -> None:
    stack = stack_of([session_of(shared_data, REASONING[0], REASONING[1])], proxy_max_body_kb=64)
    chat = stack.url + "/v1/chat/completions"
    body = json.dumps({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}).encode()
    js = {"content-type": "application/json"}
    with httpx.Client(timeout=60.0) as client:
        assert client.post(chat, content=body, headers={"content-type": "text/plain"}).status_code == 415
        assert client.post(chat, content=body, headers={**js, "origin": "https://evil.example"}).status_code == 403
        assert client.post(chat, content=body, headers={**js, "host": "evil.example"}).status_code == 400
        big = json.dumps({"model": "qwen", "messages": [{"role": "user", "content": "x" * 70_000}]}).encode()
        r = client.post(chat, content=big, headers=js)
        assert r.status_code == 413 and "QWEN38_SHADOW_PROXY_MAX_BODY_KB=64" in r.json()["detail"]
        assert client.post(chat, content=body, headers={**js, "x-session-id": "v" * 300}).status_code == 400
        not_utf8 = [*js.items(), ("x-session-id", b"\xffvictim")]
        assert client.post(chat, content=body, headers=not_utf8).status_code == 400
        status = client.get(stack.url + "/v1/conductor/proxy/status").json()
    assert stack.upstream.requests == []  # none of them reached the engine
    assert status["counts"]["refused_requests"] == {"400": 3, "403": 1, "413": 1, "415": 1}


def test_the_proxys_token_guards_every_route_and_never_reaches_the_engine(
        shared_data: Path, stack_of: Any) -> None:
    path, index, _ = REASONING
    transcript = session_of(shared_data, path, index)
    req = transcript.requests[0]
    stack = stack_of([transcript], token="s3cret")
    forwarded = [("POST", "/v1/chat/completions"), ("GET", "/v1/models")]
    own = [("GET", BASE + "/status"), ("GET", "/v1/conductor/proxy/status")]
    with httpx.Client(timeout=60.0) as client:
        for method, route in forwarded + own:
            for headers in ({}, {"x-shadow-token": "wrong"}, {"authorization": "Bearer wrong"}):
                r = client.request(method, stack.url + route, json=chat_body(req, stream=False), headers=headers)
                assert r.status_code == 401, (route, headers)
        # on forwarded paths Authorization is the engine's: the proxy's token there is X-Shadow-Token only
        for method, route in forwarded:
            r = client.request(method, stack.url + route, json=chat_body(req, stream=False),
                               headers={"authorization": "Bearer s3cret"})
            assert r.status_code == 401 and "X-Shadow-Token" in r.json()["detail"], route
            # and the page's cookie counts on the page's own reads only, never on what goes to the engine
            r = client.request(method, stack.url + route, json=chat_body(req, stream=False),
                               headers={"cookie": "shadow_token=s3cret"})
            assert r.status_code == 401, route
        # the proxy's own paths are never forwarded: a bearer token serves there, as on `shadow serve`
        for _, route in own:
            assert client.get(stack.url + route, headers={"authorization": "Bearer s3cret"}).status_code == 200
    assert stack.upstream.requests == [] and stack.proxy.sessions.names() == []
    # the openai SDK: the engine's key as api_key, the proxy's token in its own header
    sdk = openai.OpenAI(base_url=stack.url + "/v1", api_key="sk-upstream",
                        default_headers={"X-Shadow-Token": "s3cret", "X-Session-Id": "guarded"})
    reply = sdk.chat.completions.create(model="qwen", messages=req.messages)
    assert reply.choices[0].message.content == req.response["content"]
    seen = stack.upstream.headers[-1]
    assert seen["authorization"] == "Bearer sk-upstream" and "x-shadow-token" not in seen
    with httpx.Client(timeout=60.0, headers={"x-shadow-token": "s3cret"}) as client:
        assert client.get(stack.url + BASE + "/status").status_code == 200
        assert client.get(stack.url + "/v1/conductor/proxy/status").json()["counts"]["turns"] == 1
    stack.idle()
    assert stack.proxy.sessions.names() == ["guarded"]


def test_a_refused_or_unanswered_request_leaves_every_session_untouched(shared_data: Path, stack_of: Any) -> None:
    path, index, _ = REASONING
    transcript = session_of(shared_data, path, index)
    first, second = transcript.requests[:2]
    stack = stack_of([transcript])
    with httpx.Client(timeout=120.0) as client:
        assert stream_chat(client, stack.url, chat_body(first), {"X-Session-Id": "victim"})[0] == 200
        stack.idle()
        before = exact(stack, "victim")
        with stack.service.hold():
            state = stack.service.live.export_state("victim")
        refused = {**chat_body(second), "model": "no-such-model"}
        for headers in ({"X-Session-Id": "victim", "x-test-status": "400"}, {"x-test-status": "404"}):
            r = client.post(stack.url + "/v1/chat/completions", json=refused, headers=headers)
            assert r.status_code == int(headers["x-test-status"]) and r.content == b'{"error":"refused"}'
        stack.proxy.upstream = "http://127.0.0.1:9"  # nothing listens on the discard port
        for headers in ({"X-Session-Id": "victim"}, {}):
            assert client.post(stack.url + "/v1/chat/completions", json=chat_body(second),
                               headers=headers).status_code == 502
        status = client.get(stack.url + "/v1/conductor/proxy/status").json()
    stack.idle()
    assert list(stack.service.live.session_ids("victim")) == before
    with stack.service.hold():
        after = stack.service.live.export_state("victim")
    assert all(after[k].equal(state[k]) for k in state)
    assert stack.proxy.sessions.names() == ["victim"] and stack.proxy.sessions.ids("victim") == before
    counts = stack.proxy.counts.as_dict()
    assert (counts["turns"], counts["refused"], counts["unreachable"]) == (1, 2, 2)
    assert stack.service.status().host.finished_turns == 1
    # the proxy's status route shows the same counters and the table's bound
    assert status["counts"] == counts and status["engine"] == "transformers"
    shown = {k: status["sessions"][k] for k in ("index", "known", "limit", "evicted")}
    assert shown == {"index": "local", "known": 1, "limit": 1024, "evicted": 0}


def test_a_502_the_sdk_retries_twice_counts_one_turn(shared_data: Path, stack_of: Any) -> None:
    path, index, _ = REASONING
    transcript = session_of(shared_data, path, index)
    req = transcript.requests[0]
    turn = render_turns(transcript, indices=range(1))[0]
    stack = stack_of([transcript])
    sdk = openai.OpenAI(base_url=stack.url + "/v1", api_key="sk-upstream", max_retries=2,
                        default_headers={"x-test-fail-first": "2"})
    reply = sdk.chat.completions.create(model="qwen", messages=req.messages)
    assert reply.choices[0].message.content == req.response["content"]
    stack.idle()
    counts = stack.proxy.counts.as_dict()
    assert (counts["turns"], counts["retries"], counts["refused"]) == (1, 0, 2)
    assert stack.service.status().host.finished_turns == 1
    (name,) = stack.proxy.sessions.names()
    assert exact(stack, name) == turn.prompt_ids + turn.output_ids


@pytest.mark.parametrize("turns", [3])
def test_a_short_chat_is_one_session(stack_of: Any, turns: int) -> None:
    """Three turns far shorter than a chunk: each continues the last, so they are one session; a second
    chat with the same system prompt is another."""
    system = {"role": "system", "content": "You are terse."}
    chats = {}
    for who in ("a", "b"):
        messages: list[dict[str, Any]] = [system]
        for i in range(turns):
            messages = [*messages, {"role": "user", "content": f"{who}: question {i}?"}]
            chats[json.dumps(messages, sort_keys=True, ensure_ascii=False)] = {
                "role": "assistant", "content": f"{who}: answer {i}."}
            messages = [*messages, {"role": "assistant", "content": f"{who}: answer {i}."}]
    stack = stack_of([])
    stack.upstream.replies.update(chats)
    with httpx.Client(timeout=60.0) as client:
        for i in range(turns):
            for who in ("a", "b"):
                history: list[dict[str, Any]] = [system]
                for j in range(i):
                    history += [{"role": "user", "content": f"{who}: question {j}?"},
                                {"role": "assistant", "content": f"{who}: answer {j}."}]
                history.append({"role": "user", "content": f"{who}: question {i}?"})
                status, _ = stream_chat(client, stack.url, {"model": "qwen", "messages": history, "stream": True}, {})
                assert status == 200
                stack.idle()
    assert len(stack.proxy.sessions.names()) == 2
    counts = stack.proxy.counts.as_dict()
    assert (counts["turns"], counts["sessions_new"], counts["sessions_joined"]) == (2 * turns, 2, 2 * turns - 2)
    for name in stack.proxy.sessions.names():
        assert exact(stack, name) == stack.proxy.sessions.ids(name)
