"""The shadow as a service: the object an in-process host calls, and what the HTTP API wraps.

``ShadowService`` ties the facade (through its ``Slot``: loaded lazily in an idle window) to the
host's activity, the profiles, the two schedulers, the router's shadow mode and the spans.

It is the host interface in process (``shadow.core.host.Host``; the HTTP host endpoints call the
same methods, and ``shadow.api.client.ShadowClient`` is the same interface over HTTP):

=====================================================  ==========================================
``arrived(request_id)``                                a request is queued: the idle window stops
                                                       before its next chunk
``started(request_id, session, ids=... | messages=...,  the request runs: waits for the chunk in
profile=..., router=..., barrier=True)``               flight (``barrier``), then feeds the prompt
``first_token(request_id)``                            the ration counts from here
``round_ended(request_id, ids)``                       between two decode rounds, on the request's
                                                       thread: feeds the new output ids, then the
                                                       narrator's slice, then reads within the ration
                                                       (a round where neither would read keeps its
                                                       ids for the next look: ``rounds.py``)
``finished(request_id, ids=())``                       the turn is over (last output ids, if any)
``hold()`` / ``add_hold(ttl_s)`` / ``release_hold(id)``  keep the idle window shut
``on_narration(callback)``                             the narrator's summaries (``narrator.py``)
``activity.engine_lock``, ``activity.box_lock``        the two locks (see ``shadow.core.host``);
                                                       a host passes its own to the container
=====================================================  ==========================================

``barrier=True`` takes the engine lock at rank 0 and gives it back: use it unless the engine holds
the shared engine lock itself around its prefill (then pass ``barrier=False``: taking it twice would
deadlock, it is not reentrant).

Sessions of a profile whose ``shadow.mode`` is off are not followed (``FeedResult.followed`` is
False). Feeds that come before the model is loaded are kept (the latest prompt and the output after
it) and replayed when it is; a question then answers 503 until the model is there.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shadow.core.errors import BadInput, ShadowError, UnknownSession
from shadow.core.host import FeedResult, Host, HostActivity, RoundResult, TurnTimeline
from shadow.core.profiles import Profiles, ShadowBlock
from shadow.core.protocols import Ration
from shadow.core.scheduling import IdleLoop, NullTelemetry, Scheduler, Telemetry, WindowStats, ask_span
from shadow.core.session import Position
from shadow.core.settings import ShadowSettings
from shadow.core.shadow import Answer, ChunkRead, Shadow
from shadow.core.slot import Slot

from .narrator import Narration, Narrator
from .rounds import OpenRound, OpenRounds
from .router import RouterQuestion, RouterShadow, insertion_point

Renderer = Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None, bool | None], list[int]]


class ShadowUnavailable(ShadowError):
    """The shadow cannot answer now: it is off, its model is not loaded yet, or loading failed."""


def render_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                    enable_thinking: bool | None) -> list[int]:
    """OpenAI-style messages -> the ids the host's engine prefills (the Qwen3.5 chat template)."""
    from .chat import render_ids

    try:
        return render_ids(messages, tools, add_generation_prompt=True, enable_thinking=enable_thinking)
    except Exception as err:  # the template's and the converters' errors: the input is at fault
        raise BadInput(f"messages could not be rendered with the chat template: {type(err).__name__}: {err}") \
            from None


@dataclass
class _Queued:
    prompt: list[int]
    outputs: list[int] = field(default_factory=list)


