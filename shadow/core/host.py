"""The host interface: what the host's engine tells the shadow, and the two locks they share.

``Host`` is the one interface a host calls: ``shadow.adapters.service.ShadowService`` in process,
``shadow.api.client.ShadowClient`` over HTTP (its routes carry the same names). ``HostActivity``
is the bookkeeping behind it: it only *records* what a host reported (``record_arrived``, ...)
for the idle window and the ration to read; recording feeds and reads nothing, so a host never
calls it directly. Pure Python and clock-injectable, so the schedulers can be driven by a
simulated timeline.

What the words mean (docs/architecture.md, promise 6):

- A request **waits** from ``arrived`` until ``started``: it is queued for the engine.
- It **runs** from ``started`` until ``finished``: its prefill and its decode.
- A **hold** (``hold()``, or ``add_hold``/``release_hold`` with a time to live) keeps the idle
  window shut while the host does something that wants the GPU alone (a benchmark, a model load).
- The turn's **first token**: ``first_token``. The ration counts from it, not from the turn's
  start: counting from the start let a 17 s prefill earn a ration that was then spent inside the
  decode.
- A **round**: one of the host's decode steps. ``round_ended`` is called between two rounds on
  the request's thread; that is where the rationed scheduler decides a slice (read there, or on
  its own thread: ``RATION_THREAD``).

The locks:

- The **engine lock** is a ``RankedLock``: waiters are served lowest rank first, in arrival order
  within a rank. The host's requests take it at rank 0 (ranks 1 to 3 are the host's own, e.g. a
  summary written ahead); the idle window takes it at ``IDLE_RANK`` (4), behind every waiter. A
  host that has its own ranked engine lock passes it in; otherwise the activity makes one, and
  ``out_of_the_way()`` (take it at rank 0 and give it back) is the barrier a request passes
  before its prefill: it returns once the chunk being read, if any, is done.
- The **box lock** is any lock with ``acquire(blocking=False)``/``release``: the host holds it
  while loading a model or doing anything that owns the whole box. The idle window takes it
  without waiting, and skips its turn when it is held.

Every counter reads and writes under one internal lock, so an engine thread, the HTTP handlers
and the idle loop may call in at any time. A turn's ``TurnTimeline`` is written only here: the host's
verbs (``record_*``), the ration's account (``record_ration``) and the time a host spent inside the
shadow's calls (``record_host_time``); readers get the live record, which only these methods change.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from .errors import BadInput, ShadowError, TooMany
from .records import FeedResult, HostStatus, RoundResult, RouterAsk, TurnTimeline

__all__ = ["IDLE_RANK", "REQUEST_RANK", "BoxLock", "EngineLock", "FeedResult", "Host", "HostActivity", "RankedLock",
           "RoundResult", "TurnTimeline", "UnknownRequest"]

IDLE_RANK = 4
REQUEST_RANK = 0
STALE_S = 600.0  # a request with no event for this long is forgotten (a host that died mid-turn)


class UnknownRequest(ShadowError, KeyError):
    """A request id the host never announced (or one already finished)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown request"


class EngineLock(Protocol):
    def acquire(self, rank: int = REQUEST_RANK, timeout: float | None = None) -> bool: ...

    def release(self) -> None: ...

    def waiting(self, below_rank: int | None = None) -> int: ...


class BoxLock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


