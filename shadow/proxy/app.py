"""``shadow proxy``: an OpenAI-compatible front that forwards every request to an upstream engine
(vLLM, SGLang, llama.cpp, ...) unchanged and follows its chat completions with the shadow.

Every request goes to ``--upstream`` as it came (method, path, query, headers but ``Host`` and the
hop-by-hop ones, body), and the upstream's status, headers and bytes come back as they were sent,
streamed as they arrive (``aiter_raw``: not even a ``Content-Encoding`` is undone). Paths under
``/v1/conductor/shadow`` and ``/schema`` are the shadow's own app (ask, status, feeding, host).

A ``POST /v1/chat/completions`` (streaming or not) is also a turn of the host interface, on the
in-process ``ShadowService``: ``arrived`` when it comes in, ``started`` with the request's
messages and tools rendered by the Qwen3.5 chat template (``chat_template_kwargs.enable_thinking``
honoured), ``first_token`` at the first streamed delta, ``round_ended`` after each delta with the
output ids that delta settled (``shadow.proxy.output``), ``finished`` with the rest once the
upstream is done. The session is the ``X-Session-Id`` header's, else the one chosen by prefix
(``shadow.proxy.sessions`` states the rule). ``GET /v1/models`` is passed through.

Failures stay the upstream's: an error status is returned as it came; an upstream that cannot be
reached or times out gives 502 or 504 (there is no upstream answer to pass on); an upstream that
breaks mid-stream breaks the client's stream the same way (the connection closes unfinished). A
client that goes away closes the upstream request. In every case the turn is finished, with the
output ids settled so far, so the session holds a consistent prefix and the next prompt's
comparison rolls back whatever it must. A request the shadow cannot follow (no messages, a
template error, the shadow off) is still forwarded; only the turn is skipped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from typing import Any

import anyio
import anyio.to_thread
import httpx

from shadow.adapters.service import ShadowService
from shadow.core.errors import ShadowError
from shadow.core.host import UnknownRequest

from .output import OutputIds
from .sessions import SESSION_HEADER, Sessions

log = logging.getLogger("shadow.proxy")

SHADOW_PATHS = ("/v1/conductor/shadow", "/schema")
CHAT_PATH = "/v1/chat/completions"
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
              b"trailer", b"upgrade", b"host", b"content-length", b"transfer-encoding"}
# the response keeps content-length and transfer-encoding: its bytes are passed on as they were sent
RESPONSE_DROP = HOP_BY_HOP - {b"content-length", b"transfer-encoding"} - {b"host"}

Scope = dict[str, Any]
Receive = Any
Send = Any


class _Turn:
    """One chat completion followed as a turn of the host interface."""

    def __init__(self, proxy: ProxyApp, body: dict[str, Any], header: str | None) -> None:
        self.proxy = proxy
        self.body = body
        self.header = header
        self.request_id = f"proxy-{uuid.uuid4().hex}"
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
        self.enable_thinking = thinking if isinstance(thinking, bool) else None
        self.output = OutputIds(self.enable_thinking)
        self.session: str | None = None
        self.first = False

    @property
    def service(self) -> ShadowService:
        return self.proxy.service

    async def start(self) -> None:
        messages: list[dict[str, Any]] = self.body["messages"]
        tools: list[dict[str, Any]] | None = self.body.get("tools")
        await anyio.to_thread.run_sync(self.service.arrived, self.request_id)
        try:
            prompt = await anyio.to_thread.run_sync(
                lambda: self.service.render(messages, tools, self.enable_thinking))
            self.session = self.proxy.sessions.pick(prompt, self.header)
            await anyio.to_thread.run_sync(lambda: self.service.started(self.request_id, self.session or "", prompt))
        except (ShadowError, TypeError, ValueError) as err:
            # not followed, still forwarded: the client's request is the upstream's business
            log.warning("chat completion not followed: %s: %s", type(err).__name__, err)
            self.proxy.errors.append(f"{type(err).__name__}: {err}")
            self.session = None
            with contextlib.suppress(UnknownRequest):  # ``started`` finishes the turn when feeding fails
                self.service.activity.record_finished(self.request_id)

    def _feed(self, ids: list[int]) -> None:
        if ids and self.session is not None:
            self.proxy.sessions.extend(self.session, ids)

    async def delta(self, choice: dict[str, Any], key: str) -> None:
        if self.session is None:
            return
        if not self.first:
            self.first = True
            await anyio.to_thread.run_sync(self.service.first_token, self.request_id)
        self.output.add_choice(choice, key)
        ids = self.output.round()
        self._feed(ids)
        await anyio.to_thread.run_sync(self.service.round_ended, self.request_id, ids)

    async def finish(self, complete: bool) -> None:
        """The turn ends; with ``complete`` the reply's remaining ids are fed (not after a failure:
        the template would close a reply the model never finished)."""
        if self.session is None:
            return
        ids = self.output.final() if complete else []
        self._feed(ids)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.service.finished, self.request_id, ids)


def _events(buffer: bytearray) -> list[bytes]:
    """Whole SSE events taken off the front of ``buffer`` (what is left waits for more bytes)."""
    out = []
    text = bytes(buffer).replace(b"\r\n", b"\n")
    *done, rest = text.split(b"\n\n")
    out.extend(done)
    buffer[:] = rest
    return out


def _choices(event: bytes) -> list[dict[str, Any]]:
    data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return []
    try:
        obj = json.loads(data)
    except ValueError:
        return []
    choices = obj.get("choices") if isinstance(obj, dict) else None
    return [c for c in choices or [] if isinstance(c, dict) and c.get("index", 0) == 0]


class ProxyApp:
    """The ASGI app: the shadow's own routes, the followed chat completions, the rest passed on."""

    def __init__(self, shadow_app: Any, container: Any, upstream: str, timeout_s: float = 600.0) -> None:
        self.shadow_app = shadow_app
        self.container = container
        self.upstream = upstream.rstrip("/")
        self.timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self.sessions = Sessions(container.settings().grid)
        self.errors: list[str] = []
        self._client: httpx.AsyncClient | None = None

    @property
    def service(self) -> ShadowService:
        service: ShadowService = self.container.service()
        return service

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout)
        return self._client

    def _closing(self, receive: Receive) -> Receive:
        async def wrapped() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] == "lifespan.shutdown" and self._client is not None:
                await self._client.aclose()
                self._client = None
            return message
        return wrapped

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.shadow_app(scope, self._closing(receive), send)  # it starts and stops the service
            return
        if scope["type"] != "http" or scope["path"].startswith(SHADOW_PATHS):
            await self.shadow_app(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body.extend(message.get("body", b""))
            if not message.get("more_body"):
                break
        turn = None
        if scope["method"] == "POST" and scope["path"] == CHAT_PATH:
            turn = await self._turn(bytes(body), scope)
        await self._forward(scope, bytes(body), receive, send, turn)

    async def _turn(self, body: bytes, scope: Scope) -> _Turn | None:
        try:
            parsed = json.loads(body)
        except ValueError:
            return None
        if not isinstance(parsed, dict) or not isinstance(parsed.get("messages"), list):
            return None
        headers = dict((k.lower(), v) for k, v in scope["headers"])
        header = headers.get(SESSION_HEADER.encode())
        turn = _Turn(self, parsed, header.decode("latin-1") if header else None)
        await turn.start()
        return turn

    def _request(self, scope: Scope, body: bytes) -> httpx.Request:
        url = self.upstream + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        return self.client().build_request(scope["method"], url, headers=headers, content=body)

    async def _forward(self, scope: Scope, body: bytes, receive: Receive, send: Send, turn: _Turn | None) -> None:
        complete = False
        try:
            try:
                response = await self.client().send(self._request(scope, body), stream=True)
            except httpx.TimeoutException as err:
                await _plain(send, 504, f"the upstream {self.upstream} timed out: {type(err).__name__}")
                return
            except httpx.HTTPError as err:
                await _plain(send, 502, f"the upstream {self.upstream} failed: {type(err).__name__}: {err}")
                return
            try:
                complete = await self._relay(response, receive, send, turn)
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
        finally:
            if turn is not None:
                await turn.finish(complete)

    async def _relay(self, response: httpx.Response, receive: Receive, send: Send, turn: _Turn | None) -> bool:
        """Pass the response on; True when the upstream finished it and the client got all of it."""
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in RESPONSE_DROP]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        follow = turn is not None and turn.session is not None and response.status_code < 400
        streaming = response.headers.get("content-type", "").startswith("text/event-stream")
        buffer, whole = bytearray(), bytearray()
        gone = anyio.Event()

        async def watch(scope: anyio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            scope.cancel()  # the client went away: stop reading the upstream (it is closed after)

        done = False
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            try:
                async for raw in response.aiter_raw():
                    await send({"type": "http.response.body", "body": raw, "more_body": True})
                    if not follow or turn is None:
                        continue
                    if streaming:
                        buffer.extend(raw)
                        for event in _events(buffer):
                            for choice in _choices(event):
                                await turn.delta(choice, "delta")
                    else:
                        whole.extend(raw)
                done = True
            except httpx.HTTPError as err:
                log.warning("the upstream broke mid-response: %s: %s", type(err).__name__, err)
            except OSError:  # uvicorn's ClientDisconnected: the client went away while we sent
                gone.set()
            finally:
                tg.cancel_scope.cancel()
        if not done or gone.is_set():
            return False  # the client's response stays unfinished, as the upstream's did
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if follow and turn is not None and not streaming and whole:
            await self._whole(bytes(whole), response, turn)
        return True

    async def _whole(self, raw: bytes, response: httpx.Response, turn: _Turn) -> None:
        try:
            text = raw if not response.headers.get("content-encoding") else httpx.Response(
                200, headers={"content-encoding": response.headers["content-encoding"]}, content=raw).read()
            obj = json.loads(text)
        except (ValueError, httpx.HTTPError):
            return
        for choice in (obj.get("choices") or []) if isinstance(obj, dict) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                await turn.delta(choice, "message")


async def _plain(send: Send, status: int, text: str) -> None:
    body = json.dumps({"error": {"message": text, "type": "upstream_error", "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def create_proxy_app(upstream: str, container: Any = None, timeout_s: float = 600.0) -> ProxyApp:
    """The proxy over ``container`` (by default built from the environment and ``serve.env``)."""
    from shadow.api.app import create_app

    if container is None:
        from shadow.container import build_container
        from shadow.core.settings import ShadowSettings

        container = build_container(ShadowSettings())
    return ProxyApp(create_app(container), container, upstream, timeout_s)
