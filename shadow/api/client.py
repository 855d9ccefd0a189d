"""An out-of-process host's side of the HTTP API: one method per endpoint (httpx).

``ShadowClient`` is the host interface (``shadow.core.host.Host``) over HTTP: the same verbs as
the service in process, answering the same records (``TurnTimeline``, ``FeedResult``, ``RoundResult``,
``Answer``, ``Status``, ...), decoded from the JSON the endpoints return by msgspec, strictly: an
answer that does not fit its record is an error, not a half-filled one.

It imports the records and the paths only, not the server: a host that talks to the service over
HTTP loads neither Litestar nor the service (``tests/api/test_client_imports.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from shadow.adapters.records import Narrated, Narration, Status
from shadow.core.records import Answer, FeedResult, RoundResult, RouterAsk, StartedTurn, TurnTimeline

from . import paths as p
from .responses import Hold

R = TypeVar("R")

if TYPE_CHECKING:
    from shadow.core.host import Host


def _prompt(ids: Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None,
            tools: Sequence[Mapping[str, Any]] | None, enable_thinking: bool | None) -> Any:
    """The ``prompt`` field: the ids, or the messages the service renders."""
    if (ids is None) == (messages is None):
        raise ValueError("give the prompt as ids or as messages, one of the two")
    if messages is not None:
        return {"messages": [dict(m) for m in messages], "tools": None if tools is None else [dict(t) for t in tools],
                "enable_thinking": enable_thinking}
    assert ids is not None
    return list(ids)


class ShadowHTTPError(RuntimeError):
    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class ShadowClient:
    def __init__(self, base_url: str, timeout: float = 60.0, token: str | None = None) -> None:
        """``token``: the service's ``QWEN38_SHADOW_TOKEN``, sent as a bearer token with every call."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/") + p.BASE, timeout=timeout, headers=headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ShadowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> bytes:
        r = self.http.request(method, path, json=body)
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise ShadowHTTPError(r.status_code, str(detail))
        return r.content

    def _get(self, record: type[R], method: str, path: str, body: Mapping[str, Any] | None = None) -> R:
        """The answer as its record."""
        content = self._call(method, path, body)
        try:
            return msgspec.json.decode(content, type=record)
        except msgspec.DecodeError as err:  # ValidationError included: the server's answer is not the record
            raise ShadowHTTPError(200, f"{method} {path} answered what is not a {record.__name__}: {err}") from None

    # ---- questions and status ----
    def ask(self, session: str, question: str | Sequence[int], choices: Sequence[str]) -> Answer:
        q = question if isinstance(question, str) else list(question)
        return self._get(Answer, "POST", p.ASK, {"session": session, "question": q, "choices": list(choices)})

    def status(self) -> Status:
        return self._get(Status, "GET", p.STATUS)

    def narrate(self, session: str, prompt: str, max_new: int = 64) -> Narrated:
        return self._get(Narrated, "POST", p.NARRATE, {"session": session, "prompt": prompt, "max_new": max_new})

    def narrations(self, session: str | None = None,
                   on_open: Callable[[], None] | None = None) -> Iterator[Narration]:
        """The narrator's summaries as they come (the server-sent events of ``GET /narration``), one
        ``Narration`` each; an event that is not a ``narration`` named ``session/thought`` is an
        error. ``on_open`` is called once the
        service has subscribed the stream: no summary after that is missed. Runs until the server
        ends the stream, or the caller stops iterating (the connection is then closed)."""
        params = {"session": session} if session is not None else None
        with self.http.stream("GET", p.NARRATION, params=params) as r:
            if r.status_code >= 400:
                r.read()
                raise ShadowHTTPError(r.status_code, r.text)
            kind = r.headers.get("content-type", "")
            if not kind.startswith("text/event-stream"):
                raise ShadowHTTPError(r.status_code, f"/narration answered {kind or 'no content type'}, "
                                                     "not an event stream")
            event: dict[str, str] = {}
            for line in r.iter_lines():
                if line.startswith(":"):  # comments: the subscription, then keep-alives
                    if line == ": subscribed" and on_open is not None:
                        on_open()
                elif line:
                    key, _, value = line.partition(":")
                    event[key] = value.removeprefix(" ")
                elif "data" in event:
                    yield self._narration(event)
                    event = {}

    @staticmethod
    def _narration(event: dict[str, str]) -> Narration:
        try:
            n = msgspec.json.decode(event["data"], type=Narration)
        except msgspec.DecodeError as err:
            raise ShadowHTTPError(200, f"/narration sent what is not a Narration: {err}") from None
        if (event.get("event"), event.get("id")) != ("narration", f"{n.session}/{n.thought}"):
            raise ShadowHTTPError(200, f"/narration sent event {event.get('event')!r} with id {event.get('id')!r}, "
                                       f"not 'narration' with id '{n.session}/{n.thought}'")
        return n

    # ---- feeding ----
    def feed_prompt(self, session: str, prompt: Sequence[int] | Mapping[str, Any], **kw: Any) -> FeedResult:
        """``prompt``: token ids, or ``{"messages": [...], "tools": [...], "enable_thinking": ...}``."""
        body = {"session": session, "prompt": dict(prompt) if isinstance(prompt, Mapping) else list(prompt), **kw}
        return self._get(FeedResult, "POST", p.FEED + p.FEED_PROMPT, body)

    def feed_output(self, session: str, ids: Sequence[int]) -> FeedResult:
        return self._get(FeedResult, "POST", p.FEED + p.FEED_OUTPUT, {"session": session, "ids": list(ids)})

    # ---- the host interface ----
    def arrived(self, request_id: str) -> TurnTimeline:
        return self._get(TurnTimeline, "POST", p.HOST + p.HOST_ARRIVED, {"request_id": request_id})

    def started(self, request_id: str, session: str, ids: Sequence[int] | None = None,
                messages: Sequence[Mapping[str, Any]] | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None, enable_thinking: bool | None = None,
                profile: str | None = None,
                router: RouterAsk | None = None) -> tuple[TurnTimeline, FeedResult]:
        body: dict[str, Any] = {"request_id": request_id, "session": session,
                                "prompt": _prompt(ids, messages, tools, enable_thinking)}
        if profile is not None:
            body["profile"] = profile
        if router is not None:
            body["router"] = msgspec.to_builtins(router)
        got = self._get(StartedTurn, "POST", p.HOST + p.HOST_STARTED, body)
        return got.turn, got.fed

    def first_token(self, request_id: str) -> TurnTimeline:
        return self._get(TurnTimeline, "POST", p.HOST + p.HOST_FIRST_TOKEN, {"request_id": request_id})

    def round_ended(self, request_id: str, ids: Sequence[int] = ()) -> RoundResult:
        return self._get(RoundResult, "POST", p.HOST + p.HOST_ROUND_ENDED, {"request_id": request_id, "ids": list(ids)})

    def finished(self, request_id: str, ids: Sequence[int] = ()) -> TurnTimeline:
        return self._get(TurnTimeline, "POST", p.HOST + p.HOST_FINISHED, {"request_id": request_id, "ids": list(ids)})

    def add_hold(self, ttl_s: float | None = None) -> str:
        """A hold with ``ttl_s``, or the server's default time to live (600 s)."""
        return self._get(Hold, "POST", p.HOST + p.HOST_HOLDS, {} if ttl_s is None else {"ttl_s": ttl_s}).hold_id

    def release_hold(self, hold_id: str) -> None:
        self._call("DELETE", f"{p.HOST}{p.HOST_HOLDS}/{hold_id}")

    def forget(self, session: str) -> None:
        """Drop a session on the service: its state and its parked file."""
        self._call("DELETE", f"{p.SESSIONS}/{quote(session, safe='')}")

    @contextmanager
    def hold(self) -> Iterator[str]:
        hold_id = self.add_hold()
        try:
            yield hold_id
        finally:
            self.release_hold(hold_id)


if TYPE_CHECKING:
    def _is_a_host(client: ShadowClient) -> Host:  # mypy checks the client against the Protocol
        return client
