"""The service's sessions on their way to the facade: each session's profile, the checks on what a
host feeds, and the feeds kept while the model loads (replayed once it is).

``Turns`` owns that state, under its own lock; ``ShadowService`` holds one and calls it. A prompt is
checked once (``check``: its profile, its ids or its rendered messages, its length), and the checked
prompt (a ``Prompt``) is what ``feed_prompt`` takes: ``started`` checks before it records the turn,
and the feed does not check again on the way to the request's first token."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shadow.core.errors import BadInput, ShadowError, UnknownSession
from shadow.core.profiles import Profiles, ShadowBlock
from shadow.core.protocols import Telemetry
from shadow.core.records import FeedResult
from shadow.core.session import Position
from shadow.core.shadow import Shadow
from shadow.core.slot import ModelSlot

Renderer = Callable[[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None, bool | None], list[int]]


def render_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                    enable_thinking: bool | None) -> list[int]:
    """OpenAI-style messages -> the ids the host's engine prefills (the Qwen3.5 chat template)."""
    from .chat import render_ids

    try:
        return render_ids(messages, tools, add_generation_prompt=True, enable_thinking=enable_thinking)
    except Exception as err:  # the template's and the converters' errors: the input is at fault
        raise BadInput(f"messages could not be rendered with the chat template: {type(err).__name__}: {err}") \
            from None


@dataclass(frozen=True, slots=True)
class Prompt:
    """A turn's prompt once checked (``Turns.check``): not empty, within the session's bound, its
    profile known."""

    session: str
    ids: list[int]
    profile: str
    block: ShadowBlock


@dataclass
class _Queued:
    prompt: list[int]
    outputs: list[int] = field(default_factory=list)


def counts_of(shadow: Shadow, session: str) -> tuple[int, int]:
    """``(ids held, ids committed)`` of ``session``; ``(0, 0)`` for a session the facade does not know."""
    try:
        return shadow.counts(session)
    except UnknownSession:
        return 0, 0


def _position(shadow: Shadow, session: str) -> Position | None:
    try:  # no byte counts, no status line: the host calls these paths on every decode round
        return shadow.position(session)
    except UnknownSession:
        return None


