"""The engine's own ids: recorded vLLM and SGLang responses (``data/``, written from their documented
formats: vLLM's ``return_token_ids``, SGLang's ``return_prompt_token_ids``/``return_token_ids``) served
by an upstream on loopback, through the proxy. The shadow's session holds exactly the recorded ids,
the proxy asked for them only where the engine takes the fields, and the client gets the responses
without what the proxy asked for (unless it asked itself)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shadow.adapters.chat import render_ids
from shadow.adapters.tokens import get_tokens
from shadow.api.server import BackgroundServer
from shadow.proxy import create_proxy_app
from shadow.proxy.engines import BY_NAME, from_models
from shadow.proxy.relay import parse_event, take_events
from tests.conftest import Spans, make_container, make_settings, wait_until
from tests.proxy.conftest import Stack, exact
from tests.proxy.upstream import read_body

DATA = Path(__file__).parent / "data"
MESSAGES = json.loads((DATA / "request.json").read_text())["messages"]


class Recorded:
    """Answers every chat completion with a recorded response: the stream or the whole body."""

    def __init__(self, stream: bytes, whole: bytes) -> None:
        self.stream, self.whole = stream, whole
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await read_body(receive)
        req = json.loads(body)
        self.bodies.append(req)
        streamed = req.get("stream") is True
        out = self.stream if streamed else self.whole
        kind = b"text/event-stream" if streamed else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": out})


@pytest.fixture
def recorded(checkpoint: Path, tmp_path: Path, spans: Spans) -> Iterator[Any]:
    servers: list[BackgroundServer] = []

    def make(engine: str, stream: bytes, whole: bytes) -> tuple[Stack, Recorded]:
        upstream = Recorded(stream, whole)
        up = BackgroundServer(upstream, lifespan="off")
        up.start()
        servers.append(up)
        settings = make_settings(checkpoint, tmp_path, idle_poll_s=0.05, idle_window_s=2.0)
        proxy = create_proxy_app(up.url, make_container(settings, spans=spans), timeout_s=60.0, engine=engine)
        front = BackgroundServer(proxy, server_header=False, date_header=False)
        front.start()
        servers.append(front)
        wait_until(lambda: proxy.host.slot.state == "loaded", "the model to load")
        return Stack(proxy, None, front.url, up.url, spans), upstream  # type: ignore[arg-type]

    yield make
    for s in reversed(servers):
        s.stop()


def _events(raw: bytes) -> list[Any]:
    buffer = bytearray(raw)
    return [parse_event(e) for e in take_events(buffer)]


def test_vllm_streamed_and_whole_ids_are_fed_as_recorded(recorded: Any) -> None:
    stream = (DATA / "vllm_stream.sse").read_bytes()
    whole = (DATA / "vllm_whole.json").read_bytes()
    events = [e for e in _events(stream) if e is not None]
    want = events[0]["prompt_token_ids"] + [i for e in events for i in e["choices"][0]["token_ids"]]
    assert want == json.loads(whole)["prompt_token_ids"] + json.loads(whole)["choices"][0]["token_ids"]
    stack, upstream = recorded("vllm", stream, whole)
    strip = BY_NAME["vllm"].strip
    with httpx.Client(timeout=60.0) as client:
        for i, streamed in enumerate((True, False)):
            body = {"model": "qwen", "messages": MESSAGES, "stream": streamed}
            r = client.post(stack.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": f"v{i}"})
            assert r.status_code == 200 and upstream.bodies[-1] == {**body, "return_token_ids": True}
            if streamed:  # every event as recorded, less the ids the proxy asked for
                assert _events(r.content) == [strip(e) if e is not None else None for e in _events(stream)]
                assert all(b"token_ids" not in e for e in r.content.split(b"\n\n"))
            else:
                assert r.json() == strip(json.loads(whole)) and int(r.headers["content-length"]) == len(r.content)
            stack.idle()
            assert exact(stack, f"v{i}") == want
        # a client that asks for the ids itself gets them, byte for byte
        body = {"model": "qwen", "messages": MESSAGES, "stream": True, "return_token_ids": True}
        r = client.post(stack.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": "asked"})
        assert r.content == stream
    stack.idle()
    assert exact(stack, "asked") == want
    counts = stack.proxy.counts.as_dict()
    assert counts["engine_ids"] == counts["turns"] == 3 and counts["render_mismatch"] == 0


def test_sglang_whole_ids_are_fed_as_recorded_and_a_different_prompt_is_recorded(recorded: Any) -> None:
    whole = (DATA / "sglang_whole.json").read_bytes()
    choice = json.loads(whole)["choices"][0]
    stream = (DATA / "vllm_stream.sse").read_bytes()  # SGLang streams carry no ids: asked nothing
    stack, upstream = recorded("sglang", stream, whole)
    with httpx.Client(timeout=60.0) as client:
        body = {"model": "qwen", "messages": MESSAGES}
        r = client.post(stack.url + "/v1/chat/completions", json=body, headers={"X-Session-Id": "sg"})
        assert upstream.bodies[-1] == {**body, "return_prompt_token_ids": True, "return_token_ids": True}
        assert r.json() == BY_NAME["sglang"].strip(json.loads(whole))
        body = {**body, "stream": True}
        assert client.post(stack.url + "/v1/chat/completions", json=body,
                           headers={"X-Session-Id": "sg-stream"}).status_code == 200
        assert upstream.bodies[-1] == body
    stack.idle()
    # the engine rendered its prompt with thinking off, the proxy's render has it on: the engine's ids win
    assert exact(stack, "sg") == choice["prompt_token_ids"] + choice["token_ids"]
    counts = stack.proxy.counts.as_dict()
    assert counts["engine_ids"] == 1 and counts["render_mismatch"] == 1
    (mismatch,) = counts["last_mismatches"]
    assert mismatch["session"] == "sg" and mismatch["engine"] == len(choice["prompt_token_ids"])
    (span,) = [s for s in stack.spans.all("shadow.proxy.turn") if s.attributes.get("shadow.proxy.render_mismatch")]
    assert span.attributes["gen_ai.conversation.id"] == "sg" and span.attributes["shadow.proxy.engine_ids"]
    render = render_ids(MESSAGES, None, add_generation_prompt=True)
    at = next(i for i, (a, b) in enumerate(zip(render, choice["prompt_token_ids"], strict=False)) if a != b)
    assert (mismatch["rendered"], mismatch["first_difference"]) == (len(render), at)
    assert get_tokens().decode(render[at:]) == "\n"  # the render leaves <think> open, the engine closed it


def test_auto_reads_the_engine_from_its_models() -> None:
    def models(owner: str) -> bytes:
        return json.dumps({"object": "list", "data": [{"id": "m", "owned_by": owner}]}).encode()

    assert [from_models(models(o)).name for o in ("vllm", "sglang", "llamacpp", "openai")] == \
        ["vllm", "sglang", "llamacpp", "transformers"]
    assert from_models(b"[" * 100_000).name == "transformers"
