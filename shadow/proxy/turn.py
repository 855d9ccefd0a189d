"""One chat completion followed as a turn of the host interface (``shadow.core.host.Host``).

The turn starts with the engine's first data: the first event of a 2xx stream that carries a
choice, or a whole 2xx body with one. Then ``arrived``, then ``started`` with the prompt: the
engine's own prompt ids where it returns them (they come with that event or body), else the
messages rendered with the Qwen3.5 template (rendered meanwhile, once the first bytes went out).
Each event then feeds the output ids it settled (``round_ended``), and ``finished`` the rest. A
request the engine refuses or never answers never gets here, and a 2xx stream that ends before any
choice (an engine failing inside its stream) starts nothing: no session changes (``no_choice``).

Following never touches the bytes: whatever goes wrong here (an event of an unexpected shape, the
shadow refusing a feed, a session over its limit) ends the following of this turn only. The turn
is finished with what was settled, and the reason goes to the counters and the turn's span.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import anyio
import anyio.to_thread

from shadow.adapters.chat import render_ids
from shadow.core.errors import BadInput
from shadow.core.host import Host
from shadow.core.protocols import Telemetry
from shadow.core.session import first_difference

from .counts import ProxyCounts
from .engines import prompt_ids, usage_prompt_tokens
from .output import OutputIds
from .sessions import Found, Sessions


class TurnsOwner(Protocol):
    """What a turn needs of the proxy that follows it (``app.ProxyApp`` is one): the host interface,
    the session table, the counts and spans, and the turns it has open."""

    host: Host
    sessions: Sessions
    counts: ProxyCounts
    telemetry: Telemetry
    open_turns: dict[str, anyio.Event]

    @property
    def engine_name(self) -> str: ...

    def recent_turn(self, fingerprint: bytes) -> str | None: ...

    def remember_turn(self, fingerprint: bytes, session: str | None) -> None: ...

log = logging.getLogger("shadow.proxy")
ORDER_WAIT_S = 30.0


class Unparseable(ValueError):
    """An upstream event or body of a shape the proxy cannot follow."""


def _text(part: dict[str, Any], key: str) -> None:
    if part.get(key) is not None and not isinstance(part[key], str):
        raise Unparseable(f"{key} is {type(part[key]).__name__}, not a string")


def check_choice(choice: Any, key: str) -> bool:
    """Whether ``choice`` is the first choice; raises ``Unparseable`` where its shape is not
    OpenAI's (so that ``OutputIds`` only ever reads well-formed parts)."""
    if not isinstance(choice, dict):
        raise Unparseable(f"a choice is {type(choice).__name__}, not an object")
    index = choice.get("index", 0)
    if type(index) is not int:
        raise Unparseable(f"a choice's index is {type(index).__name__}, not an integer")
    part = choice.get(key)
    if part is None:
        part = {}
    if not isinstance(part, dict):
        raise Unparseable(f"a choice's {key} is {type(part).__name__}, not an object")
    for k in ("content", "reasoning_content", "reasoning"):
        _text(part, k)
    calls = part.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise Unparseable(f"tool_calls is {type(calls).__name__}, not a list")
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(call, dict) or (fn is not None and not isinstance(fn, dict)) \
                    or type(call.get("index", 0)) is not int:
                raise Unparseable("a tool call is not {index, id, function: {name, arguments}}")
            if fn is not None:
                _text(fn, "name")
                if fn.get("arguments") is not None and not isinstance(fn["arguments"], str | dict):
                    raise Unparseable("a tool call's arguments are neither a string nor an object")
    ids = choice.get("token_ids")
    if ids is not None and not (isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)):
        raise Unparseable("token_ids is not a list of ids")
    return index == 0


def choices(obj: Any, key: str) -> list[dict[str, Any]]:
    """The first choice of a chunk or response (checked), or none."""
    if not isinstance(obj, dict):
        raise Unparseable(f"the event is {type(obj).__name__}, not an object")
    got = obj.get("choices")
    if got is None:
        return []
    if not isinstance(got, list):
        raise Unparseable(f"choices is {type(got).__name__}, not a list")
    return [c for c in got if check_choice(c, key)]