class Turns:
    """Each session's profile, the checks, and the feeds kept until the model is loaded."""

    def __init__(self, slot: ModelSlot, profiles: Profiles, default_profile: str, max_session_ids: int,
                 telemetry: Telemetry, render: Renderer = render_messages,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.slot = slot
        self.profiles = profiles
        self.default_profile = default_profile
        self.max_session_ids = max_session_ids
        self.telemetry = telemetry
        self.render = render
        self.on_error = on_error  # a kept feed that fails on replay: status's errors
        self._mu = threading.RLock()
        self.live: Shadow | None = None  # the facade once loaded and the kept feeds replayed (under _mu)
        self._queued: dict[str, _Queued] = {}
        self._profile_of: dict[str, str] = {}

    # ---- the checks ------------------------------------------------------------------------------

    def block(self, session: str, profile: str | None) -> tuple[str, ShadowBlock]:
        """The profile a call names, else the session's, else the default; an unknown one is bad input."""
        with self._mu:
            name = profile or self._profile_of.get(session) or self.default_profile
        try:
            return name, self.profiles.get(name)
        except ShadowError as err:
            raise BadInput(str(err)) from None

    def check(self, session: str, ids: Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None,
              tools: Sequence[Mapping[str, Any]] | None, enable_thinking: bool | None,
              profile: str | None) -> Prompt:
        """The prompt, given as ids or as messages (rendered with the template), checked once: a bad
        one is refused before anything changes."""
        name, block = self.block(session, profile)
        if (ids is None) == (messages is None):
            raise BadInput("give the prompt as ids or as messages, one of the two")
        if messages is not None:
            if not messages:
                raise BadInput("messages is empty")
            prompt = self.render(messages, tools, enable_thinking)
        else:
            assert ids is not None
            prompt = list(ids)
        if not prompt:
            raise BadInput("empty prompt")
        self.within_length(session, 0, len(prompt))
        return Prompt(session, prompt, name, block)

    def within_length(self, session: str, held: int, more: int) -> None:
        """A session's ids are bounded (``MAX_SESSION_IDS``): a feed past it is refused whole and the
        session stays as it was (its ids and its state grow with every feed, and nothing else ends it)."""
        limit = self.max_session_ids
        if held + more > limit:
            raise BadInput(f"session {session!r} would hold {held + more} ids ({held} + {more}), more than "
                           f"QWEN38_SHADOW_MAX_SESSION_IDS={limit}: forget it (DELETE) or start a new one")

    # ---- feeding ---------------------------------------------------------------------------------

    def _result(self, shadow: Shadow | None, session: str, **kw: Any) -> FeedResult:
        if shadow is None:
            with self._mu:
                q = self._queued.get(session)
            n = len(q.prompt) + len(q.outputs) if q else 0
            return FeedResult(session, True, queued=True, ids=n, backlog=n, **kw)
        held, committed = counts_of(shadow, session)
        return FeedResult(session, True, ids=held, committed=committed, backlog=held - committed, **kw)

    def feed_prompt(self, prompt: Prompt) -> FeedResult:
        """A turn's whole prompt, checked (``check``): to the facade, or kept until it is loaded."""
        session = prompt.session
        if self.slot.state in ("off", "failed"):
            return FeedResult(session, False, reason=self.slot.state)
        with self._mu:
            self._profile_of[session] = prompt.profile
            if not prompt.block.follows:
                return FeedResult(session, False, reason="profile")
            shadow = self.live
            if shadow is None:
                q = self._queued.get(session)
                behind = len(q.prompt) + len(q.outputs) if q is not None else None
                self._queued[session] = _Queued(prompt.ids)
                return self._result(None, session, behind_at_start=behind)
        before = _position(shadow, session)
        shadow.feed_prompt(session, prompt.ids)
        self.telemetry.observe("behind_at_turn_start_ids", before.pending if before else 0)
        out = self._result(shadow, session, behind_at_start=before.pending if before else None)
        after = _position(shadow, session) or Position()
        out.rollback = after.rollbacks > (before.rollbacks if before else 0)
        return out

    def feed_output(self, session: str, ids: Sequence[int]) -> FeedResult:
        """Qwen's output ids, appended: to the facade, or after the kept prompt."""
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
        held, committed = counts_of(shadow, session)  # counted once: the host calls this every round
        self.within_length(session, held, len(ids))
        shadow.feed_output(session, ids)
        held += len(ids)
        return FeedResult(session, True, ids=held, committed=committed, backlog=held - committed)

    def replay(self, shadow: Shadow) -> None:
        """On load: the feeds kept meanwhile go to the facade, which is live from then on."""
        with self._mu:
            for name, q in self._queued.items():
                try:
                    shadow.feed_prompt(name, q.prompt)
                    if q.outputs:
                        shadow.feed_output(name, q.outputs)
                except ShadowError as err:
                    if self.on_error is not None:
                        self.on_error(err)
            self._queued.clear()
            self.live = shadow
        shadow.residency.on_forget.append(self.forgotten)

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

    # ---- forgetting ------------------------------------------------------------------------------

    def forget(self, session: str) -> None:
        """Drop a session: its state, its parked file, its kept feeds, its profile."""
        with self._mu:
            queued = self._queued.pop(session, None) is not None
            self._profile_of.pop(session, None)
            shadow = self.live
        if shadow is not None and session in shadow.sessions():
            shadow.forget(session)
        elif not queued:
            raise UnknownSession(f"unknown session {session!r}")

    def forgotten(self, session: str) -> None:
        """The facade forgot ``session`` (a DELETE, its cap or MAX_SESSIONS): its profile goes too.
        Called under the facade's lock, so not under ``_mu`` (taken before the facade's elsewhere):
        one dict pop is atomic on its own."""
        self._profile_of.pop(session, None)

    def bookkeeping(self) -> tuple[dict[str, str], dict[str, int]]:
        """(each session's profile, each kept session's ids): this object's part of status."""
        with self._mu:
            return dict(self._profile_of), {n: len(q.prompt) + len(q.outputs) for n, q in self._queued.items()}
