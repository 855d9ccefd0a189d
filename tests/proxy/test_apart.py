"""Issue 56's proxy repros, each on a scripted upstream on loopback in front of the proxy and the tiny
model: names that survive a restart, twin agents that part, two engine keys kept apart, a stream
that fails after its 200, a cut reply streamed as content, id fields the engine refuses, and two
proxies on one Redis. Every session's state is ``torch.equal`` to a fresh prefill of its ids."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from shadow.adapters.transcripts import render_turns
from shadow.adapters.transcripts.model import Transcript
from shadow.api.paths import BASE
from shadow.core.session import first_difference
from tests.proxy.conftest import REASONING, TOOLS, chat_body, exact, session_of, stream_chat
from tests.proxy.test_proxy import metric
from tests.proxy.upstream import sse_chunks

CHAT = "/v1/chat/completions"


def _run(client: httpx.Client, stack: Any, req: Any, headers: dict[str, str] | None = None) -> bytes:
    status, got = stream_chat(client, stack.url, chat_body(req), headers or {})
    assert status == 200, got[:300]
    stack.idle()
    return got


def test_a_restart_keeps_every_conversations_name_and_reads_nothing_again(
        shared_data: Path, stack_of: Any, tmp_path: Path) -> None:
    path, (ia, ib), _ = TOOLS
    a, b = session_of(shared_data, path, ia), session_of(shared_data, path, ib)
    disk = str(tmp_path / "disk")
    stack = stack_of([a, b], disk=disk)
    with httpx.Client(timeout=120.0) as client:
        for i in range(2):
            _run(client, stack, a.requests[i])
    (name,) = stack.proxy.sessions.names()
    before = exact(stack, name)
    stack.stop()  # a planned stop: the service parks the session, the index is on disk
    stack = stack_of([a, b], disk=disk)
    assert stack.proxy.sessions.names() == [name]
    with httpx.Client(timeout=120.0) as client:
        _run(client, stack, b.requests[0])  # another conversation first: it must not take A's name
        other = [n for n in stack.proxy.sessions.names() if n != name]
        assert len(other) == 1 and other[0] != name
        restored = stack.service.live.session_status(name)
        assert (restored.where, restored.ids) == ("parked", len(before))  # A untouched by B, on disk
        _run(client, stack, a.requests[2])
    turn = render_turns(a, indices=range(3))[-1]
    assert stack.proxy.sessions.names() == [other[0], name]
    assert exact(stack, name) == turn.prompt_ids + turn.output_ids
    # A continued as A from its parked state: nothing read again but what any run reads again where
    # the template renders the last reply anew (from the checkpoint at or below the difference)
    differs = first_difference(before, turn.prompt_ids)
    assert differs is not None and differs < restored.committed
    again = restored.committed - max(c for c in restored.checkpoints if c <= differs)
    line = stack.service.live.session_status(name)
    assert (line.rollbacks, line.reread) == (1, again)
    counts = stack.proxy.counts.as_dict()
    assert (counts["sessions_new"], counts["sessions_joined"]) == (1, 1)


def _twin(t: Transcript) -> Transcript:
    """Another rollout of the same task: the same first request, then its own observations."""
    def mine(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        users = [i for i, m in enumerate(messages) if m["role"] in ("user", "tool")]
        return [{**m, "content": m["content"] + "\n(rollout 2)"} if i in users[1:] and isinstance(m["content"], str)
                else m for i, m in enumerate(messages)]
    return replace(t, requests=[replace(r, messages=mine(r.messages)) for r in t.requests])


def test_twin_agents_with_one_first_prompt_part_into_two_sessions(shared_data: Path, stack_of: Any) -> None:
    path, index, _ = REASONING
    one = session_of(shared_data, path, index)
    two = _twin(one)
    assert one.requests[0].messages == two.requests[0].messages and one.requests[1].messages != two.requests[1].messages
    stack = stack_of([one, two])
    key = {"Authorization": "Bearer sk-shared"}  # one engine key for every rollout, as harnesses do
    with httpx.Client(timeout=120.0) as client:
        for i in range(3):
            for agent in (one, two):
                _run(client, stack, agent.requests[i], key)
    names = stack.proxy.sessions.names()
    assert len(names) == 2
    counts = stack.proxy.counts.as_dict()
    # rollout 2's first body is rollout 1's retry (same client, same bytes); then it branches once
    assert (counts["turns"], counts["retries"], counts["sessions_branched"]) == (5, 1, 1)
    for agent in (one, two):
        want = render_turns(agent, indices=range(3))[-1]
        (name,) = [n for n in names if stack.proxy.sessions.ids(n) == want.prompt_ids + want.output_ids]
        assert exact(stack, name) == want.prompt_ids + want.output_ids
        line = stack.service.live.session_status(name)
        # rollout 1: its three turns and rollout 2's first (the retry); rollout 2: its own two. Neither
        # rolled the other back (the run: one session, 3 rollbacks, 1,536 ids read again)
        assert (line.turns, line.rollbacks, line.reread) == (4 if agent is one else 2, 0, 0)


def test_two_engine_keys_never_join_see_ask_or_delete_each_others_sessions(
        shared_data: Path, stack_of: Any) -> None:
    path, index, _ = REASONING
    t = session_of(shared_data, path, index)
    stack = stack_of([t])
    ka, kb = {"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-b"}
    ask = {"question": "Is the agent done?", "choices": ["yes", "no"]}
    with httpx.Client(timeout=120.0) as client:
        _run(client, stack, t.requests[0], ka)
        (a,) = stack.proxy.sessions.names()
        _run(client, stack, t.requests[0], kb)  # the same body from another key: not a's retry
        (b,) = [n for n in stack.proxy.sessions.names() if n != a]
        _run(client, stack, t.requests[1], kb)  # the next turn with key b: b's, never a's
        assert sorted(stack.proxy.sessions.names()) == sorted([a, b])
        counts = stack.proxy.counts.as_dict()
        assert (counts["turns"], counts["retries"], counts["sessions_new"]) == (3, 0, 2)
        want = render_turns(t, indices=range(2))
        assert exact(stack, a) == want[0].prompt_ids + want[0].output_ids
        assert exact(stack, b) == want[1].prompt_ids + want[1].output_ids
        url = stack.url + BASE
        assert client.post(url + "/ask", json={"session": a, **ask}, headers=kb).status_code == 404
        assert client.get(url + "/narration", params={"session": a}, headers=kb).status_code == 404
        assert client.get(url + "/narration", headers=kb).status_code == 400  # every session's: the operator's
        seen_b = client.get(url + "/status", headers=kb).json()["sessions"]
        seen_a = client.get(url + "/status", headers=ka).json()["sessions"]
        assert a not in seen_b and b in seen_b and b not in seen_a and a in seen_a
        assert client.delete(url + f"/sessions/{a}", headers=kb).status_code == 404
        assert stack.proxy.sessions.knows(a) and a in stack.service.status().sessions
        assert client.post(url + "/ask", json={"session": a, **ask}, headers=ka).status_code == 200
        assert a not in client.get(url + "/status", headers=kb).text  # not even a's answer record
        assert a in client.get(url + "/status", headers=ka).text
        operator = client.get(url + "/status").json()["sessions"]  # no engine key: the operator's view
        assert a in operator and b in operator
        assert client.delete(url + f"/sessions/{a}", headers=ka).status_code == 204
    assert not stack.proxy.sessions.knows(a) and stack.proxy.sessions.knows(b)


def test_a_stream_that_fails_after_its_200_touches_nothing(shared_data: Path, stack_of: Any) -> None:
    """llama-cpp-python's way: ``200 text/event-stream``, then nothing (or an error event alone)."""
    path, index, _ = REASONING
    t = session_of(shared_data, path, index)
    stack = stack_of([t])
    victim = {"X-Session-Id": "victim"}
    with httpx.Client(timeout=120.0) as client:
        _run(client, stack, t.requests[0], victim)
        before = exact(stack, "victim")
        with stack.service.hold():
            state = stack.service.live.export_state("victim")
        for hook in ("x-test-empty", "x-test-error-event"):
            status, got = stream_chat(client, stack.url, chat_body(t.requests[1]), {**victim, hook: "1"})
            assert status == 200 and (got == b"" if hook == "x-test-empty" else got.startswith(b'data: {"error"'))
            stack.idle()
    assert list(stack.service.live.session_ids("victim")) == before
    with stack.service.hold():
        after = stack.service.live.export_state("victim")
    assert after.keys() == state.keys() and all(after[k].equal(state[k]) for k in state)
    assert stack.proxy.sessions.ids("victim") == before
    counts = stack.proxy.counts.as_dict()
    assert counts["turns"] == 1 and counts["not_followed"] == {"no_choice": 2}
    assert stack.service.status().host.finished_turns == 1