class ProxyTurn:
    """One chat completion through the proxy, followed as a turn (named apart from the transcripts'
    ``Turn``): ``client`` is the digest of its ``Authorization`` (``sessions.client_of``)."""

    def __init__(self, proxy: TurnsOwner, body: dict[str, Any], header: str | None, raw: bytes,
                 engine_prompt: bool, client: str = "") -> None:
        self.proxy = proxy
        self.host = proxy.host
        self.body = body
        self.header = header
        self.client = client
        self.raw = raw  # the request's bytes: hashed once the turn starts, off the way to the first byte
        self.engine_prompt = engine_prompt  # the engine returns its prompt ids: start with those
        self.request_id = f"proxy-{uuid.uuid4().hex}"
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
        self.enable_thinking = thinking if isinstance(thinking, bool) else None
        self.output = OutputIds(self.enable_thinking)
        self.render: list[int] | None = None
        self.rendered = anyio.Event()
        self.session: str | None = None
        self.how = ""
        self.retry = False
        self.answered = False  # the engine answered 2xx
        self.arrived = False
        self.started = False
        self.first = False
        self.stopped: str | None = None
        self.finish_reason: str | None = None
        self.prompt_len = 0
        self.used_engine_ids = False
        self.mismatch: dict[str, Any] | None = None
        self.strip: Callable[[Any], Any] | None = None  # removes what the proxy asked the engine for
        self.added: list[str] = []  # the id fields the proxy added to the request
        self.done = anyio.Event()  # set once finished: the session's next turn waits for it

    @functools.cached_property
    def fingerprint(self) -> bytes:
        """The body, the session header and the client: a client's retry of the same request has the
        same; another client's identical body does not."""
        h = hashlib.blake2b(self.raw, digest_size=16)
        h.update(b"\0" + (self.header or "").encode() + b"\0" + self.client.encode())
        return h.digest()

    # ---- before the engine answers ---------------------------------------------------------------

    async def prepare(self) -> None:
        """The render, in a thread, once the engine's first bytes went to the client."""
        try:
            messages, tools = self.body["messages"], self.body.get("tools")
            self.render = await anyio.to_thread.run_sync(
                lambda: render_ids(messages, tools, add_generation_prompt=True, enable_thinking=self.enable_thinking))
        except Exception as err:  # the template's errors: the request is the engine's business
            log.warning("chat completion not rendered: %s: %s", type(err).__name__, err)
            self.render = None
        finally:
            self.rendered.set()

    def stop(self, reason: str, err: BaseException | None = None) -> None:
        """Following ends here (the bytes do not): the reason is counted once."""
        if self.stopped is None:
            self.stopped = reason
            self.proxy.counts.not_followed(reason)
            if err is not None:
                log.warning("turn %s no longer followed (%s): %s: %s", self.request_id, reason,
                            type(err).__name__, err)

    async def _call(self, fn: Any, *args: Any) -> Any:
        """A host verb in a thread; a refusal stops following (``None`` back)."""
        try:
            return await anyio.to_thread.run_sync(fn, *args)
        except BadInput as err:
            self.stop("shadow_refused", err)
        except Exception as err:
            status = getattr(err, "status_code", None)
            self.stop("shadow_refused" if status == 400 else "shadow_error", err)
        return None

    # ---- the engine accepted -------------------------------------------------------------------

    async def accepted(self) -> None:
        """The engine answered 2xx: the render is ready before its first data is followed."""
        self.answered = True
        await self.rendered.wait()
        if self.render is None and not self.engine_prompt:
            self.stop("render")

    async def _start(self, prompt: list[int], engine: bool) -> None:
        if not prompt:
            self.stop("render")
            return
        self.prompt_len, self.used_engine_ids = len(prompt), engine
        if engine and self.render is not None and self.render != prompt:
            self._mismatch(len(prompt), first_difference(self.render, prompt))
        sessions = self.proxy.sessions
        found = await anyio.to_thread.run_sync(sessions.find, prompt, self.header, self.client)
        recent = self.proxy.recent_turn(self.fingerprint)
        if recent is not None and self.header is None:
            found = Found(recent, "retried", found.blocks)
        self.retry = recent is not None
        name: str = found.name if found.name is not None else \
            await anyio.to_thread.run_sync(sessions.new_name, prompt, self.client, found.parent)
        self.session, self.how = name, found.how
        await self._after_previous(name)
        got = await self._call(lambda: self.host.started(self.request_id, self.session or "", ids=prompt))
        if got is None:
            return  # the shadow refused the prompt: the table stays as it was too
        await anyio.to_thread.run_sync(sessions.record, name, found, prompt, self.client)
        self.started = True
        self.proxy.remember_turn(self.fingerprint, self.session)
        counts = self.proxy.counts
        counts.add("retries" if self.retry else "turns")
        if engine:
            counts.add("engine_ids")
        counts.add({"new": "sessions_new", "branched": "sessions_branched"}.get(found.how, "sessions_joined"))

    async def _after_previous(self, session: str) -> None:
        """The session's previous turn through this proxy finishes first (its client may send the next
        request as soon as it has the last byte, before the proxy told the shadow the turn ended):
        so the shadow sees a session's turns in order. Bounded, so that a stuck turn holds up nothing."""
        turns = self.proxy.open_turns
        previous = turns.get(session)
        turns[session] = self.done
        if previous is not None:
            with anyio.move_on_after(ORDER_WAIT_S):
                await previous.wait()

    def _mismatch(self, engine_len: int, first: int | None) -> None:
        self.mismatch = {"request_id": self.request_id, "rendered": len(self.render or []), "engine": engine_len,
                         "first_difference": first, "at": time.time()}

    async def event(self, obj: Any, key: str) -> None:
        """One parsed stream chunk (``delta``) or the whole response (``message``)."""
        if self.stopped:
            return
        first = choices(obj, key)  # checked before anything is fed
        if not self.started:
            if not first:  # not the engine's first data yet (a comment, an error, usage alone)
                return
            self.arrived = await self._call(self.host.arrived, self.request_id) is not None
            if not self.arrived:
                return
            ids = prompt_ids(obj) if self.engine_prompt else None
            await self._start(ids if ids is not None else self.render or [], engine=ids is not None)
            if not self.started:
                return
        n = usage_prompt_tokens(obj)
        if n is not None and not self.used_engine_ids and n != len(self.render or []) and self.mismatch is None:
            self._mismatch(n, None)
        for choice in first:
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
            if not self.first:
                self.first = True
                await self._call(self.host.first_token, self.request_id)
            self.output.add_choice(choice, key)
            await self._feed(self.output.round(), final=False)

    async def _feed(self, ids: list[int], final: bool) -> bool:
        if self.stopped and not final:
            return False
        verb = self.host.finished if final else self.host.round_ended
        if await self._call(verb, self.request_id, ids) is None:
            return False
        if ids and self.session is not None:
            self.proxy.sessions.extend(self.session, ids)
        return True

    async def finish(self, complete: bool) -> None:
        """The turn ends: with ``complete`` (the engine finished, the client got it all) the reply's
        remaining ids are fed; a reply cut by ``max_tokens`` as the text it holds, closing nothing."""
        with anyio.CancelScope(shield=True):
            if self.started:
                ids: list[int] = []
                if complete and not self.stopped:
                    try:
                        ids = self.output.final(cut=self.finish_reason == "length")
                    except Exception as err:
                        self.stop("unparseable_event", err)
                if not await self._feed(ids, final=True) and self.started:
                    await self._call(self.host.finished, self.request_id, [])  # closes the turn
            elif self.arrived:
                await self._call(self.host.finished, self.request_id, [])
            elif self.answered and self.stopped is None:  # a 2xx answer without a choice: nothing touched
                self.stop("no_choice")
            if self.session is not None and self.started:
                await anyio.to_thread.run_sync(self.proxy.sessions.settle, self.session)
            if self.mismatch is not None:
                self.proxy.counts.mismatch({**self.mismatch, "session": self.session})
            self._span()
            self.done.set()
            if self.session is not None and self.proxy.open_turns.get(self.session) is self.done:
                del self.proxy.open_turns[self.session]

    def _span(self) -> None:
        attrs: dict[str, Any] = {
            "shadow.request.id": self.request_id, "shadow.proxy.engine": self.proxy.engine_name,
            "shadow.proxy.followed": self.started and self.stopped is None,
            "shadow.proxy.stopped": self.stopped or "", "shadow.proxy.session_rule": self.how,
            "shadow.proxy.retry": self.retry, "shadow.proxy.engine_ids": self.used_engine_ids,
            "gen_ai.usage.input_tokens": self.prompt_len}
        if self.session is not None:
            attrs["gen_ai.conversation.id"] = self.session
        if self.mismatch is not None:
            attrs["shadow.proxy.render_mismatch"] = True
            attrs["shadow.proxy.rendered_tokens"] = self.mismatch["rendered"]
            attrs["shadow.proxy.engine_prompt_tokens"] = self.mismatch["engine"]
        with self.proxy.telemetry.span("shadow.proxy.turn", attrs):
            pass
