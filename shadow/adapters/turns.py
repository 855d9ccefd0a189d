"""The host's verbs on the service: a request's turn from ``arrived`` to ``finished``, its decode
rounds (quiet ones kept for the next look: ``rounds.py``), the narrator's slice and the ration's
step at a round, and the holds. ``ShadowService`` is built on this class; the feeds, the profiles
and the questions are its own (``service.py``).

Every write to a turn goes through ``HostActivity`` (``record_*``), under its lock."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from shadow.core.errors import BadInput, ShadowError
from shadow.core.host import HostActivity
from shadow.core.profiles import ShadowBlock
from shadow.core.protocols import Ration, Telemetry
from shadow.core.records import FeedResult, RoundResult, TurnTimeline
from shadow.core.scheduling import WindowStats
from shadow.core.settings import ShadowSettings

from .narrator import Narrator
from .rounds import OpenRound, OpenRounds
from .router import RouterQuestion, RouterShadow, insertion_point

if TYPE_CHECKING:
    from shadow.core.shadow import Shadow


class HostTurns:
    """The host interface's verbs (``shadow.core.host.Host``), for ``ShadowService``."""

    # what the service provides
    settings: ShadowSettings
    activity: HostActivity
    ration: Ration
    narrator: Narrator | None
    router: RouterShadow | None
    telemetry: Telemetry
    clock: Callable[[], float]
    rounds: OpenRounds
    stats: dict[str, WindowStats]
    live: Shadow | None

    def block(self, session: str, profile: str | None) -> tuple[str, ShadowBlock]:
        raise NotImplementedError

    def prompt_ids(self, ids: Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None,
                   tools: Sequence[Mapping[str, Any]] | None, enable_thinking: bool | None) -> list[int]:
        raise NotImplementedError

    def within_length(self, session: str, held: int, more: int) -> None:
        raise NotImplementedError

    def feed_prompt(self, session: str, ids: Sequence[int] | None = None,
                    messages: Sequence[Mapping[str, Any]] | None = None,
                    tools: Sequence[Mapping[str, Any]] | None = None, enable_thinking: bool | None = None,
                    profile: str | None = None) -> FeedResult:
        raise NotImplementedError

    def follows(self, session: str) -> bool:
        raise NotImplementedError

    def narrates(self, session: str) -> bool:
        raise NotImplementedError

    def counts(self, shadow: Shadow, session: str) -> tuple[int, int]:
        raise NotImplementedError

    # ---- a turn ----------------------------------------------------------------------------------

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
        prompt = self.prompt_ids(ids, messages, tools, enable_thinking)
        if not prompt:
            raise BadInput("empty prompt")
        self.within_length(session, 0, len(prompt))
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
            self.activity.record_host_time(request_id, time.perf_counter() - entered)
            return RoundResult(request_id, 0, 0.0, turn.budget_s * 1e3, turn.spent_s * 1e3,
                               open_.backlog + len(open_.pending))
        turn = self.activity.turn(request_id)
        session = turn.session
        if session is None or turn.started_s is None:
            raise BadInput(f"request {request_id!r} has not started")
        follows = self.follows(session)
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
            held, committed = self.counts(shadow, session) if shadow is not None else (0, 0)
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
            every, fed = self.rounds.take(request_id, turn.session, ids, self.follows(turn.session))
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
        if fed is not None and fed.followed and not fed.queued and self.narrates(turn.session):
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
