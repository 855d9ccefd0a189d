"""``shadow proxy``: an OpenAI-compatible front that forwards every request to an engine (vLLM,
SGLang, llama.cpp, ``transformers serve``, ...) and follows its chat completions with the shadow.

Every route first passes the API's checks (``shadow.api.guard``): the ``Host``, a browser
``Origin``, ``application/json`` bodies, and with ``QWEN38_SHADOW_TOKEN`` set the token: on the
proxy's own paths (``/v1/conductor/shadow``, ``/v1/conductor/proxy``, ``/schema``) as a bearer token
or ``X-Shadow-Token``, on the paths forwarded to the engine as ``X-Shadow-Token`` only (the
engine's ``Authorization`` passes untouched). The token header and the page's ``shadow_token``
cookie are never forwarded. ``GET /v1/conductor/proxy/health`` is the proxy's liveness. A body
over ``QWEN38_SHADOW_PROXY_MAX_BODY_KB`` is refused (413), an ``X-Session-Id`` that is not a session
name (400). Then the request goes to ``--upstream`` as it came (less ``Host``, the hop-by-hop
headers and the token) and the engine's status, headers and bytes come back as they were sent,
streamed as they arrive.

Paths under ``/v1/conductor/shadow`` and ``/schema`` are the shadow's own routes: the in-process
service's app, or with ``--shadow URL`` passed on to that service; a client with an engine key
reaches only its own sessions there (``scope.py``). ``GET /v1/conductor/proxy/status`` is the
proxy's own status: its counters (``counts.py``), its index of sessions (``index.py``: on disk, or
in Redis with ``QWEN38_SHADOW_STORE``), its engine and any fallback from the engine's id fields.

A ``POST /v1/chat/completions`` is also a turn of the host interface (``turn.py``), on the shadow
through ``shadow.core.host.Host``: the in-process service, or a ``ShadowClient``. It starts only
with the engine's first data after a 2xx. A body the proxy cannot decode (not JSON, nested too
deep) is forwarded unfollowed. Where the engine refuses the id fields the proxy added (400 or 422),
the client's own body is sent once more and the proxy renders for that engine from then on.
Failures stay the engine's: an error status is returned as it came; an engine that cannot be
reached or times out gives 502 or 504; one that breaks mid-stream breaks the client's stream the
same way. A client that goes away closes the upstream request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Any

import anyio

from shadow.api.guard import PROXY_OWN, TOKEN_HEADER, Guard, problem, without_cookie
from shadow.core.host import Host
from shadow.core.scheduling import NullTelemetry, Telemetry

from .counts import ProxyCounts
from .engines import BY_NAME, ENGINES, Engine, from_models
from .indexes import open_index
from .relay import relay
from .scope import SessionScope
from .sessions import SESSION_HEADER, Sessions, client_of
from .turn import ProxyTurn
from .upstream import Response, Upstream, UpstreamError, UpstreamTimeout

log = logging.getLogger("shadow.proxy")

SHADOW_PATHS = ("/v1/conductor/shadow", "/schema")
STATUS_PATH = "/v1/conductor/proxy/status"
HEALTH_PATH = "/v1/conductor/proxy/health"  # the proxy's liveness: 200 while it answers, whatever the engine or shadow
CHAT_PATH = "/v1/chat/completions"
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
              b"trailer", b"upgrade", b"host", b"content-length", b"transfer-encoding"}
NAME_MAX = 256  # as the API's session names (shadow.api.models.Name)

Scope = dict[str, Any]
Receive = Any
Send = Any


def session_header(scope: Scope) -> tuple[str | None, str | None]:
    """The ``X-Session-Id`` (or None) and why it is refused (or None): a session name as the API takes it."""
    raw = next((v for k, v in scope["headers"] if k.lower() == SESSION_HEADER.encode()), None)
    if raw is None:
        return None, None
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "X-Session-Id is not UTF-8"
    if not name or len(name) > NAME_MAX or name != name.strip():
        return None, (f"X-Session-Id must be 1 to {NAME_MAX} characters with no leading or trailing blanks "
                      f"(got {len(name)} characters)")
    return name, None


class ProxyApp:
    """The ASGI app: checks, the shadow's routes, the followed chat completions, the rest passed on."""

    def __init__(self, host: Host, settings: Any, upstream: str, timeout_s: float = 600.0,
                 engine: str = "auto", shadow_app: Any = None, shadow_url: str | None = None,
                 telemetry: Telemetry | None = None, metrics: Any = None) -> None:
        if engine not in ENGINES:
            raise ValueError(f"--engine {engine!r}: choose from {', '.join(ENGINES)}")
        self.host = host
        self.settings = settings
        self.shadow_app = shadow_app
        self.shadow_url = shadow_url.rstrip("/") if shadow_url else None
        self.upstream = upstream.rstrip("/")
        self.engine_setting = engine
        self.engine: Engine | None = BY_NAME.get(engine)
        self.guard = Guard(None, settings, own=PROXY_OWN)
        self.max_body = settings.proxy_max_body_kb * 1024
        self.sessions = Sessions(settings.grid, index=open_index(settings))
        self.scope = SessionScope(self.sessions)
        self.fallback: dict[str, Any] | None = None  # the engine refused its id fields: rendering since
        self.counts = ProxyCounts(metrics)
        self.telemetry: Telemetry = telemetry or NullTelemetry()
        self._recent: dict[bytes, tuple[str, float]] = {}
        self.open_turns: dict[str, anyio.Event] = {}  # session -> its turn through here not finished yet
        self.in_flight = 0  # chat completions being followed (a client may have all its bytes already)
        self._mu = threading.Lock()
        self.client = Upstream(timeout_s)
        if metrics is not None:  # its counters on /metrics too, every reason at 0 from the start
            metrics.watch_proxy(lambda: {**self.counts.as_dict(), "in_flight": self.in_flight})

    @property
    def engine_name(self) -> str:
        return self.engine.name if self.engine is not None else "auto (not asked yet)"

    # ---- retries --------------------------------------------------------------------------------

    def recent_turn(self, fingerprint: bytes) -> str | None:
        """The session of a turn with the same body that started within ``proxy_retry_s``."""
        now = time.monotonic()
        with self._mu:
            for k in [k for k, (_, t) in self._recent.items() if now - t > self.settings.proxy_retry_s]:
                del self._recent[k]
            got = self._recent.get(fingerprint)
        return got[0] if got is not None and self.sessions.knows(got[0]) else None

    def remember_turn(self, fingerprint: bytes, session: str | None) -> None:
        if session is not None:
            with self._mu:
                self._recent[fingerprint] = (session, time.monotonic())

    # ---- ASGI -------------------------------------------------------------------------------------

    def _closing(self, receive: Receive) -> Receive:
        async def wrapped() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.client.aclose()
                await anyio.to_thread.run_sync(self.sessions.index.close)
            return message
        return wrapped

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            if self.shadow_app is not None:  # it starts and stops the service
                await self.shadow_app(scope, self._closing(receive), send)
                return
            closing = self._closing(receive)
            while (await closing())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            close = getattr(self.host, "close", None)  # a ShadowClient's connections
            if close is not None:
                close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        refused = self.guard.refusal(scope)
        header, bad_header = session_header(scope)
        if refused is None and bad_header is not None:
            refused = 400, bad_header
        if refused is not None:
            self.counts.refused_request(refused[0])
            await problem(send, *refused)
            return
        path = scope["path"]
        if path == STATUS_PATH and scope["method"] == "GET":
            await self._status(send)
            return
        if path == HEALTH_PATH and scope["method"] in ("GET", "HEAD"):
            await _json(send, 200, {"status": "ok"})
            return
        client = client_of(_header(scope, b"authorization"))
        body = await self._body(scope, receive, send)
        if body is None:
            return
        if path.startswith(SHADOW_PATHS):
            await self._shadow_route(scope, body, receive, send, client)
            return
        turn = None
        if scope["method"] == "POST" and path == CHAT_PATH:
            turn, body = await self._turn(body, header, scope, client)
        self.in_flight += turn is not None
        try:
            await self._forward(scope, body, receive, send, turn, self.upstream)
        finally:
            self.in_flight -= turn is not None

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None when it is over the limit (refused: 413) or the client left."""
        length = next((v for k, v in scope["headers"] if k.lower() == b"content-length"), b"0")
        too_big = (413, f"the body is larger than QWEN38_SHADOW_PROXY_MAX_BODY_KB="
                        f"{self.settings.proxy_max_body_kb} KiB")
        if length.isdigit() and int(length) > self.max_body:
            self.counts.refused_request(413)
            await problem(send, *too_big)
            return None
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body.extend(message.get("body", b""))
            if len(body) > self.max_body:
                self.counts.refused_request(413)
                await problem(send, *too_big)
                return None
            if not message.get("more_body"):
                return bytes(body)

    async def _shadow_route(self, scope: Scope, body: bytes, receive: Receive, send: Send, client: str) -> None:
        """The shadow's own routes, scoped to the client (``scope.py``): a session another engine key's
        conversation started is unknown to it (404), and left out of the status it reads."""
        session = self.scope.named(scope, body)
        refused = self.scope.refusal(scope, session, client)
        if refused is not None:
            await problem(send, *refused)
            return
        if scope["method"] == "DELETE" and session is not None:
            # before the answer: a client that reads it finds the session gone from the table too
            self.sessions.forget(session)
        send = self.scope.filtered(scope, send, client)
        if self.shadow_app is not None:
            await self.shadow_app(scope, _replay(body, receive), send)
        else:  # --shadow URL: that service's own routes
            await self._forward(scope, body, receive, send, None, self.shadow_url or "", keep_token=True)

    async def _turn(self, body: bytes, header: str | None, scope: Scope,
                    client: str) -> tuple[ProxyTurn | None, bytes]:
        """The turn to follow (and the body to forward: with the engine's id fields where it gives ids)."""
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
            self.counts.not_followed("undecodable_body")
            return None, body
        if not isinstance(parsed, dict) or not isinstance(parsed.get("messages"), list) or not parsed["messages"]:
            self.counts.not_followed("no_messages")
            return None, body
        engine = await self._engine(scope)
        stream = parsed.get("stream") is True
        added = engine.ask(parsed, stream)
        fields = engine.stream_fields if stream else engine.whole_fields
        turn = ProxyTurn(self, parsed, header, body,
                         engine_prompt=bool(fields) and all(parsed.get(f) is True for f in fields), client=client)
        turn.strip = engine.strip if added else None
        turn.added = added
        return turn, (json.dumps(parsed, ensure_ascii=False).encode() if added else body)

    async def _engine(self, scope: Scope) -> Engine:
        if self.engine is None:  # auto: the engine's /v1/models says which it is (with the client's key)
            auth = [(k, v) for k, v in scope["headers"] if k.lower() == b"authorization"]
            try:
                r = await self.client.send("GET", self.upstream + "/v1/models", auth, b"")
                try:
                    models = await r.read() if r.status_code == 200 else None
                finally:
                    await r.aclose()
            except UpstreamError:
                return BY_NAME["transformers"]  # asked again next time
            if models is None:
                return BY_NAME["transformers"]
            self.engine = from_models(models)
        return self.engine

    async def _send(self, scope: Scope, body: bytes, base: str, keep_token: bool) -> Response:
        url = base + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        # the client's token (header or the page's cookie) is the proxy's, never forwarded; to a shadow
        # of another process (``keep_token``) the proxy, having checked it, sends its own token instead
        drop = HOP_BY_HOP | {TOKEN_HEADER, b"cookie"} | ({b"authorization"} if keep_token else set())
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in drop]
        cookies = b"; ".join(without_cookie(v) for k, v in scope["headers"] if k.lower() == b"cookie")
        if cookies.strip(b"; "):
            headers.append((b"cookie", cookies))
        if keep_token and self.settings.token:
            headers.append((TOKEN_HEADER, self.settings.token.encode()))
        return await self.client.send(scope["method"], url, headers, body)

    async def _refused_fields(self, scope: Scope, turn: ProxyTurn, response: Response) -> Response:
        """The engine refused a request the proxy added its id fields to (400 or 422): the client's own
        body is sent once more, untouched. Where the engine takes that one, the proxy renders for it
        from now on (``fallback`` in status, ``engine_fallbacks`` counted, logged)."""
        refusal = (await response.read())[:300].decode("utf-8", "replace")
        await response.aclose()
        again = await self._send(scope, turn.raw, self.upstream, keep_token=False)
        if 200 <= again.status_code < 300 and self.engine is not None:
            old = self.engine
            self.engine = BY_NAME["transformers"]
            self.fallback = {"engine": old.name, "fields": list(turn.added), "status": response.status_code,
                             "refusal": refusal, "at": time.time()}
            self.counts.add("engine_fallbacks")
            log.warning("the engine refused the id fields %s of --engine %s (%d: %s): rendering prompts from "
                        "now on", turn.added, old.name, response.status_code, refusal)
        turn.engine_prompt, turn.strip, turn.added = False, None, []
        return again

    async def _forward(self, scope: Scope, body: bytes, receive: Receive, send: Send, turn: ProxyTurn | None,
                       base: str, keep_token: bool = False) -> None:
        complete = False
        try:
            try:
                response = await self._send(scope, body, base, keep_token)
                if turn is not None and turn.added and response.status_code in (400, 422):
                    response = await self._refused_fields(scope, turn, response)
            except UpstreamTimeout as err:
                if turn is not None:
                    self.counts.add("unreachable")
                await _plain(send, 504, f"the upstream {base} timed out: {err}")
                return
            except UpstreamError as err:
                if turn is not None:
                    self.counts.add("unreachable")
                await _plain(send, 502, f"the upstream {base} failed: {err}")
                return
            if turn is not None and not 200 <= response.status_code < 300:
                self.counts.add("refused")
                turn = None  # the engine refused it: no turn, no session touched
            try:
                complete = await relay(response, receive, send, turn)
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
        finally:
            if turn is not None:
                await turn.finish(complete)

    async def _status(self, send: Send) -> None:
        with self._mu:
            recent = len(self._recent)
        out = {"upstream": self.upstream, "engine": self.engine_name, "engine_setting": self.engine_setting,
               "in_flight": self.in_flight,
               "engine_fallback": self.fallback,
               "shadow": self.shadow_url or "in process", "sessions": self.sessions.status(),
               "retry_s": self.settings.proxy_retry_s, "recent_bodies": recent,
               "max_body_kb": self.settings.proxy_max_body_kb, "counts": self.counts.as_dict()}
        await _json(send, 200, out)


