"""The Litestar app: questions, status, feeding and host activity for an out-of-process host.

``create_app(container)`` builds it; its lifespan owns the container's resources (the tracer
provider) and the service's idle loop, and makes a planned stop on the way out. Routes, all under
``/v1/conductor/shadow``:

==========================  ======================================================================
``POST /ask``               a typed decision over the whole session: label, probabilities, behind
``GET /status``             the slot, sessions (read position, backlog, bytes, checkpoints, where),
                            windows, host activity, the router's agreement, the last answers
``POST /narrate``           the narrator's summary on top of the session (profile narrator: on)
``GET /narration``          the narrator's summaries of finished thoughts, as server-sent events
                            (``?session=``: one session's only)
``POST /feed/prompt``       a turn's whole prompt: ids, or messages (+ tools) rendered here
``POST /feed/output``       Qwen's output ids, appended
``POST /host/arrived``      a request is queued (the idle window stops before its next chunk)
``POST /host/started``      the request runs: returns once the idle window is out of the way, with
                            its prompt fed
``POST /host/first-token``  the turn's first token (the ration counts from here)
``POST /host/round-ended``  a decode round ended: its output ids; reads within the ration before
                            it answers (the host waits for the answer before its next round)
``POST /host/finished``     the turn is over
``POST /host/holds``        a hold (idle window shut) with a time to live; ``DELETE`` ends it
``DELETE /sessions/{name}`` forget a session: its state, its parked file, its bookkeeping
==========================  ======================================================================

Errors are JSON ``{"status_code", "detail"}``: 400 bad input (malformed or too deeply nested JSON,
wrong types: bodies are decoded strictly, ``"17"`` and ``1.5`` are not token ids, ``373.0`` is; ids
out of the vocabulary, choices that are not one token, a session beyond ``MAX_SESSION_IDS``, a hold
beyond ``MAX_HOLD_S``, a foreign ``Host``), 401 no token when ``QWEN38_SHADOW_TOKEN`` is set, 403 a
browser ``Origin`` not allowed, 404 unknown session, request or hold, 413 a body over
``QWEN38_SHADOW_MAX_BODY_KB``, 415 a body that is not ``application/json``, 429 more holds than
``MAX_HOLDS`` or live requests than ``MAX_ARRIVED``, 503 the shadow off or its model not loaded yet
(``guard.py`` says why each refusal before a route).
The OpenAPI schema is served at ``/schema/openapi.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio.to_thread
import msgspec
from litestar import Controller, Litestar, Request, Response, delete, get, post
from litestar.di import Provide
from litestar.exceptions import HTTPException, SerializationException
from litestar.logging.config import LoggingConfig
from litestar.middleware.base import DefineMiddleware
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin
from litestar.openapi.spec import Tag
from litestar.openapi.spec.base import BaseSchemaObject
from litestar.response import ServerSentEvent
from litestar.response.sse import ServerSentEventMessage
from litestar.status_codes import (
    HTTP_400_BAD_REQUEST,
    HTTP_404_NOT_FOUND,
    HTTP_409_CONFLICT,
    HTTP_429_TOO_MANY_REQUESTS,
    HTTP_500_INTERNAL_SERVER_ERROR,
    HTTP_503_SERVICE_UNAVAILABLE,
)

from shadow.adapters.metrics import Metrics
from shadow.adapters.narrator import Narration
from shadow.adapters.service import Narrated, ShadowService, ShadowUnavailable
from shadow.adapters.status import Status
from shadow.core.errors import BadInput, HeldElsewhere, ShadowError, TooMany, UnknownSession
from shadow.core.host import UnknownRequest
from shadow.core.profiles import ProfileError
from shadow.core.records import Answer, FeedResult, RoundResult, StartedTurn, TurnTimeline

from . import models
from .guard import Guard
from .models import Arrived, AskBody, Chat, HoldBody, NarrateBody, Output, Prompt, RequestRef, Round, Started
from .operators import OperatorController, template_config
from .responses import Hold, Problem

# what the routes answer: the layers' records as they are (their schemas are msgspec's, see below)
ANSWERS = (Answer, FeedResult, TurnTimeline, StartedTurn, RoundResult, Status, Narrated, Hold, Problem)

BASE = "/v1/conductor/shadow"
KEEP_ALIVE_S = 15.0  # a comment line this often: a client that went away is noticed
log = logging.getLogger("shadow.api")
VERSION = "0.1.0"


def _spec(text: str) -> ResponseSpec:
    return ResponseSpec(data_container=Problem, description=text, generate_examples=False)


GUARDED = {
    400: _spec("A Host header this service does not answer to"),
    401: _spec("QWEN38_SHADOW_TOKEN is set and the request does not carry it as a bearer token"),
    403: _spec("A browser Origin that QWEN38_SHADOW_ALLOWED_ORIGINS does not allow"),
}
UNKNOWN = {**GUARDED, 404: _spec("Unknown session, request or hold")}
FORGET = {**UNKNOWN, 400: _spec("The session is in use (a read or a question on it), or a foreign Host")}
ERRORS = {
    **UNKNOWN,
    400: _spec("Bad input: malformed or too deeply nested JSON, wrong types or fields, ids out of the "
               "vocabulary, choices that are not one token, an unknown profile, a session too long, "
               "a foreign Host header"),
    409: _spec("Another instance holds the session's lease in the shared store (QWEN38_SHADOW_STORE): the "
               "detail names it"),
    413: _spec("The body is larger than QWEN38_SHADOW_MAX_BODY_KB"),
    415: _spec("The body is not application/json"),
    503: _spec("The shadow is off, or its model is not loaded yet, or failed to load"),
}


@dataclass
class _Exact(BaseSchemaObject):
    """A component schema as msgspec writes it (every constraint the server checks)."""

    raw: dict[str, Any]

    def to_schema(self) -> dict[str, Any]:
        return self.raw


def _exact_components(app: Litestar) -> None:
    """Litestar's generated schemas drop constraints nested in lists and unions (token ids' range,
    a prompt's minimum length) and ``additionalProperties: false``; msgspec's own JSON schema of
    the same structs keeps them, so the served components are msgspec's."""
    structs = [getattr(models, n) for n in models.__all__] + list(ANSWERS)
    _, components = msgspec.json.schema_components(structs, ref_template="#/components/schemas/{name}")
    schema = app.openapi_schema
    assert schema.components.schemas is not None
    for name, raw in components.items():
        schema.components.schemas[name] = _Exact(raw)  # type: ignore[assignment]
    # A session's name in a path is any name (a "path" parameter only so that it may hold "/"), not a URI.
    forget = schema.paths[BASE + "/sessions/{session}"].delete  # type: ignore[index]
    assert forget is not None and forget.parameters
    forget.parameters[0].schema = _Exact({"type": "string", "minLength": 1, "maxLength": 256})  # type: ignore[union-attr]