def test_a_cut_reply_streamed_as_content_feeds_no_closing_tag(shared_data: Path, stack_of: Any) -> None:
    """llama.cpp's way: the thought as plain ``content``, cut by ``max_tokens``: the session holds the
    prompt and exactly the text's ids."""
    path, index, _ = REASONING
    t = session_of(shared_data, path, index)
    req = t.requests[0]
    stack = stack_of([t])
    cut = 200
    with httpx.Client(timeout=120.0) as client:
        status, got = stream_chat(client, stack.url, chat_body(req), {"X-Session-Id": "cut",
                                                                       "x-test-as-content": str(cut)})
        assert status == 200 and b'"finish_reason": "length"' in got
        stack.idle()
    tokens = stack.proxy.host.tokens if hasattr(stack.proxy.host, "tokens") else None
    from shadow.adapters.tokens import get_tokens

    tokens = tokens or get_tokens()
    prompt = render_turns(t, indices=range(1))[0].prompt_ids
    text = req.response["reasoning_content"][:cut]
    ids = exact(stack, "cut")
    assert ids == prompt + tokens.encode(text)
    assert not set(tokens.encode("</think>")) & set(ids[len(prompt):])


def test_id_fields_the_engine_refuses_fall_back_to_rendering(shared_data: Path, stack_of: Any) -> None:
    """``--engine vllm`` in front of an engine that refuses unknown fields (422 "Unexpected fields"):
    the client's own body is sent again, untouched, and the proxy renders from then on."""
    path, index, _ = REASONING
    t = session_of(shared_data, path, index)
    stack = stack_of([t], engine="vllm", strict=True)
    hdr = {"X-Session-Id": "strict"}
    with httpx.Client(timeout=120.0) as client:
        for i in range(2):
            body = json.dumps(chat_body(t.requests[i])).encode()
            with client.stream("POST", stack.url + CHAT, content=body,
                               headers={**hdr, "content-type": "application/json"}) as r:
                got = b"".join(r.iter_raw())
            assert r.status_code == 200 and got == b"".join(sse_chunks(t.requests[i].response))
            assert stack.upstream.requests[-1] == ("POST", CHAT, body)  # the client's bytes
            stack.idle()
        status = client.get(stack.url + "/v1/conductor/proxy/status").json()
    assert [json.loads(b).get("return_token_ids") for _, p, b in stack.upstream.requests if p == CHAT] == \
        [True, None, None]  # asked once, refused, never again
    last = render_turns(t, indices=range(2))[-1]
    assert exact(stack, "strict") == last.prompt_ids + last.output_ids
    fallback = status["engine_fallback"]
    assert fallback["engine"] == "vllm" and fallback["status"] == 422 and "Unexpected fields" in fallback["refusal"]
    assert status["counts"]["engine_fallbacks"] == 1 and status["counts"]["turns"] == 2
    assert metric(stack.proxy, "shadow_proxy_engine_fallbacks") == 1