class RankedLock:
    """A lock whose waiters are served lowest rank first, first come first served within a rank.

    Not reentrant; any thread may release it (an HTTP host takes and gives back on different
    handler threads)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._held = False
        self._queue: list[tuple[int, int]] = []  # (rank, ticket), a heap
        self._tickets = itertools.count()

    def acquire(self, rank: int = REQUEST_RANK, timeout: float | None = None) -> bool:
        with self._cond:
            if not self._held and not self._queue:
                self._held = True
                return True
            if timeout is not None and timeout <= 0:
                return False
            me = (rank, next(self._tickets))
            heapq.heappush(self._queue, me)
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while self._held or self._queue[0] != me:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(left)
                heapq.heappop(self._queue)
                self._held = True
                return True
            finally:
                if me in self._queue:  # timed out: leave the queue, wake the next one
                    self._queue.remove(me)
                    heapq.heapify(self._queue)
                    self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            if not self._held:
                raise RuntimeError("release of an engine lock that is not held")
            self._held = False
            self._cond.notify_all()

    def waiting(self, below_rank: int | None = None) -> int:
        """Waiters, or those of a rank below ``below_rank`` (the ones an idle window yields to)."""
        with self._cond:
            return sum(1 for r, _ in self._queue if below_rank is None or r < below_rank)

    @property
    def locked(self) -> bool:
        return self._held

    @contextmanager
    def held(self, rank: int = REQUEST_RANK) -> Iterator[None]:
        self.acquire(rank)
        try:
            yield
        finally:
            self.release()


class Host(Protocol):
    """The host interface: one set of verbs for an engine in process and a host over HTTP.

    ``started`` takes the turn's whole prompt as ids or as OpenAI-style messages (with ``tools``
    and ``enable_thinking``; rendered with the Qwen3.5 chat template), the profile, and the
    router's question in shadow mode (a ``RouterAsk``: ``fresh`` says whether the router decided
    the class on this turn). ``add_hold`` without
    ``ttl_s`` lasts until released in process; over HTTP the server's default time to live applies,
    so a host that dies cannot keep the idle window shut for ever."""

    def arrived(self, request_id: str) -> TurnTimeline: ...

    def started(self, request_id: str, session: str, ids: Sequence[int] | None = None,
                messages: Sequence[Mapping[str, Any]] | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None, enable_thinking: bool | None = None,
                profile: str | None = None,
                router: RouterAsk | None = None) -> tuple[TurnTimeline, FeedResult]: ...

    def first_token(self, request_id: str) -> TurnTimeline: ...

    def round_ended(self, request_id: str, ids: Sequence[int] = ()) -> RoundResult: ...

    def finished(self, request_id: str, ids: Sequence[int] = ()) -> TurnTimeline: ...

    def add_hold(self, ttl_s: float | None = None) -> str: ...

    def release_hold(self, hold_id: str) -> None: ...

    def hold(self) -> AbstractContextManager[str]: ...


@dataclass
class _Hold:
    until: float | None  # None: until released


@dataclass
class HostActivity:
    """The host's side, as the shadow sees it: who waits, who runs, who holds; turns' timelines."""

    clock: Callable[[], float] = time.monotonic
    engine_lock: EngineLock = field(default_factory=RankedLock)
    box_lock: BoxLock = field(default_factory=threading.Lock)
    stale_s: float = STALE_S

    def __post_init__(self) -> None:
        self._mu = threading.Lock()
        self._turns: dict[str, TurnTimeline] = {}
        self._holds: dict[str, _Hold] = {}
        self._hold_ids = itertools.count(1)
        self.finished_turns = 0
        # the device-wide ration's base: seconds during which some turn decoded (its first token
        # came, it has not finished), counted at each change of the set of decoding turns
        self._decoding: set[str] = set()
        self._decoding_s = 0.0
        self._decoding_mark = 0.0

    def _decoding_changes(self, now: float, request_id: str, decoding: bool) -> None:
        """Under ``_mu``: ``request_id`` starts (or stops) decoding at ``now``."""
        if self._decoding:
            self._decoding_s += max(0.0, now - self._decoding_mark)
        self._decoding_mark = now
        if decoding:
            self._decoding.add(request_id)
        else:
            self._decoding.discard(request_id)

    # ---- what the host reported --------------------------------------------------------------

    def record_arrived(self, request_id: str, limit: int | None = None) -> TurnTimeline:
        """A request is queued for the engine: the idle window stops before its next chunk. With
        ``limit``, refused (``TooMany``) while that many requests are live (announced, not finished)."""
        now = self.clock()
        with self._mu:
            if request_id in self._turns:
                raise BadInput(f"request {request_id!r} was already announced")
            if limit is not None and len(self._turns) >= limit:
                raise TooMany(f"{len(self._turns)} requests are live, the most QWEN38_SHADOW_MAX_ARRIVED allows: "
                              "finish one first")
            turn = self._turns[request_id] = TurnTimeline(request_id, arrived_s=now, last_event_s=now)
            return turn

    def record_started(self, request_id: str, session: str | None = None, prompt_len: int = 0,
                       profile: str | None = None) -> TurnTimeline:
        """The request runs (its prefill starts). Announcing it first is optional."""
        now = self.clock()
        with self._mu:
            turn = self._turns.get(request_id)
            if turn is None:
                turn = self._turns[request_id] = TurnTimeline(request_id, arrived_s=now)
            elif turn.started_s is not None:
                raise BadInput(f"request {request_id!r} already started")
            turn.session, turn.profile, turn.prompt_len = session, profile, prompt_len
            turn.started_s = turn.last_event_s = now
            return turn

    def record_first_token(self, request_id: str) -> TurnTimeline:
        now = self.clock()
        with self._mu:
            turn = self._running(request_id)
            if turn.first_token_s is None:
                turn.first_token_s = now
                self._decoding_changes(now, request_id, True)
            turn.last_event_s = now
            return turn

    def record_round_ended(self, request_id: str, new_ids: int = 0) -> TurnTimeline:
        now = self.clock()
        with self._mu:
            turn = self._running(request_id)
            if turn.first_token_s is None:  # a round produced tokens: the first came with it
                turn.first_token_s = now
                self._decoding_changes(now, request_id, True)
            turn.rounds += 1
            turn.output_len += new_ids
            turn.last_event_s = now
            return turn

    def record_finished(self, request_id: str, new_ids: int = 0, host_s: float = 0.0) -> TurnTimeline:
        """The turn is over; ``host_s``: the time the finishing call spent in the shadow before it."""
        now = self.clock()
        with self._mu:
            turn = self._turns.pop(request_id, None)
            if turn is None:
                raise UnknownRequest(f"unknown request {request_id!r}")
            self._decoding_changes(now, request_id, False)
            turn.output_len += new_ids
            turn.host_s += host_s
            turn.finished_s = now
            self.finished_turns += 1
            return turn

    def record_ration(self, request_id: str, spent_s: float, chunks: int, budget_s: float) -> TurnTimeline:
        """A ration slice ran at one of the request's rounds: its measured cost and chunks are added
        to the turn's, and its budget is the turn's last."""
        with self._mu:
            turn = self._running(request_id)
            turn.spent_s += spent_s
            turn.chunks += chunks
            turn.budget_s = budget_s
            return turn

    def record_host_time(self, request_id: str, seconds: float) -> None:
        """Wall time the host spent inside a shadow call for this running request (the finishing call
        passes its own to ``record_finished``)."""
        with self._mu:
            self._running(request_id).host_s += seconds
    def decoding_s(self) -> float:
        """Seconds so far during which some turn decoded: the device-wide ration's base."""
        now = self.clock()
        with self._mu:
            return self._decoding_s + (max(0.0, now - self._decoding_mark) if self._decoding else 0.0)

    def sessions_in_flight(self) -> list[str]:
        """The sessions of the turns that run (started, not finished), in the order they started."""
        with self._mu:
            return [t.session for t in self._turns.values() if t.started_s is not None and t.session is not None]

    def turn(self, request_id: str) -> TurnTimeline:
        with self._mu:
            try:
                return self._turns[request_id]
            except KeyError:
                raise UnknownRequest(f"unknown request {request_id!r}") from None

    def _running(self, request_id: str) -> TurnTimeline:
        turn = self._turns.get(request_id)
        if turn is None:
            raise UnknownRequest(f"unknown request {request_id!r}")
        if turn.started_s is None:
            raise BadInput(f"request {request_id!r} has not started")
        return turn

    # ---- holds ---------------------------------------------------------------------------------

    def record_hold(self, ttl_s: float | None = None, limit: int | None = None) -> str:
        """A hold that lasts until ``record_hold_released`` or, with ``ttl_s``, until it expires;
        with ``limit``, refused (``TooMany``) while that many are live."""
        with self._mu:
            if limit is not None:
                self._expire(self.clock())
                if len(self._holds) >= limit:
                    raise TooMany(f"{len(self._holds)} holds are live, the most QWEN38_SHADOW_MAX_HOLDS allows: "
                                  "release one (DELETE) or let one expire")
            hold_id = f"hold-{next(self._hold_ids)}"
            self._holds[hold_id] = _Hold(None if ttl_s is None else self.clock() + ttl_s)
            return hold_id

    def record_hold_released(self, hold_id: str) -> None:
        with self._mu:
            if self._holds.pop(hold_id, None) is None:
                raise UnknownRequest(f"unknown hold {hold_id!r}")

    @contextmanager
    def holding(self) -> Iterator[str]:
        """A hold for the ``with`` block."""
        hold_id = self.record_hold()
        try:
            yield hold_id
        finally:
            self.record_hold_released(hold_id)

    # ---- what the idle window asks --------------------------------------------------------------

    def _expire(self, now: float) -> None:
        for k in [k for k, h in self._holds.items() if h.until is not None and h.until <= now]:
            del self._holds[k]
        for k in [k for k, t in self._turns.items() if now - t.last_event_s > self.stale_s]:
            del self._turns[k]
            if k in self._decoding:
                self._decoding_changes(now, k, False)

    def counts(self) -> tuple[int, int, int]:
        """(waiting, running, holds) now; waiting counts engine-lock waiters ahead of the idle window."""
        with self._mu:
            self._expire(self.clock())
            running = sum(1 for t in self._turns.values() if t.started_s is not None)
            waiting = len(self._turns) - running
            holds = len(self._holds)
        return waiting + self.engine_lock.waiting(below_rank=IDLE_RANK), running, holds

    def waiting(self) -> int:
        return self.counts()[0]

    def busy(self) -> bool:
        """A request runs or waits, or a hold is on: the idle window stays shut."""
        return any(self.counts())

    def out_of_the_way(self, timeout: float | None = None) -> bool:
        """Pass through the engine lock at rank 0: returns once the idle window's chunk in flight,
        if any, is done. What a request does before its prefill when the host shares no lock."""
        if not self.engine_lock.acquire(REQUEST_RANK, timeout):
            return False
        self.engine_lock.release()
        return True

    def status(self) -> HostStatus:
        waiting, running, holds = self.counts()
        with self._mu:
            turns = [replace(t) for t in self._turns.values()]  # copies: the live ones change under the lock
            return HostStatus(waiting, running, holds, sorted(self._holds), turns, self.finished_turns)