def _prompt(p: list[int] | Chat) -> dict[str, Any]:
    """The service's keyword arguments for a prompt given as ids or as messages."""
    if isinstance(p, Chat):
        return {"messages": [msgspec.to_builtins(m) for m in p.messages], "tools": p.tools,
                "enable_thinking": p.enable_thinking}
    return {"ids": p}


class ShadowController(Controller):
    path = BASE
    tags = ("shadow",)

    @post("/ask", responses=ERRORS, status_code=200, sync_to_thread=True,
          summary="Ask a typed question about a session")
    def ask(self, data: AskBody, service: ShadowService) -> Answer:
        return service.ask(data.session, data.question, data.choices)

    @get("/status", responses=GUARDED, sync_to_thread=True,
         summary="The slot, every session's read position, the windows")
    def status(self, service: ShadowService) -> Status:
        return service.status()

    @post("/narrate", responses=ERRORS, status_code=200, sync_to_thread=True,
          summary="The narrator's summary on top of a session")
    def narrate(self, data: NarrateBody, service: ShadowService) -> Narrated:
        return service.narrate(data.session, data.prompt, data.max_new)

    @get("/narration", responses=GUARDED, summary="The narrator's summaries, as server-sent events")
    async def narration(self, service: ShadowService, session: str | None = None) -> ServerSentEvent:
        """One ``narration`` event per summary (its JSON record), from the moment of the request on;
        the stream opens with a ``: subscribed`` comment, keeps alive with comments, and ends when
        the server stops."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Narration | None] = asyncio.Queue()

        def put(n: Narration | None) -> None:  # on the round's thread; None: the server stops
            if n is None or session is None or n.session == session:
                with contextlib.suppress(RuntimeError):  # the loop is closed: the stream is gone
                    loop.call_soon_threadsafe(queue.put_nowait, n)

        stop = service.on_narration(put, lambda: put(None))

        async def events() -> AsyncIterator[ServerSentEventMessage]:
            try:
                yield ServerSentEventMessage(data=None, comment="subscribed")
                while True:
                    try:
                        n = await asyncio.wait_for(queue.get(), KEEP_ALIVE_S)
                    except TimeoutError:
                        yield ServerSentEventMessage(data=None, comment="keep-alive")
                        continue
                    if n is None:
                        return
                    yield ServerSentEventMessage(data=msgspec.json.encode(n).decode(), event="narration",
                                                 id=f"{n.session}/{n.thought}")
            finally:
                stop()

        return ServerSentEvent(events())

    @delete("/sessions/{session:path}", responses=FORGET, status_code=204, sync_to_thread=True,
            summary="Forget a session: its state, its parked file, its bookkeeping")
    def forget(self, request: Request[Any, Any, Any], session: Path, service: ShadowService) -> None:
        # The name as sent (percent-encoded, so it may hold "/"), not the path Litestar normalised.
        raw = request.scope.get("raw_path") or request.url.path.encode()
        service.forget(unquote(raw.decode("latin-1").split("/sessions/", 1)[1]))


class FeedController(Controller):
    path = BASE + "/feed"
    tags = ("feeding",)

    @post("/prompt", responses=ERRORS, status_code=200, sync_to_thread=True,
          summary="A turn's whole prompt (ids or messages)")
    def prompt(self, data: Prompt, service: ShadowService) -> FeedResult:
        return service.feed_prompt(data.session, profile=data.profile, **_prompt(data.prompt))

    @post("/output", responses=ERRORS, status_code=200, sync_to_thread=True,
          summary="Qwen's output ids, appended")
    def output(self, data: Output, service: ShadowService) -> FeedResult:
        return service.feed_output(data.session, data.ids)


class HostController(Controller):
    path = BASE + "/host"
    tags = ("host",)

    @post("/arrived", responses=ERRORS, status_code=200,
          summary="A request is queued")
    async def arrived(self, data: Arrived, service: ShadowService) -> TurnTimeline:
        return service.arrived(data.request_id)

    @post("/started", responses=ERRORS, status_code=200, sync_to_thread=True,
          summary="The request runs; answers once the idle window is out of the way")
    def started(self, data: Started, service: ShadowService) -> StartedTurn:
        router = None
        if data.router is not None:
            router = {"question": data.router.question, "choices": data.router.choices, "label": data.router.label,
                      "fresh": data.router.fresh}
        turn, fed = service.started(data.request_id, data.session, profile=data.profile, router=router,
                                    **_prompt(data.prompt))
        return StartedTurn(turn=turn, fed=fed)

    @post("/first-token", responses=ERRORS, status_code=200,
          summary="The turn's first token")
    async def first_token(self, data: RequestRef, service: ShadowService) -> TurnTimeline:
        return service.first_token(data.request_id)

    @post("/round-ended", responses=ERRORS, status_code=200, sync_to_thread=True,
          summary="A decode round ended; reads within the ration before answering")
    def round_ended(self, data: Round, service: ShadowService) -> RoundResult:
        return service.round_ended(data.request_id, data.ids)

    @post("/finished", responses=ERRORS, status_code=200, sync_to_thread=True,
          summary="The turn is over")
    def finished(self, data: Round, service: ShadowService) -> TurnTimeline:
        return service.finished(data.request_id, data.ids)

    @post("/holds", responses={**ERRORS, 429: _spec("QWEN38_SHADOW_MAX_HOLDS holds are live already")},
          status_code=201,
          summary="Keep the idle window shut (with a TTL)")
    async def add_hold(self, data: HoldBody, service: ShadowService) -> Hold:
        return Hold(hold_id=service.add_hold(data.ttl_s))

    @delete("/holds/{hold_id:str}", responses=UNKNOWN, status_code=204, summary="End a hold")
    async def release_hold(self, hold_id: str, service: ShadowService) -> None:
        service.release_hold(hold_id)


def _problem(status: int) -> Any:
    def handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
        return Response(Problem(status_code=status, detail=str(exc)), status_code=status)

    return handler


def _http_problem(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Problem]:
    detail = exc.detail
    if isinstance(exc.__cause__, SerializationException):
        detail = f"the body is not valid JSON (malformed): {detail}"
    if exc.extra:
        detail = f"{detail}: {exc.extra}"
    return Response(Problem(status_code=exc.status_code, detail=str(detail)), status_code=exc.status_code,
                    headers=exc.headers)


def _integral(obj: Any) -> Any:
    """``obj`` with every float that has no fractional part made an int (``373.0`` -> ``373``)."""
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, list):
        return [_integral(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _integral(v) for k, v in obj.items()}
    return obj


async def _strict_body(request: Request[Any, Any, Any]) -> None:
    """Decode the body strictly (msgspec's default) before Litestar's own lenient conversion, which
    takes ``"17"`` as an int; a wrong type, a malformed or a too deeply nested body is 400. A number
    with no fractional part (``373.0``, ``1e3``) is the integer the OpenAPI schema says it is (JSON
    Schema's ``integer``): taken where an int is, on a second, slower pass only when the first fails."""
    field = request.route_handler.parsed_fn_signature.parameters.get("data")
    if field is None:
        return
    try:
        body = await request.body()
        try:
            msgspec.json.decode(body, type=field.annotation)
        except msgspec.ValidationError as err:
            if "got `float`" not in str(err):
                raise
            msgspec.convert(_integral(msgspec.json.decode(body)), type=field.annotation, strict=True)
    except msgspec.ValidationError as err:
        raise HTTPException(status_code=HTTP_400_BAD_REQUEST, detail=f"wrong body: {err}") from None
    except msgspec.DecodeError as err:
        raise HTTPException(status_code=HTTP_400_BAD_REQUEST,
                            detail=f"the body is not valid JSON (malformed): {err}") from None
    except RecursionError:
        raise HTTPException(status_code=HTTP_400_BAD_REQUEST, detail="the body's JSON is nested too deeply") from None


def _internal(request: Request[Any, Any, Any], exc: Exception) -> Response[Problem]:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return Response(Problem(status_code=500, detail=f"internal error: {type(exc).__name__}"), status_code=500)


def create_app(container: Any = None, *, start_idle_loop: bool = True) -> Litestar:
    """The app over ``container`` (by default built from the environment and ``serve.env``)."""
    if container is None:
        from shadow.container import build_container
        from shadow.core.settings import ShadowSettings

        container = build_container(ShadowSettings())
    settings = container.settings()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        container.init_resources()
        service: ShadowService = container.service()
        app.state.service = service
        if start_idle_loop:
            service.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(service.stop)
            container.shutdown_resources()

    def provide_service(request: Request[Any, Any, Any]) -> ShadowService:
        service: ShadowService = request.app.state.service
        return service

    app = Litestar(
        route_handlers=[ShadowController, FeedController, HostController, OperatorController],
        dependencies={"service": Provide(provide_service, sync_to_thread=False),
                      "metrics": Provide(lambda: container.metrics(), sync_to_thread=False)},
        template_config=template_config(),
        lifespan=[lifespan],
        exception_handlers={
            HTTPException: _http_problem,
            UnknownSession: _problem(HTTP_404_NOT_FOUND),
            UnknownRequest: _problem(HTTP_404_NOT_FOUND),
            BadInput: _problem(HTTP_400_BAD_REQUEST),
            ProfileError: _problem(HTTP_400_BAD_REQUEST),
            TooMany: _problem(HTTP_429_TOO_MANY_REQUESTS),
            HeldElsewhere: _problem(HTTP_409_CONFLICT),
            ShadowUnavailable: _problem(HTTP_503_SERVICE_UNAVAILABLE),
            ShadowError: _problem(HTTP_500_INTERNAL_SERVER_ERROR),
            Exception: _internal,
        },
        middleware=[DefineMiddleware(Guard, settings=settings)],
        before_request=_strict_body,
        logging_config=LoggingConfig(configure_root_logger=False, log_exceptions="never"),
        request_max_body_size=settings.max_body_kb * 1024,
        openapi_config=OpenAPIConfig(
            title="shadow", version=VERSION, path="/schema",
            description="A small Qwen3.5 that follows every session a served Qwen holds, read on a grid.",
            tags=[Tag(name="shadow"), Tag(name="feeding"), Tag(name="host"), Tag(name="operators")],
            render_plugins=[JsonRenderPlugin(), SwaggerRenderPlugin()],
        ),
        signature_namespace={"ShadowService": ShadowService, "Metrics": Metrics},
        debug=False,
    )
    _exact_components(app)
    return app