class ShadowService:
    def __init__(self, settings: ShadowSettings, slot: Slot, activity: HostActivity, profiles: Profiles,
                 idle: Scheduler, ration: Ration, telemetry: Telemetry | None = None,
                 router: RouterShadow | None = None, render: Renderer = render_messages,
                 clock: Callable[[], float] = time.monotonic, keep_answers: int = 32,
                 narrator: Narrator | None = None) -> None:
        self.settings = settings
        self.slot = slot
        self.activity = activity
        self.profiles = profiles
        self.idle = idle
        self.ration = ration
        self.telemetry = telemetry or NullTelemetry()
        self.router = router
        self.narrator = narrator
        self.render = render
        self.clock = clock
        self.stats = {"idle": WindowStats(), "ration": WindowStats()}
        self.answers: deque[dict[str, Any]] = deque(maxlen=keep_answers)
        self.errors: deque[str] = deque(maxlen=8)
        self._mu = threading.RLock()
        self._live: Shadow | None = None
        self._queued: dict[str, _Queued] = {}
        self._profile_of: dict[str, str] = {}
        self.rounds = OpenRounds(self._feed_output)
        self._loop = IdleLoop(self.idle_step, settings.idle_poll_s, on_error=self._error)
        slot.on_loaded(self._replay)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the idle loop (it loads the model in its first window when a profile wants it)."""
        self._loop.start()

    def stop(self) -> None:
        """Stop the idle loop, then a planned stop of the facade (it parks resident sessions)."""
        self._loop.stop()
        self._settle_all()  # what quiet rounds kept is fed, so it is parked with the rest
        shadow = self._live
        if shadow is not None:
            shadow.close()

    def _error(self, err: BaseException) -> None:
        self.errors.append(f"{type(err).__name__}: {err}")

    def _settle_all(self) -> None:
        """Feed every id that quiet rounds kept (off a request's thread: an error goes to status)."""
        try:
            self.rounds.settle()
        except ShadowError as err:
            self._error(err)

    def idle_step(self) -> list[ChunkRead]:
        chunks = self.idle.step()
        self.stats["idle"].add(chunks)
        return chunks

    def _replay(self, shadow: Shadow) -> None:
        """On load (in the idle window): warm the reader with one fresh chunk, so the first chunk a
        ration reads is not a cold one, then replay the feeds kept meanwhile."""
        shadow.warm_up()
        with self._mu:
            for name, q in self._queued.items():
                try:
                    shadow.feed_prompt(name, q.prompt)
                    if q.outputs:
                        shadow.feed_output(name, q.outputs)
                except ShadowError as err:
                    self._error(err)
            self._queued.clear()
            self._live = shadow
        shadow.residency.on_forget.append(self._forgotten)

    def _forgotten(self, session: str) -> None:
        """The facade forgot ``session`` (a DELETE, its cap or MAX_SESSIONS): its profile goes too.
        Called under the facade's lock, so not under ``_mu`` (taken before the facade's elsewhere):
        one dict pop is atomic on its own."""
        self._profile_of.pop(session, None)

    # ---- profiles --------------------------------------------------------------------------------

    def block(self, session: str, profile: str | None) -> tuple[str, ShadowBlock]:
        with self._mu:
            name = profile or self._profile_of.get(session) or self.settings.profile
        try:
            return name, self.profiles.get(name)
        except ShadowError as err:
            raise BadInput(str(err)) from None

    def _unavailable(self) -> ShadowUnavailable:
        if self.slot.state == "off":
            return ShadowUnavailable("the shadow is off (QWEN38_SHADOW_MODEL is empty)")
        if self.slot.state == "failed":
            return ShadowUnavailable(f"the shadow's model failed to load: {self.slot.error}")
        return ShadowUnavailable("the shadow's model is loading; ask again in a moment")

    # ---- feeding ---------------------------------------------------------------------------------

    def _prompt_ids(self, ids: Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None,
                    tools: Sequence[Mapping[str, Any]] | None, enable_thinking: bool | None) -> list[int]:
        if (ids is None) == (messages is None):
            raise BadInput("give the prompt as ids or as messages, one of the two")
        if messages is not None:
            if not messages:
                raise BadInput("messages is empty")
            return self.render(messages, tools, enable_thinking)
        assert ids is not None
        return list(ids)

    def _result(self, shadow: Shadow | None, session: str, **kw: Any) -> FeedResult:
        if shadow is None:
            with self._mu:
                q = self._queued.get(session)
            n = len(q.prompt) + len(q.outputs) if q else 0
            return FeedResult(session, True, queued=True, ids=n, backlog=n, **kw)
        held, committed = self._counts(shadow, session)
        return FeedResult(session, True, ids=held, committed=committed, backlog=held - committed, **kw)

    @staticmethod
    def _position(shadow: Shadow, session: str) -> Position | None:
        try:  # no byte counts, no status line: the host calls these paths on every decode round
            return shadow.position(session)
        except UnknownSession:
            return None

    @staticmethod
    def _counts(shadow: Shadow, session: str) -> tuple[int, int]:
        try:
            return shadow.counts(session)
        except UnknownSession:
            return 0, 0

    def _within_length(self, session: str, held: int, more: int) -> None:
        """A session's ids are bounded (``MAX_SESSION_IDS``): a feed past it is refused whole and the
        session stays as it was (its ids and its state grow with every feed, and nothing else ends it)."""
        limit = self.settings.max_session_ids
        if held + more > limit:
            raise BadInput(f"session {session!r} would hold {held + more} ids ({held} + {more}), more than "
                           f"QWEN38_SHADOW_MAX_SESSION_IDS={limit}: forget it (DELETE) or start a new one")

    def feed_prompt(self, session: str, ids: Sequence[int] | None = None,
                    messages: Sequence[Mapping[str, Any]] | None = None,
                    tools: Sequence[Mapping[str, Any]] | None = None, enable_thinking: bool | None = None,
                    profile: str | None = None) -> FeedResult:
        """A turn's whole prompt, as ids or as OpenAI-style messages (rendered with the template)."""
        self.rounds.settle(session)
        name, block = self.block(session, profile)
        prompt = self._prompt_ids(ids, messages, tools, enable_thinking)
        if not prompt:
            raise BadInput("empty prompt")
        self._within_length(session, 0, len(prompt))
        if self.slot.state in ("off", "failed"):
            return FeedResult(session, False, reason=self.slot.state)
        with self._mu:
            self._profile_of[session] = name
            if not block.follows:
                return FeedResult(session, False, reason="profile")
            shadow = self._live
            if shadow is None:
                behind = sum(map(len, (self._queued[session].prompt, self._queued[session].outputs))) \
                    if session in self._queued else None
                self._queued[session] = _Queued(prompt)
                return self._result(None, session, behind_at_start=behind)
        before = self._position(shadow, session)
        shadow.feed_prompt(session, prompt)
        out = self._result(shadow, session, behind_at_start=before.pending if before else None)
        after = self._position(shadow, session) or Position()
        out.rollback = after.rollbacks > (before.rollbacks if before else 0)
        return out

    def feed_output(self, session: str, ids: Sequence[int]) -> FeedResult:
        """Qwen's output ids, appended (after those its running request's quiet rounds kept)."""
        self.rounds.settle(session)
        return self._feed_output(session, ids)

    def _feed_output(self, session: str, ids: Sequence[int]) -> FeedResult:
        if self.slot.state in ("off", "failed"):
            return FeedResult(session, False, reason=self.slot.state)
        with self._mu:
            profile = self._profile_of.get(session)
            if profile is not None and not self.profiles.get(profile).follows:
                return FeedResult(session, False, reason="profile")
            shadow = self._live
            if shadow is None:
                q = self._queued.get(session)
                if q is None:
                    raise UnknownSession(f"unknown session {session!r}")
                if any(not isinstance(i, int) or i < 0 for i in ids):
                    raise BadInput("output ids must be whole numbers >= 0")
                self._within_length(session, len(q.prompt) + len(q.outputs), len(ids))
                q.outputs.extend(ids)
                return self._result(None, session)
        held, committed = self._counts(shadow, session)  # counted once: the host calls this every round
        self._within_length(session, held, len(ids))
        shadow.feed_output(session, ids)
        held += len(ids)
        return FeedResult(session, True, ids=held, committed=committed, backlog=held - committed)

    # ---- the host interface ----------------------------------------------------------------------

    def arrived(self, request_id: str) -> TurnTimeline:
        return self.activity.record_arrived(request_id, limit=self.settings.max_arrived)

    def started(self, request_id: str, session: str, ids: Sequence[int] | None = None,
                messages: Sequence[Mapping[str, Any]] | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None, enable_thinking: bool | None = None,
                profile: str | None = None, router: Mapping[str, Any] | None = None,
                barrier: bool = True) -> tuple[TurnTimeline, FeedResult]:
        """The request runs. Its prompt is checked first (a bad one changes nothing), then it waits
        for the idle window's chunk in flight (``barrier``), then the prompt is fed."""
        name, block = self.block(session, profile)
        prompt = self._prompt_ids(ids, messages, tools, enable_thinking)
        if not prompt:
            raise BadInput("empty prompt")
        self._within_length(session, 0, len(prompt))
        turn = self.activity.record_started(request_id, session, len(prompt), name)
        if barrier:
            self.activity.out_of_the_way()
        try:
            fed = self.feed_prompt(session, prompt, profile=name)
        except ShadowError:
            self.activity.record_finished(request_id)
            raise
        if (router is not None and fed.followed and self.router is not None and block.router == "shadow"
                and len(prompt) >= block.router_min_tokens):
            at = insertion_point(prompt)
            self.router.enqueue(RouterQuestion(
                session, request_id, router["question"], list(router["choices"]), router.get("label"),
                at, fed.behind_at_start or 0, self.clock(), len(prompt), fresh=router.get("fresh"),
                ids=array("I", prompt[:at])))
        return turn, fed

    def first_token(self, request_id: str) -> TurnTimeline:
        return self.activity.record_first_token(request_id)

    def round_ended(self, request_id: str, ids: Sequence[int] = ()) -> RoundResult:
        """Between two decode rounds: feed the round's output ids, then the narrator's slice, then
        read within the ration. A round where a look would read nothing stays quiet: its ids are
        checked and kept for the next look (``rounds.py``: what a waiting host pays per round)."""
        entered = time.perf_counter()
        open_ = self.rounds.get(request_id)
        if open_ is not None and self._quiet(open_, ids) and self.rounds.add(open_, ids):
            turn = self.activity.record_round_ended(request_id, len(ids))
            turn.host_s += time.perf_counter() - entered
            return RoundResult(request_id, 0, 0.0, turn.budget_s * 1e3, turn.spent_s * 1e3,
                               open_.backlog + len(open_.pending))
        turn = self.activity.turn(request_id)
        session = turn.session
        if session is None or turn.started_s is None:
            raise BadInput(f"request {request_id!r} has not started")
        follows = self._follows(session)
        new = len(ids)
        every, fed = self.rounds.take(request_id, session, ids, follows)
        turn = self.activity.record_round_ended(request_id, new)
        # the narrator first: a thought that just ended is summarised at its end, before the ration
        # reads past it
        narrated = self._narrate(turn, fed, every, final=False)
        turn.budget_s = 0.0  # a session not followed gets no ration; a followed one, the scheduler's
        chunks = self.ration.step(turn) if follows else []
        if chunks:
            self.stats["ration"].add(chunks)
        shadow = self._live
        live = fed is not None and fed.followed and not fed.queued
        if live and not chunks and not narrated:
            assert fed is not None
            held, committed = fed.ids, fed.committed  # nothing read since the feed counted them
        else:
            held, committed = self._counts(shadow, session) if shadow is not None else (0, 0)
        if live and shadow is not None:
            self.rounds.keep(turn, session, held, held - committed)
        turn.host_s += time.perf_counter() - entered
        return RoundResult(request_id, len(chunks), sum(c.cost_s for c in chunks) * 1e3, turn.budget_s * 1e3,
                           turn.spent_s * 1e3, held - committed)

    def _quiet(self, open_: OpenRound, ids: Sequence[int]) -> bool:
        """A look at this round would read nothing: neither the ration (its own test, with the
        backlog counted since the last look) nor the narrator wants it, and the ids would feed."""
        shadow = self._live
        if shadow is None or not open_.within(len(ids), self.settings.max_session_ids) or not shadow.accepts(ids):
            return False
        if self.ration.may_read(open_.turn, open_.backlog + len(open_.pending) + len(ids), shadow.grid):
            return False
        return self.narrator is None or not self.narrator.wants(open_.turn.request_id, ids)

    def _follows(self, session: str) -> bool:
        with self._mu:
            profile = self._profile_of.get(session)
        if profile is None or self.slot.state in ("off", "failed"):
            return False
        return self.profiles.get(profile).follows

    def finished(self, request_id: str, ids: Sequence[int] = ()) -> TurnTimeline:
        """The request ended. Its account goes out as a ``shadow.turn`` span: the time its host
        spent inside the shadow's calls during the decode, so that a trace alone tells what the
        shadow cost a host that waits on its calls (an overlapped host pays only the chunks)."""
        entered = time.perf_counter()
        turn = self.activity.turn(request_id)
        fed, new = None, len(ids)
        if turn.session is not None:  # the quiet rounds' ids first
            ids, fed = self.rounds.take(request_id, turn.session, ids, self._follows(turn.session))
            # before the turn ends: the idle window stays shut meanwhile
            self._narrate(turn, fed, ids, final=True)
        done = self.activity.record_finished(request_id, new)
        done.host_s += time.perf_counter() - entered
        if done.session is not None and done.first_token_s is not None:
            with self.telemetry.span("shadow.turn", {
                    "gen_ai.conversation.id": done.session, "shadow.request.id": request_id,
                    "shadow.turn.host_ms": done.host_s * 1e3, "shadow.turn.rounds": done.rounds,
                    "shadow.turn.ration_ms": done.spent_s * 1e3, "shadow.turn.chunks": done.chunks}):
                pass
        return done

    def _narrate(self, turn: TurnTimeline, fed: FeedResult | None, ids: Sequence[int], final: bool) -> bool:
        """The narrator's slice: thoughts that ended in ``ids`` (fed at the session's end), then the
        summaries that fit the turn's share (``shadow.adapters.narrator``). Returns whether it may
        have read chunks (a thought waited)."""
        if self.narrator is None or turn.session is None:
            return False
        if fed is not None and fed.followed and not fed.queued and self._narrates(turn.session):
            self.narrator.output(turn, turn.session, fed.ids - len(ids), list(ids))
        waited = self.narrator.waiting(turn.request_id) > 0
        self.narrator.step(turn, final)
        return waited

    def _narrates(self, session: str) -> bool:
        with self._mu:
            return session in self._profile_of and self.profiles.get(self._profile_of[session]).narrator == "on"

    def on_narration(self, callback: Callable[[Narration], None],
                     closed: Callable[[], None] | None = None) -> Callable[[], None]:
        """``callback`` gets each summary the narrator writes (a ``Narration``), on the thread of the
        round that wrote it, and ``closed`` is called when the server stops; returns the call that
        unsubscribes it."""
        if self.narrator is None:
            raise ShadowUnavailable("this service has no narrator")
        return self.narrator.subscribe(callback, closed)

    def closing(self) -> None:
        """The server begins to stop: end the narration streams (their clients would hold it up)."""
        if self.narrator is not None:
            self.narrator.close()

    @contextmanager
    def hold(self) -> Iterator[str]:
        with self.activity.holding() as hold_id:
            yield hold_id

    def add_hold(self, ttl_s: float | None = None) -> str:
        """A hold for a client: at most ``MAX_HOLDS`` live, none longer than ``MAX_HOLD_S`` (a
        forgotten hold would keep the idle window shut)."""
        if ttl_s is not None and ttl_s > self.settings.max_hold_s:
            raise BadInput(f"ttl_s={ttl_s:g} is longer than QWEN38_SHADOW_MAX_HOLD_S={self.settings.max_hold_s:g}")
        return self.activity.record_hold(ttl_s, limit=self.settings.max_holds)

    def forget(self, session: str) -> None:
        """Drop a session: its state, its parked file, its queued feeds, its profile."""
        self.rounds.settle(session)
        with self._mu:
            queued = self._queued.pop(session, None) is not None
            self._profile_of.pop(session, None)
            shadow = self._live
        if shadow is not None and session in shadow.sessions():
            shadow.forget(session)
        elif not queued:
            raise UnknownSession(f"unknown session {session!r}")

    def release_hold(self, hold_id: str) -> None:
        self.activity.record_hold_released(hold_id)

    # ---- questions -------------------------------------------------------------------------------

    def _facade(self) -> Shadow:
        shadow = self._live
        if shadow is None:
            raise self._unavailable()
        return shadow

    def ask(self, session: str, question: str | Sequence[int], choices: Sequence[str]) -> Answer:
        self.rounds.settle(session)
        shadow = self._facade()
        with ask_span(self.telemetry, "ask", session, choices) as span:
            answer = shadow.ask(session, question, choices)
            span.answered(answer)
        q = question if isinstance(question, str) else f"<{len(question)} ids>"
        self.answers.append({"session": session, "question": q[:200], "choices": list(choices),
                             "label": answer.label, "probs": answer.probs, "behind": answer.behind,
                             "latency_ms": answer.lag_ms, "at": time.time()})
        return answer

    def narrate(self, session: str, prompt: str, max_new: int = 64) -> tuple[str, list[int], float]:
        """The narrator's summary on top of the whole session (a profile with ``narrator: on``):
        a greedy fork decode; the session is untouched."""
        _, block = self.block(session, None)
        if block.narrator != "on":
            raise BadInput(f"the narrator is off for session {session!r}'s profile")
        self.rounds.settle(session)
        shadow = self._facade()
        from .tokens import get_tokens

        t0 = time.perf_counter()
        with self.telemetry.span("shadow.narrate", {"gen_ai.operation.name": "chat",
                                                    "gen_ai.conversation.id": session,
                                                    "gen_ai.request.max_tokens": max_new}) as span:
            ids = shadow.decode(session, prompt, max_new)
            span.set("gen_ai.usage.output_tokens", len(ids))
        return get_tokens().decode(ids), ids, (time.perf_counter() - t0) * 1e3

    # ---- status ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        self._settle_all()  # the counts below include what quiet rounds kept
        shadow = self._live
        facade: dict[str, Any] = shadow.status() if shadow is not None else {"sessions": {}}
        sessions: dict[str, Any] = dict(facade.pop("sessions", {}))
        with self._mu:
            for name, q in self._queued.items():
                n = len(q.prompt) + len(q.outputs)
                sessions[name] = {"where": "queued", "ids": n, "committed": 0, "backlog": n}
            for name, s in sessions.items():
                s["profile"] = self._profile_of.get(name)
        s = self.settings
        return {
            "slot": {**self.slot.as_dict(), "device": s.device, "dtype": s.dtype, "grid": s.grid},
            "where": {"pid": os.getpid(), "host": s.host, "port": s.port, "dir": str(s.home), "disk": s.disk,
                      "trace": s.trace_exporters, "trace_file": str(s.trace_path) if "jsonl" in s.trace_exporters
                      else None},
            "profiles": self.profiles.as_dict(),
            "host": self.activity.snapshot(),
            "windows": {k: v.as_dict() for k, v in self.stats.items()},
            "idle_loop": {"running": self._loop.running, "ticks": self._loop.ticks},
            "sessions": sessions,
            "backlog": sum(int(v.get("backlog", 0)) for v in sessions.values()),
            "bytes": sum(int(v.get("bytes_resident", v.get("bytes", 0))) + int(v.get("bytes_on_disk", 0))
                         for v in sessions.values()),
            "checkpoints": sum(len(v.get("checkpoints", [])) for v in sessions.values()),
            "store": facade,
            "router": self.router.status() if self.router is not None else None,
            "narrator": self.narrator.status() if self.narrator is not None else None,
            "answers": list(self.answers),
            "errors": list(self.errors),
        }


if TYPE_CHECKING:
    def _is_a_host(service: ShadowService) -> Host:  # mypy checks the service against the Protocol
        return service