async def _json(send: Send, status: int, out: dict[str, Any]) -> None:
    body = json.dumps(out).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k.lower() == name), None)


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` for an app after the proxy read the request's body: that body, then the client's
    own messages (its disconnect)."""
    sent = False

    async def wrapped() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        message: dict[str, Any] = await receive()
        return message
    return wrapped


async def _plain(send: Send, status: int, text: str) -> None:
    body = json.dumps({"error": {"message": text, "type": "upstream_error", "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def create_proxy_app(upstream: str, container: Any = None, timeout_s: float = 600.0, engine: str = "auto",
                     shadow_url: str | None = None) -> ProxyApp:
    """The proxy over ``container``'s service (by default built from the environment and
    ``serve.env``), or with ``shadow_url`` over the service of another process (its token: the
    ``QWEN38_SHADOW_TOKEN`` of this one)."""
    from shadow.core.settings import ShadowSettings

    if shadow_url is not None:
        from shadow.api.client import ShadowClient

        settings = container.settings() if container is not None else ShadowSettings()
        client = ShadowClient(shadow_url, timeout=timeout_s, token=settings.token or None)
        return ProxyApp(client, settings, upstream, timeout_s, engine, shadow_url=shadow_url)
    from shadow.api.app import create_app

    if container is None:
        from shadow.container import build_container

        container = build_container(ShadowSettings())
    telemetry = None
    with contextlib.suppress(Exception):  # traces off or not started: the proxy's spans go nowhere
        telemetry = container.telemetry()
    return ProxyApp(container.service(), container.settings(), upstream, timeout_s, engine,
                    shadow_app=create_app(container), telemetry=telemetry, metrics=container.metrics())
