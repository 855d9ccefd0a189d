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

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shadow.core.errors import BadInput, ShadowError, UnknownSession
from shadow.core.host import Host, HostActivity
from shadow.core.profiles import Profiles, ShadowBlock
from shadow.core.protocols import Ration
from shadow.core.records import Answer, ChunkRead, FeedResult
from shadow.core.scheduling import IdleLoop, NullTelemetry, Scheduler, Telemetry, WindowStats, ask_span
from shadow.core.session import Position
from shadow.core.settings import ShadowSettings
from shadow.core.shadow import Shadow
from shadow.core.slot import Slot

from .narrator import Narrator
from .records import AnswerRecord, Narrated, Narration, Status
from .rounds import OpenRounds
from .router import RouterShadow
from .status import assemble
from .turns import HostTurns

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


class ShadowService(HostTurns):
    """The host's verbs (``turns.py``), the feeds, the profiles, the questions and the status.

    Every call about a session reaches the facade through ``_settled``: the ids its running
    request's quiet rounds kept are fed first, so nothing reads a session short of them."""

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
        ration.on_read = self.stats["ration"].add  # slices read on the ration's own thread (RATION_THREAD)
        ration.on_error = self._error
        self.answers: deque[AnswerRecord] = deque(maxlen=keep_answers)
        self.errors: deque[str] = deque(maxlen=8)
        self._mu = threading.RLock()
        self.live: Shadow | None = None  # the facade once loaded and the kept feeds replayed (under _mu)
        self._queued: dict[str, _Queued] = {}
        self._profile_of: dict[str, str] = {}
        self.rounds = OpenRounds(self._feed_output)
        self.idle_loop = IdleLoop(self.idle_step, settings.idle_poll_s, on_error=self._error)
        slot.on_loaded(self._replay)

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
            self.live = shadow
        shadow.residency.on_forget.append(self._forgotten)

    def _forgotten(self, session: str) -> None:
        """The facade forgot ``session`` (a DELETE, its cap or MAX_SESSIONS): its profile and its
        narrator's count of thoughts go too.
        Called under the facade's lock, so not under ``_mu`` (taken before the facade's elsewhere):
        one dict pop is atomic on its own; the narrator's lock is never held while the facade's is taken."""
        self._profile_of.pop(session, None)
        if self.narrator is not None:
            self.narrator.forget(session)

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

    def prompt_ids(self, ids: Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None,
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
        held, committed = self.counts(shadow, session)
        return FeedResult(session, True, ids=held, committed=committed, backlog=held - committed, **kw)

    @staticmethod
    def _position(shadow: Shadow, session: str) -> Position | None:
        try:  # no byte counts, no status line: the host calls these paths on every decode round
            return shadow.position(session)
        except UnknownSession:
            return None

    @staticmethod
    def counts(shadow: Shadow, session: str) -> tuple[int, int]:
        try:
            return shadow.counts(session)
        except UnknownSession:
            return 0, 0

    def within_length(self, session: str, held: int, more: int) -> None:
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
        self._settled(session)  # the facade itself is read below, under the lock the replay takes
        name, block = self.block(session, profile)
        prompt = self.prompt_ids(ids, messages, tools, enable_thinking)
        if not prompt:
            raise BadInput("empty prompt")
        self.within_length(session, 0, len(prompt))
        if self.slot.state in ("off", "failed"):
            return FeedResult(session, False, reason=self.slot.state)
        with self._mu:
            self._profile_of[session] = name
            if not block.follows:
                return FeedResult(session, False, reason="profile")
            shadow = self.live
            if shadow is None:
                behind = sum(map(len, (self._queued[session].prompt, self._queued[session].outputs))) \
                    if session in self._queued else None
                self._queued[session] = _Queued(prompt)
                return self._result(None, session, behind_at_start=behind)
        before = self._position(shadow, session)
        shadow.feed_prompt(session, prompt)
        self.telemetry.observe("behind_at_turn_start_ids", before.pending if before else 0)
        out = self._result(shadow, session, behind_at_start=before.pending if before else None)
        after = self._position(shadow, session) or Position()
        out.rollback = after.rollbacks > (before.rollbacks if before else 0)
        return out

    def feed_output(self, session: str, ids: Sequence[int]) -> FeedResult:
        """Qwen's output ids, appended (after those its running request's quiet rounds kept)."""
        self._settled(session)
        return self._feed_output(session, ids)

    def _feed_output(self, session: str, ids: Sequence[int]) -> FeedResult:
        if self.slot.state in ("off", "failed"):
            return FeedResult(session, False, reason=self.slot.state)
        with self._mu:
            profile = self._profile_of.get(session)
            if profile is not None and not self.profiles.get(profile).follows:
                return FeedResult(session, False, reason="profile")
            shadow = self.live
            if shadow is None:
                q = self._queued.get(session)
                if q is None:
                    raise UnknownSession(f"unknown session {session!r}")
                if any(not isinstance(i, int) or i < 0 for i in ids):
                    raise BadInput("output ids must be whole numbers >= 0")
                self.within_length(session, len(q.prompt) + len(q.outputs), len(ids))
                q.outputs.extend(ids)
                return self._result(None, session)
        held, committed = self.counts(shadow, session)  # counted once: the host calls this every round
        self.within_length(session, held, len(ids))
        shadow.feed_output(session, ids)
        held += len(ids)
        return FeedResult(session, True, ids=held, committed=committed, backlog=held - committed)

    # ---- the profile's word on a session ----------------------------------------------------------

    def follows(self, session: str) -> bool:
        with self._mu:
            profile = self._profile_of.get(session)
        if profile is None or self.slot.state in ("off", "failed"):
            return False
        return self.profiles.get(profile).follows

    def narrates(self, session: str) -> bool:
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

    def forget(self, session: str) -> None:
        """Drop a session: its state, its parked file, its queued feeds, its profile."""
        self._settled(session)
        with self._mu:
            queued = self._queued.pop(session, None) is not None
            self._profile_of.pop(session, None)
            shadow = self.live
        if shadow is not None and session in shadow.sessions():
            shadow.forget(session)
        elif not queued:
            raise UnknownSession(f"unknown session {session!r}")

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
        _, block = self.block(session, None)
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

    def bookkeeping(self) -> tuple[dict[str, str], dict[str, int]]:
        """(each session's profile, each queued session's ids): the service's own part of status."""
        with self._mu:
            return dict(self._profile_of), {n: len(q.prompt) + len(q.outputs) for n, q in self._queued.items()}

    def status(self) -> Status:
        self._settled(None)  # the counts include what quiet rounds kept
        return assemble(self)


if TYPE_CHECKING:
    def _is_a_host(service: ShadowService) -> Host:  # mypy checks the service against the Protocol
        return service