def test_two_proxies_on_one_redis_agree_on_the_session_of_a_headerless_request(
        shared_data: Path, stack_of: Any, redis_url: str, tmp_path: Path) -> None:
    """Two proxy + shadow pairs on one Redis (the index and the parks shared): a header-less
    conversation started on one is the same session on the other. While the first pair holds it, the
    second would get a 409 naming the holder; once the first stops (a planned stop parks it in the
    store and lets go of its lease), the next turn on the second joins it by name and restores it from
    the store, exactly."""
    path, index, _ = REASONING
    t = session_of(shared_data, path, index)
    one = stack_of([t], store=redis_url, disk=str(tmp_path / "disk-one"))
    two = stack_of([t], store=redis_url, disk=str(tmp_path / "disk-two"))
    key = {"Authorization": "Bearer sk-fleet"}
    with httpx.Client(timeout=120.0) as client:
        _run(client, one, t.requests[0], key)
        one.idle()
        (name,) = one.proxy.sessions.names()
        assert two.proxy.sessions.names() == [name]  # the index is the store's, not a proxy's own
        one.stop()
        _run(client, two, t.requests[1], key)  # the next turn lands on the other pair
        _run(client, two, t.requests[2], key)
    turns = render_turns(t, indices=range(3))
    assert exact(two, name) == turns[2].prompt_ids + turns[2].output_ids
    assert two.proxy.sessions.ids(name) == turns[2].prompt_ids + turns[2].output_ids
    assert one.proxy.counts.as_dict()["sessions_new"] == 1 and two.proxy.counts.as_dict()["sessions_joined"] == 2


def test_redis_gone_stops_following_and_every_byte_still_flows(
        shared_data: Path, stack_of: Any, redis_server: Any, tmp_path: Path) -> None:
    path, index, _ = REASONING
    t = session_of(shared_data, path, index)
    stack = stack_of([t], store=redis_server.url, disk=str(tmp_path / "disk"))
    with httpx.Client(timeout=120.0) as client:
        _run(client, stack, t.requests[0])
        (name,) = stack.proxy.sessions.names()
        before = exact(stack, name)
        redis_server.kill()
        got = _run(client, stack, t.requests[1])
        assert got == b"".join(sse_chunks(t.requests[1].response))
        status = client.get(stack.url + "/v1/conductor/proxy/status").json()
    assert status["sessions"]["reachable"] is False and "ConnectionError" in status["sessions"]["error"]
    assert status["counts"]["not_followed"] == {"shadow_error": 1} and status["counts"]["turns"] == 1
    assert exact(stack, name) == before  # nothing fed that the index could not place
    assert stack.service.status().host.running == 0
