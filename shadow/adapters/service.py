"""The shadow as a service: the object an in-process host calls, and what the HTTP API wraps.

``ShadowService`` ties the facade (through its ``ModelSlot``: loaded lazily in an idle window) to the
host's activity, the two schedulers, the router's shadow mode and the spans. Each session's profile,
the checks on a feed and the feeds kept while the model loads are its ``Turns``' (``turns.py``), the
ids that quiet rounds keep its ``OpenRounds``' (``rounds.py``); its status is assembled from the
parts' records (``status.py``).

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

import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from shadow.core.errors import BadInput, ShadowError
from shadow.core.host import Host, HostActivity
from shadow.core.profiles import Profiles
from shadow.core.protocols import Ration
from shadow.core.records import Answer, ChunkRead, FeedResult, RoundResult, RouterAsk, TurnTimeline
from shadow.core.scheduling import IdleLoop, NullTelemetry, Scheduler, Telemetry, WindowStats, ask_span
from shadow.core.settings import ShadowSettings
from shadow.core.shadow import Shadow
from shadow.core.slot import ModelSlot

from .narrator import Narrator
from .records import AnswerRecord, IdleLoopStatus, Narrated, Narration, ProfilesStatus, Status, WindowsStatus
from .rounds import OpenRound, OpenRounds
from .router import RouterQuestion, RouterShadow, insertion_point
from .status import assemble, slot_status, where_status
from .turns import Renderer, Turns, counts_of, render_messages


class ShadowUnavailable(ShadowError):
    """The shadow cannot answer now: it is off, its model is not loaded yet, or loading failed."""


class ShadowService:
    """The host's verbs, the feeds, the questions and the status, over the parts that own their state.

    Every call about a session reaches the facade through ``_settled``: the ids its running
    request's quiet rounds kept are fed first, so nothing reads a session short of them. Every
    write to a turn goes through ``HostActivity`` (``record_*``), under its lock."""

    def __init__(self, settings: ShadowSettings, slot: ModelSlot, activity: HostActivity, profiles: Profiles,
                 idle: Scheduler, ration: Ration, telemetry: Telemetry | None = None,
                 router: RouterShadow | None = None, render: Renderer = render_messages,
                 clock: Callable[[], float] = time.monotonic, keep_answers: int = 32,
                 narrator: Narrator | None = None) -> None:
        self.settings = settings
        self.slot = slot
        self.activity = activity
        self.idle = idle
        self.ration = ration
        self.telemetry = telemetry or NullTelemetry()
        self.router = router
        self.narrator = narrator
        self.clock = clock
        self.stats = {"idle": WindowStats(), "ration": WindowStats()}
        ration.on_read = self.stats["ration"].add  # slices read on the ration's own thread (RATION_THREAD)
        ration.on_error = self._error
        self.answers: deque[AnswerRecord] = deque(maxlen=keep_answers)
        self.errors: deque[str] = deque(maxlen=8)
        self.turns = Turns(slot, profiles, settings.profile, settings.max_session_ids, self.telemetry, render,
                           on_error=self._error)
        self.rounds = OpenRounds(self.turns.feed_output)
        self.idle_loop = IdleLoop(self.idle_step, settings.idle_poll_s, on_error=self._error)
        slot.on_loaded(self._replay)

    @property
    def live(self) -> Shadow | None:
        """The facade once loaded and the kept feeds replayed (``Turns.live``)."""
        return self.turns.live

    @property
    def profiles(self) -> Profiles:
        return self.turns.profiles

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the idle loop (it loads the model in its first window when a profile wants it)."""
        self.idle_loop.start()

    def stop(self) -> None:
        """Stop the idle loop and the ration's thread, then a planned stop of the facade (it parks
        resident sessions)."""
        self.idle_loop.stop()
        self.ration.close()
        shadow = self._settled(None)  # what quiet rounds kept is fed, so it is parked with the rest
        if shadow is not None:
            shadow.close()

    def _error(self, err: BaseException) -> None:
        self.errors.append(f"{type(err).__name__}: {err}")

    def _settled(self, session: str | None) -> Shadow | None:
        """The one way a session call reaches the facade: first the ids that ``session``'s quiet
        rounds kept (every session's: ``None``, off a request's thread, so an error goes to status)
        are fed, then the live facade (None before the model is loaded)."""
        if session is not None:
            self.rounds.settle(session)
        else:
            try:
                self.rounds.settle()
            except ShadowError as err:
                self._error(err)
        return self.live

    def idle_step(self) -> list[ChunkRead]:
        chunks = self.idle.step()
        self.stats["idle"].add(chunks)
        return chunks

    def _replay(self, shadow: Shadow) -> None:
        """On load (in the idle window): warm the reader with one fresh chunk, so the first chunk a
        ration reads is not a cold one, then replay the feeds kept meanwhile (``Turns.replay``)."""
        shadow.warm_up()
        self.turns.replay(shadow)
        if self.narrator is not None:  # a session the facade forgets: its count of thoughts goes too
            shadow.residency.on_forget.append(self.narrator.forget)

    def _unavailable(self) -> ShadowUnavailable:
        if self.slot.state == "off":
            return ShadowUnavailable("the shadow is off (QWEN38_SHADOW_MODEL is empty)")
        if self.slot.state == "failed":
            return ShadowUnavailable(f"the shadow's model failed to load: {self.slot.error}")
        return ShadowUnavailable("the shadow's model is loading; ask again in a moment")

    # ---- feeding ---------------------------------------------------------------------------------

    def feed_prompt(self, session: str, ids: Sequence[int] | None = None,
                    messages: Sequence[Mapping[str, Any]] | None = None,
                    tools: Sequence[Mapping[str, Any]] | None = None, enable_thinking: bool | None = None,
                    profile: str | None = None) -> FeedResult:
        """A turn's whole prompt, as ids or as OpenAI-style messages (rendered with the template)."""
        self._settled(session)  # the facade itself is read below, under the lock the replay takes
        return self.turns.feed_prompt(self.turns.check(session, ids, messages, tools, enable_thinking, profile))

    def feed_output(self, session: str, ids: Sequence[int]) -> FeedResult:
        """Qwen's output ids, appended (after those its running request's quiet rounds kept)."""
        self._settled(session)
        return self.turns.feed_output(session, ids)

    # ---- a turn ----------------------------------------------------------------------------------

    def arrived(self, request_id: str) -> TurnTimeline:
        return self.activity.record_arrived(request_id, limit=self.settings.max_arrived)

    def started(self, request_id: str, session: str, ids: Sequence[int] | None = None,
                messages: Sequence[Mapping[str, Any]] | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None, enable_thinking: bool | None = None,
                profile: str | None = None, router: RouterAsk | None = None,
                barrier: bool = True) -> tuple[TurnTimeline, FeedResult]:
        """The request runs. Its prompt is checked once, first (a bad one changes nothing), then it
        waits for the idle window's chunk in flight (``barrier``), then the checked prompt is fed."""
        prompt = self.turns.check(session, ids, messages, tools, enable_thinking, profile)
        turn = self.activity.record_started(request_id, session, len(prompt.ids), prompt.profile)
        if barrier:
            self.activity.out_of_the_way()
        try:
            self._settled(session)
            fed = self.turns.feed_prompt(prompt)
        except ShadowError:
            self.activity.record_finished(request_id)
            raise
        block, n = prompt.block, len(prompt.ids)
        if (router is not None and fed.followed and self.router is not None and block.router == "shadow"
                and n >= block.router_min_tokens):
            at = insertion_point(prompt.ids)
            self.router.enqueue(RouterQuestion(
                session, request_id, router.question, list(router.choices), router.label, at,
                fed.behind_at_start or 0, self.clock(), n, fresh=router.fresh, ids=array("I", prompt.ids[:at])))
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
            self.activity.record_host_time(request_id, time.perf_counter() - entered)
            return RoundResult(request_id, 0, 0.0, turn.budget_s * 1e3, turn.spent_s * 1e3,
                               open_.backlog + len(open_.pending))
        turn = self.activity.turn(request_id)
        session = turn.session
        if session is None or turn.started_s is None:
            raise BadInput(f"request {request_id!r} has not started")
        follows = self.turns.follows(session)
        every, fed = self.rounds.take(request_id, session, ids, follows)
        turn = self.activity.record_round_ended(request_id, len(ids))
        # the narrator first: a thought that just ended is summarised at its end, before the ration
        # reads past it
        narrated = self._narrate(turn, fed, every, final=False)
        if follows:
            chunks = self.ration.step(turn)  # it records its slice's budget and spending on the turn
        else:  # a session not followed gets no ration
            chunks = []
            self.activity.record_ration(request_id, 0.0, 0, 0.0)
        if chunks:
            self.stats["ration"].add(chunks)
        shadow = self.live
        live = fed is not None and fed.followed and not fed.queued
        if live and not chunks and not narrated:
            assert fed is not None
            held, committed = fed.ids, fed.committed  # nothing read since the feed counted them
        else:
            held, committed = counts_of(shadow, session) if shadow is not None else (0, 0)
        if live and shadow is not None:
            self.rounds.keep(turn, session, held, held - committed)
        self.activity.record_host_time(request_id, time.perf_counter() - entered)
        return RoundResult(request_id, len(chunks), sum(c.cost_s for c in chunks) * 1e3, turn.budget_s * 1e3,
                           turn.spent_s * 1e3, held - committed)

    def _quiet(self, open_: OpenRound, ids: Sequence[int]) -> bool:
        """A look at this round would read nothing: neither the ration (its own test, with the
        backlog counted since the last look) nor the narrator wants it, and the ids would feed."""
        shadow = self.live
        if shadow is None or not open_.within(len(ids), self.settings.max_session_ids) or not shadow.accepts(ids):
            return False
        if self.ration.may_read(open_.turn, open_.backlog + len(open_.pending) + len(ids), shadow.grid):
            return False
        return self.narrator is None or not self.narrator.wants(open_.turn.request_id, ids)

    def finished(self, request_id: str, ids: Sequence[int] = ()) -> TurnTimeline:
        """The request ended. Its account goes out as a ``shadow.turn`` span: the time its host
        spent inside the shadow's calls during the decode, so that a trace alone tells what the
        shadow cost a host that waits on its calls (an overlapped host pays only the chunks)."""
        entered = time.perf_counter()
        turn = self.activity.turn(request_id)
        new = len(ids)
        if turn.session is not None:  # the quiet rounds' ids first
            every, fed = self.rounds.take(request_id, turn.session, ids, self.turns.follows(turn.session))
            # before the turn ends: the idle window stays shut meanwhile
            self._narrate(turn, fed, every, final=True)
        done = self.activity.record_finished(request_id, new, host_s=time.perf_counter() - entered)
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
        if fed is not None and fed.followed and not fed.queued and self.turns.narrates(turn.session):
            self.narrator.output(turn, turn.session, fed.ids - len(ids), list(ids))
        waited = self.narrator.waiting(turn.request_id) > 0
        self.narrator.step(turn, final)
        return waited

    # ---- holds -----------------------------------------------------------------------------------

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

    def release_hold(self, hold_id: str) -> None:
        self.activity.record_hold_released(hold_id)

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

    def forget(self, session: str) -> None:
        """Drop a session: its state, its parked file, its queued feeds, its profile."""
        self._settled(session)
        self.turns.forget(session)

    # ---- questions -------------------------------------------------------------------------------

    def _facade(self, session: str) -> Shadow:
        shadow = self._settled(session)
        if shadow is None:
            raise self._unavailable()
        return shadow

    def ask(self, session: str, question: str | Sequence[int], choices: Sequence[str]) -> Answer:
        shadow = self._facade(session)
        with ask_span(self.telemetry, "ask", session, choices) as span:
            answer = shadow.ask(session, question, choices)
            span.answered(answer)
        self.answers.append(AnswerRecord.of(answer, question, choices))
        return answer

    def narrate(self, session: str, prompt: str, max_new: int = 64) -> Narrated:
        """The narrator's summary on top of the whole session (a profile with ``narrator: on``):
        a greedy fork decode; the session is untouched."""
        _, block = self.turns.block(session, None)
        if block.narrator != "on":
            raise BadInput(f"the narrator is off for session {session!r}'s profile")
        shadow = self._facade(session)
        from .tokens import get_tokens

        t0 = time.perf_counter()
        with self.telemetry.span("shadow.narrate", {"gen_ai.operation.name": "chat",
                                                    "gen_ai.conversation.id": session,
                                                    "gen_ai.request.max_tokens": max_new}) as span:
            ids = shadow.decode(session, prompt, max_new)
            span.set("gen_ai.usage.output_tokens", len(ids))
        return Narrated(session, get_tokens().decode(ids), ids, (time.perf_counter() - t0) * 1e3)

    # ---- status ----------------------------------------------------------------------------------

    def status(self) -> Status:
        """Each part's record, assembled (``status.assemble``); the open rounds settled first, so the
        counts include what quiet rounds kept."""
        shadow = self._settled(None)
        facade = shadow.status() if shadow is not None else None
        profile_of, queued = self.turns.bookkeeping()
        return assemble(
            facade, queued, profile_of,
            slot=slot_status(self.slot, self.settings, shadow), where=where_status(self.settings),
            profiles=ProfilesStatus(self.profiles.source, dict(self.profiles.blocks)), host=self.activity.status(),
            windows=WindowsStatus(idle=self.stats["idle"].status(), ration=self.stats["ration"].status()),
            idle_loop=IdleLoopStatus(running=self.idle_loop.running, ticks=self.idle_loop.ticks),
            router=self.router.status() if self.router is not None else None,
            narrator=self.narrator.status() if self.narrator is not None else None,
            answers=list(self.answers), errors=list(self.errors))


if TYPE_CHECKING:
    def _is_a_host(service: ShadowService) -> Host:  # mypy checks the service against the Protocol
        return service
