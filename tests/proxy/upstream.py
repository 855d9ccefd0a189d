"""A scripted OpenAI-style upstream: a small ASGI app that answers each chat completion with the
recorded assistant reply of a real session, streamed as fixed SSE chunks (or whole), so a test knows
every byte the upstream sent.

Test hooks ride on request headers, which the proxy forwards unchanged: ``x-test-fail-after: N``
breaks the stream after N chunks (the app raises, uvicorn drops the connection), and
``x-test-delay: S`` sleeps S seconds between chunks (room for a client to disconnect),
``x-test-status: N`` refuses the chat completion with status N, ``x-test-fail-first: N`` answers the
first N requests of a conversation with 502, and ``x-test-inject: NAME`` streams the event
``inject[NAME]`` after the first ``INJECT_AT`` chunks. As llama-cpp-python did: ``x-test-empty: 1``
answers ``200 text/event-stream`` and then ends with no event, ``x-test-error-event: 1`` with one
choice-less error event; ``x-test-as-content: N`` streams the reply's reasoning as plain ``content``
(no reasoning parser) and cuts it after N characters (``finish_reason: length``). With ``strict``
the upstream refuses fields OpenAI's chat completion does not have, as ``transformers serve``
does (422 "Unexpected fields"). Besides the chat route, ``/v1/models`` answers
``MODELS``, ``/v1/moved`` answers 307 (to ``/v1/models``) and any other path echoes the request (418).
Every request's headers are kept (``headers``; as they came, repeats included, in ``raw_headers``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

PIECE = 24  # characters per streamed delta
INJECT_AT = 3


def _pieces(text: str) -> list[str]:
    return [text[i:i + PIECE] for i in range(0, len(text), PIECE)]


def sse_chunks(response: dict[str, Any]) -> list[bytes]:
    """The SSE events an OpenAI-style server streams for ``response`` (an assistant message)."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "qwen",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    reasoning = response.get("reasoning_content") or response.get("thinking") or response.get("reasoning")
    if isinstance(reasoning, str):
        out += [chunk({"reasoning_content": p}) for p in _pieces(reasoning)]
    content = response.get("content")
    if isinstance(content, str):
        out += [chunk({"content": p}) for p in _pieces(content)]
    for i, call in enumerate(response.get("tool_calls") or []):
        fn = call["function"]
        args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"], ensure_ascii=False)
        out.append(chunk({"tool_calls": [{"index": i, "id": call.get("id", f"call_{i}"), "type": "function",
                                          "function": {"name": fn["name"], "arguments": ""}}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for p in _pieces(args)]
    out.append(chunk({}, "tool_calls" if response.get("tool_calls") else "stop"))
    out.append(b"data: [DONE]\n\n")
    return out


def whole_body(response: dict[str, Any]) -> bytes:
    msg = {k: v for k, v in response.items() if k in ("role", "content", "reasoning_content", "tool_calls")}
    obj = {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "qwen",
           "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}
    return json.dumps(obj, ensure_ascii=False).encode()


def key(messages: list[dict[str, Any]]) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)


MODELS = b'{"object":"list","data":[{"id":"qwen","object":"model","owned_by":"test"}]}'



async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body (the upstreams the proxy tests stand up read it so)."""
    body = bytearray()
    while True:
        m = await receive()
        body.extend(m.get("body", b""))
        if not m.get("more_body"):
            return bytes(body)

OPENAI_FIELDS = {"model", "messages", "stream", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
                 "max_completion_tokens", "stop", "n", "seed", "stream_options", "chat_template_kwargs", "user"}


def as_content(response: dict[str, Any], cut: int) -> list[bytes]:
    """The reply's reasoning streamed as ``content`` (an engine without a reasoning parser), cut by
    ``max_tokens`` after ``cut`` characters."""
    text = (response.get("reasoning_content") or "")[:cut]
    return sse_chunks({"role": "assistant", "content": text})[:-2] + [
        b"data: " + json.dumps({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0,
                                "model": "qwen", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]
                                }).encode() + b"\n\n", b"data: [DONE]\n\n"]


class ScriptedUpstream:
    def __init__(self, replies: dict[str, dict[str, Any]], strict: bool = False) -> None:
        self.replies = replies
        self.strict = strict
        self.requests: list[tuple[str, str, bytes]] = []
        self.headers: list[dict[str, str]] = []
        self.raw_headers: list[list[tuple[bytes, bytes]]] = []
        self.inject: dict[str, bytes] = {}
        self.failed: dict[str, int] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            return
        body = await read_body(receive)
        self.requests.append((scope["method"], scope["path"], body))
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.headers.append(headers)
        self.raw_headers.append(list(scope["headers"]))
        if scope["path"] == "/v1/models":
            await _send(send, 200, [(b"content-type", b"application/json")], [MODELS])
            return
        if scope["path"] == "/v1/moved":  # a redirect is the client's to follow, not the proxy's
            await _send(send, 307, [(b"location", b"/v1/models")], [])
            return
        if scope["path"] != "/v1/chat/completions":
            echo = json.dumps({"path": scope["path"], "raw_path": scope["raw_path"].decode(),
                               "query": scope["query_string"].decode(), "body": body.decode()}).encode()
            await _send(send, 418, [(b"content-type", b"application/json"), (b"x-upstream", b"echo")], [echo])
            return
        try:
            req = json.loads(body)
            messages = key(req["messages"])
        except (ValueError, RecursionError, KeyError, TypeError):
            await _send(send, 400, [(b"content-type", b"application/json")], [b'{"error":"bad body"}'])
            return
        unexpected = set(req) - OPENAI_FIELDS if isinstance(req, dict) else set()
        if self.strict and unexpected:
            detail = json.dumps({"detail": f"Unexpected fields: {unexpected}"}).encode()
            await _send(send, 422, [(b"content-type", b"application/json")], [detail])
            return
        if "x-test-status" in headers:
            await _send(send, int(headers["x-test-status"]), [(b"content-type", b"application/json")],
                        [b'{"error":"refused"}'])
            return
        if self.failed.get(messages, 0) < int(headers.get("x-test-fail-first", "0")):
            self.failed[messages] = self.failed.get(messages, 0) + 1
            await _send(send, 502, [(b"content-type", b"application/json")], [b'{"error":"bad gateway"}'])
            return
        reply = self.replies.get(messages)
        if reply is None:
            await _send(send, 404, [(b"content-type", b"application/json")], [b'{"error":"no such turn"}'])
            return
        if not req.get("stream"):
            await _send(send, 200, [(b"content-type", b"application/json")], [whole_body(reply)])
            return
        fail_after = int(headers.get("x-test-fail-after", "-1"))
        delay = float(headers.get("x-test-delay", "0"))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        chunks = sse_chunks(reply)
        if "x-test-empty" in headers:
            chunks = []
        if "x-test-error-event" in headers:
            chunks = [b'data: {"error":{"message":"the template failed","type":"server_error"}}\n\n']
        if "x-test-as-content" in headers:
            chunks = as_content(reply, int(headers["x-test-as-content"]))
        if "x-test-inject" in headers:
            chunks.insert(INJECT_AT, self.inject[headers["x-test-inject"]])
        for i, c in enumerate(chunks):
            if i == fail_after:
                raise RuntimeError("the scripted upstream breaks mid-stream")
            await send({"type": "http.response.body", "body": c, "more_body": True})
            if delay:
                await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send(send: Any, status: int, headers: list[tuple[bytes, bytes]], parts: list[bytes]) -> None:
    size = str(sum(map(len, parts))).encode()
    await send({"type": "http.response.start", "status": status, "headers": [*headers, (b"content-length", size)]})
    for p in parts:
        await send({"type": "http.response.body", "body": p, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
