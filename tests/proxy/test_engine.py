"""The proxy in front of a real engine: ``transformers serve`` on loopback serving the tiny checkpoint
(``engine.py``), the official ``openai`` SDK replaying a real tool-using session from ../shared/data
through the proxy, with the proxy's token set.

Between the proxy and the engine sits ``Tap``, a transparent pass-through on loopback that keeps
every header the engine receives and can answer 502 a given number of times (a failing gateway):
the test can then show what reached the engine and what a retried 502 does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import transformers

from shadow.adapters.chat import render
from shadow.adapters.tokens import get_tokens
from shadow.adapters.transcripts import load_transcript
from shadow.api.paths import BASE
from shadow.api.server import BackgroundServer
from shadow.proxy import create_proxy_app
from tests.conftest import make_container, make_settings, wait_until
from tests.proxy.conftest import RAW, TOOLS, Stack, exact
from tests.proxy.engine import Engine, engine_folder
from tests.proxy.test_proxy import metric
from tests.proxy.upstream import read_body

TOKEN = "s3cret"
MAX_TOKENS = 8
VARYING = ("id", "created")  # the engine's own per response (x-request-id is a header)


class Tap:
    """Passes every request on to ``upstream`` and its answer back, keeping the headers it saw;
    ``fail`` chat completions are answered 502 instead."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.headers: list[dict[str, str]] = []
        self.fail = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await read_body(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.headers.append(headers)
        if self.fail and scope["path"] == "/v1/chat/completions":
            self.fail -= 1
            await send({"type": "http.response.start", "status": 502, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        fwd = {k: v for k, v in headers.items() if k not in ("host", "content-length")}
        async with httpx.AsyncClient(timeout=300.0) as client, client.stream(
                scope["method"], self.upstream + scope["path"], headers=fwd, content=body) as r:
            await send({"type": "http.response.start", "status": r.status_code,
                        "headers": [(k, v) for k, v in r.headers.raw if k.lower() != b"content-length"]})
            async for chunk in r.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    folder = engine_folder(tmp_path_factory.mktemp("engine") / "qwen35-tiny")
    e = Engine(folder, folder.parent / "serve.log")
    e.start()
    yield e
    e.stop()


@pytest.fixture
def stack(engine: Engine, checkpoint: Path, tmp_path: Path) -> Iterator[tuple[Stack, Tap]]:
    tap = Tap(engine.url)
    servers = [BackgroundServer(tap, lifespan="off")]
    servers[0].start()
    settings = make_settings(checkpoint, tmp_path, idle_poll_s=0.05, idle_window_s=2.0, token=TOKEN)
    proxy = create_proxy_app(servers[0].url, make_container(settings), timeout_s=300.0, engine="auto")
    servers.append(BackgroundServer(proxy, server_header=False, date_header=False))
    servers[1].start()
    wait_until(lambda: proxy.host.slot.state == "loaded", "the model to load")
    yield Stack(proxy, None, servers[1].url, engine.url, None), tap  # type: ignore[arg-type]
    for s in reversed(servers):
        s.stop()


def _sdk(url: str, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-upstream", timeout=300.0, **kw)


def _dump(obj: Any) -> Any:
    return {k: v for k, v in obj.model_dump().items() if k not in VARYING}


def _joined(into: dict[str, Any], delta: dict[str, Any]) -> None:
    """``delta``'s fields added to ``into``: strings appended, tool calls merged by their index."""
    for key, value in delta.items():
        if key == "tool_calls" and value:
            calls = into.setdefault(key, {})
            for call in value:
                _joined(calls.setdefault(call["index"], {}), {k: v for k, v in call.items() if k != "index"})
        elif isinstance(value, dict):
            _joined(into.setdefault(key, {}), value)
        elif isinstance(value, str) and key not in ("role", "type", "id", "finish_reason"):
            into[key] = into.get(key, "") + value
        elif value is not None:
            into[key] = value


def _streamed(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What a stream says, whatever its cut: each choice's deltas joined, and the last of every other
    field. transformers serve cuts its text by timing (under load one event held "\n\n" that
    another call of the same request sent as two), so two calls are compared by this; the proxy's
    own relay is byte for byte (``test_proxy.py``)."""
    out: dict[str, Any] = {"choices": {}}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            _joined(out["choices"].setdefault(choice["index"], {}), choice)
        out.update({k: v for k, v in chunk.items() if k != "choices" and v is not None})
    return out


def _ask(client: openai.OpenAI, model: str, req: Any, stream: bool) -> Any:
    kw: dict[str, Any] = {"model": model, "messages": req.messages, "max_tokens": MAX_TOKENS}
    if req.tools:
        kw["tools"] = req.tools
    if not stream:
        return _dump(client.chat.completions.create(**kw))
    chunks = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    return _streamed([_dump(c) for c in chunks])


@pytest.mark.slow  # starts transformers serve (about 22 s of the inner loop; make test runs it)
def test_a_real_engine_behind_the_proxy(shared_data: Path, engine: Engine, stack: tuple[Stack, Tap]) -> None:
    proxy_stack, tap = stack
    proxy = proxy_stack.proxy
    model = str(engine.folder)
    transcript = load_transcript(shared_data / RAW / TOOLS[0])[TOOLS[1][0]]
    text = render(transcript.requests[2].messages, transcript.requests[2].tools, add_generation_prompt=True)
    engine_tokenizer = transformers.AutoTokenizer.from_pretrained(str(engine.folder))
    assert engine_tokenizer.encode(text) == get_tokens().encode(text)  # the engine reads our ids
    direct = _sdk(engine.url)
    via = _sdk(proxy_stack.url, default_headers={"X-Shadow-Token": TOKEN})

    # without the proxy's token: 401 on chat and on status, and nothing reaches the engine
    with pytest.raises(openai.AuthenticationError):
        _sdk(proxy_stack.url, max_retries=0).chat.completions.create(
            model=model, messages=transcript.requests[0].messages, max_tokens=MAX_TOKENS)
    with httpx.Client(timeout=60.0) as client:
        for route in (BASE + "/status", "/v1/conductor/proxy/status"):
            assert client.get(proxy_stack.url + route).status_code == 401
            assert client.get(proxy_stack.url + route, headers={"X-Shadow-Token": TOKEN}).status_code == 200
    assert tap.headers == []

    # three turns of a real tool-using session: the responses are the engine's, the state exact
    for i, streamed in enumerate((True, False, True)):
        req = transcript.requests[i]
        assert _ask(via, model, req, streamed) == _ask(direct, model, req, streamed), f"turn {i}"
        proxy_stack.idle()
        (name,) = proxy.sessions.names()  # found by prefix: one conversation, one session
        assert exact(proxy_stack, name) == proxy.sessions.ids(name), f"turn {i}"
    counts = proxy.counts.as_dict()
    assert counts["turns"] == 3 and counts["sessions_new"] == 1 and counts["not_followed"] == {}
    assert proxy.engine_name == "transformers"  # auto: its /v1/models owner is not one that returns ids
    # transformers serve drops an assistant message's text when it has tool calls: from turn 1 on
    # (the first with such a message in its history) the render is longer than the engine's prompt
    mismatched = counts["last_mismatches"]
    assert counts["render_mismatch"] == 2 and all(m["rendered"] > m["engine"] for m in mismatched)
    assert metric(proxy, "shadow_proxy_render_mismatches") == 2 and metric(proxy, "shadow_proxy_turns") == 3

    # a refused request and a down engine leave the session's ids and tensors as they were
    sh = proxy_stack.service.live
    before = list(sh.session_ids(name))
    with proxy_stack.service.hold():
        state = sh.export_state(name)
    nxt = transcript.requests[3]
    named = _sdk(proxy_stack.url, max_retries=0, default_headers={"X-Shadow-Token": TOKEN, "X-Session-Id": name})
    with pytest.raises(openai.BadRequestError):
        named.chat.completions.create(model="no-such-model", messages=nxt.messages, max_tokens=MAX_TOKENS)
    up, proxy.upstream = proxy.upstream, "http://127.0.0.1:9"  # nothing listens on the discard port
    with pytest.raises(openai.InternalServerError):
        named.chat.completions.create(model=model, messages=nxt.messages, max_tokens=MAX_TOKENS)
    proxy.upstream = up
    proxy_stack.idle()
    assert list(sh.session_ids(name)) == before
    with proxy_stack.service.hold():
        after = sh.export_state(name)
    assert all(after[k].equal(state[k]) for k in state)

    # a 502 the SDK retries twice is one turn
    tap.fail = 2
    _ask(via, model, nxt, stream=False)
    proxy_stack.idle()
    counts = proxy.counts.as_dict()
    assert (counts["turns"], counts["refused"], counts["unreachable"]) == (4, 1 + 2, 1)
    assert exact(proxy_stack, name) == proxy.sessions.ids(name)

    # a short chat of three turns is one session of its own
    messages: list[dict[str, Any]] = []
    for q in ("Hi.", "What is 2 + 2?", "Thanks."):
        messages.append({"role": "user", "content": q})
        reply = via.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    proxy_stack.idle()
    names = proxy.sessions.names()
    assert len(names) == 2 and proxy.counts.as_dict()["sessions_new"] == 2
    assert exact(proxy_stack, names[-1]) == proxy.sessions.ids(names[-1])

    # the engine saw the client's key on every request, and never the proxy's token
    assert tap.headers and all("x-shadow-token" not in h for h in tap.headers)
    assert all(h.get("authorization") == "Bearer sk-upstream" for h in tap.headers if "authorization" in h)
    assert sum("authorization" in h for h in tap.headers) >= 7


def test_engine_id_fields_that_transformers_serve_refuses_fall_back_to_rendering(
        shared_data: Path, engine: Engine, checkpoint: Path, tmp_path: Path) -> None:
    """``--engine vllm`` in front of ``transformers serve``, which refuses fields it does not know (422
    "Unexpected fields"): the client's request is sent again untouched, answered, and followed by
    rendering from then on."""
    settings = make_settings(checkpoint, tmp_path, idle_poll_s=0.05, idle_window_s=2.0)
    proxy = create_proxy_app(engine.url, make_container(settings), timeout_s=300.0, engine="vllm")
    front = BackgroundServer(proxy, server_header=False, date_header=False)
    front.start()
    try:
        wait_until(lambda: proxy.host.slot.state == "loaded", "the model to load")
        stack = Stack(proxy, None, front.url, engine.url, None)  # type: ignore[arg-type]
        transcript = load_transcript(shared_data / RAW / TOOLS[0])[TOOLS[1][0]]
        via, direct, model = _sdk(front.url, max_retries=0), _sdk(engine.url), str(engine.folder)
        for i, streamed in enumerate((True, False)):
            req = transcript.requests[i]
            assert _ask(via, model, req, streamed) == _ask(direct, model, req, streamed), f"turn {i}"
            stack.idle()
        (name,) = proxy.sessions.names()
        assert exact(stack, name) == proxy.sessions.ids(name)
        fallback = proxy.fallback
        assert fallback is not None and fallback["engine"] == "vllm" and fallback["status"] == 422
        assert "return_token_ids" in fallback["refusal"]
        counts = proxy.counts.as_dict()
        assert (counts["turns"], counts["engine_fallbacks"], counts["engine_ids"]) == (2, 1, 0)
        assert metric(proxy, "shadow_proxy_engine_fallbacks") == 1
    finally:
        front.stop()
