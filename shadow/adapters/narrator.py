"""The narrator (a profile's ``narrator: on``): one line on each thought Qwen finishes.

When a ``</think>`` comes in Qwen's output (``round_ended`` or ``finished``), the thought has ended
just past it. The narrator then reads the session's whole chunks up to that point that the reader
has not read yet (committed, exact: the reading the reader would do anyway), and decodes greedily,
in a fork over the whole session, the narrator's instruction (``NARRATOR_PROMPT``, by default
``shadow/data/narrator/prompt.txt``) as a user turn after the thought. The fork leaves the committed
state as it was. The first non-blank line of what it decoded, at most ``MAX_CHARS`` characters, is
the summary; it goes to every subscriber (``subscribe``: a callback in process; the API streams it
as server-sent events).

**Its own slices, counted like the ration** (``shadow.core.scheduling.ration_budget`` and ``fits``,
with the narrator's own spent time): a turn's summaries may use ``share`` (3 %) of the time since
the turn's first token, less what the turn's summaries used already. A summary is decoded whole
between two of Qwen's rounds on the request's thread, after the device is synchronised (a fork
cannot be cut into pieces across rounds while the reader moves on). It starts only when its cost
fits what is left, estimated as the ration estimates a chunk, from the last measured costs: the
whole chunks it has to read first (the ration's last chunk cost for the session) plus the last
fork. So:

- a summary that does not fit yet **waits**: Qwen's later rounds earn the rest of its budget, and it
  is decoded at the first round where it fits (``waited_rounds`` says how many rounds that took);
- a summary still waiting when its turn finishes is **skipped** (``skipped.budget`` in status): it
  was about a thought Qwen has moved on from, and the time between turns is the reader's idle window,
  not Qwen's time to share.

Bounds, as the ration's: a summary whose cost cannot be estimated yet (nothing measured) starts on
any positive budget, as the first of its slice; a turn's summaries then use at most ``share`` of the
time since its first token plus one summary's estimation error. Each summary's budget, estimate and
cost are in its record, in a ``shadow.narration`` span and in status.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shadow.core.errors import ShadowError
from shadow.core.plan import ReadPlan
from shadow.core.records import ChunkRead, TurnTimeline
from shadow.core.scheduling import Clock, NullTelemetry, Telemetry, epoch_ns, fits, ration_budget
from shadow.core.session import grid_line_at_or_below
from shadow.core.shadow import Shadow
from shadow.core.slot import ModelSlot

from .records import Narration, NarratorStatus
from .tokens import ENDOFTEXT, IM_END, THINK_END, get_tokens

SHARE = 0.03
MAX_TOKENS = 32
MAX_CHARS = 200
# The thought ends inside an open assistant message: close it the way the chat template closes a
# reply with no content after its reasoning, so that the instruction comes as the next user turn.
CLOSE_REPLY = "\n\n<|im_end|>\n"


@dataclass
class _Thought:
    session: str
    at: int
    number: int
    rounds: int  # the turn's rounds when it ended


@dataclass
class _TurnBook:
    spent_s: float = 0.0
    waiting: list[_Thought] = field(default_factory=list)


def one_line(text: str) -> str:
    """The first non-blank line, stripped, at most ``MAX_CHARS`` characters."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:MAX_CHARS]
    return ""


class Narrator:
    def __init__(self, slot: ModelSlot, instruction: str, share: float = SHARE, max_tokens: int = MAX_TOKENS,
                 clock: Clock = time.monotonic, telemetry: Telemetry | None = None, keep: int = 32,
                 chunk_cost: Callable[[str], float | None] | None = None, max_turns: int = 1024,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        """``chunk_cost(session)``: the last measured cost of one of its chunks (the ration's estimate).
        ``max_turns``: the requests whose thoughts wait at once (the host's MAX_ARRIVED: one older than
        that many newer ones never finished, its host gone); the oldest beyond are dropped.
        ``timer``: what a summary's cost is measured with, the reader's (tests inject one, so that a
        summary's cost does not depend on the machine's load)."""
        self.slot = slot
        self.instruction = instruction
        self.share = share
        self.max_tokens = max_tokens
        self.clock = clock
        self.telemetry = telemetry or NullTelemetry()
        self.chunk_cost = chunk_cost
        self.timer = timer
        self.last_cost_s: float | None = None  # the last summary's measured cost, any session
        self.last_fork_s: float | None = None  # the last fork's, without the chunks read before it
        self.last_chunk_s: float | None = None  # the last chunk the narrator read
        self.summaries = 0
        self.failed = 0
        self.spent_s = 0.0
        self.skipped: Counter[str] = Counter()
        self.last: deque[Narration] = deque(maxlen=keep)
        self.errors: deque[str] = deque(maxlen=8)
        self._mu = threading.Lock()
        self.max_turns = max_turns
        self._turns: dict[str, _TurnBook] = {}  # by request id, oldest first
        self._thoughts: Counter[str] = Counter()
        self._subscribers: dict[int, tuple[Callable[[Narration], None], Callable[[], None] | None]] = {}
        self._next_subscriber = 0
        self._prompt: list[int] | None = None

    # ---- the host's side ---------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Narration], None],
                  closed: Callable[[], None] | None = None) -> Callable[[], None]:
        """``callback`` gets every summary, on the thread that decoded it, and ``closed`` is called
        once on ``close``; returns the unsubscribe."""
        with self._mu:
            key = self._next_subscriber
            self._next_subscriber += 1
            self._subscribers[key] = (callback, closed)

        def unsubscribe() -> None:
            with self._mu:
                self._subscribers.pop(key, None)
        return unsubscribe

    def close(self) -> None:
        """Every subscriber is told it is closed, and dropped (the server stops)."""
        with self._mu:
            subscribers = list(self._subscribers.values())
            self._subscribers.clear()
        for _, closed in subscribers:
            if closed is not None:
                closed()

    def prompt_ids(self) -> list[int]:
        if self._prompt is None:
            from .prompter import QwenPrompter

            self._prompt = get_tokens().encode(CLOSE_REPLY) + QwenPrompter().question_ids(self.instruction)
        return self._prompt

    # ---- what the service calls ---------------------------------------------------------------------

    def output(self, turn: TurnTimeline, session: str, first: int, ids: list[int] | tuple[int, ...]) -> int:
        """Output ids fed at session position ``first``: each ``</think>`` among them ends a thought.
        Returns how many ended."""
        ended = [first + i + 1 for i, t in enumerate(ids) if t == THINK_END]
        if not ended:
            return 0
        with self._mu:
            book = self._turns.setdefault(turn.request_id, _TurnBook())
            for at in ended:
                self._thoughts[session] += 1
                book.waiting.append(_Thought(session, at, self._thoughts[session], turn.rounds))
            while len(self._turns) > self.max_turns:  # a request that never finished (its host gone)
                gone = self._turns.pop(next(iter(self._turns)))
                self.skipped["request_gone"] += len(gone.waiting)
        return len(ended)

    def forget(self, session: str) -> None:
        """The session is forgotten: its thoughts' count goes with it (a new one counts from 1)."""
        with self._mu:
            self._thoughts.pop(session, None)

    def waiting(self, request_id: str) -> int:
        """Thoughts of the request that wait for a summary: the step reads chunks for these only."""
        with self._mu:
            book = self._turns.get(request_id)
        return len(book.waiting) if book is not None else 0

    def wants(self, request_id: str, ids: Sequence[int]) -> bool:
        """Whether a round with ``ids`` gives the request's narrator something to do: a thought
        ends among them, or one waits for a summary (a round without either may stay quiet)."""
        return THINK_END in ids or self.waiting(request_id) > 0

    def step(self, turn: TurnTimeline, final: bool = False) -> list[Narration]:
        """Between two rounds (``final``: the turn finishes): the summaries that fit the turn's share."""
        with self._mu:
            book = self._turns.get(turn.request_id)
        done: list[Narration] = []
        if book is None:
            return done
        shadow = self.slot.get()
        now = self.clock()
        budget = ration_budget(turn, now, self.share, math.inf, book.spent_s)
        spent = 0.0
        while book.waiting and shadow is not None:
            estimate = self.estimate(shadow, book.waiting[0])
            if not fits(spent, estimate, budget):
                break
            thought = book.waiting.pop(0)
            before = book.spent_s
            got = self._narrate(shadow, turn, book, thought, budget - spent, estimate, now)
            spent += book.spent_s - before
            if got is not None:
                done.append(got)
        if final:
            with self._mu:
                self._turns.pop(turn.request_id, None)
                if book.waiting:
                    self.skipped["budget" if shadow is not None else "not_loaded"] += len(book.waiting)
        for n in done:
            self._hand_over(n)
        return done

    def _plan(self, shadow: Shadow, thought: _Thought) -> tuple[int | None, int]:
        """Where the fork ends (the thought's end; None: the reader committed rows past it, so at the
        session's end) and the whole chunks to read before it."""
        pos = shadow.position(thought.session)
        at = thought.at if pos.committed <= thought.at <= pos.length else None
        upto = grid_line_at_or_below(pos.length if at is None else at, shadow.grid)
        return at, max(0, (upto - pos.committed) // shadow.grid)

    def estimate(self, shadow: Shadow, thought: _Thought) -> float | None:
        """The chunks to read first at the last chunk cost, plus the last fork; None when one of
        them was never measured."""
        _, chunks = self._plan(shadow, thought)
        chunk = self.chunk_cost(thought.session) if self.chunk_cost is not None else None
        chunk = chunk if chunk is not None else self.last_chunk_s
        if self.last_fork_s is None or (chunks and chunk is None):
            return None
        return self.last_fork_s + chunks * (chunk or 0.0)

    def _narrate(self, shadow: Shadow, turn: TurnTimeline, book: _TurnBook, thought: _Thought, budget: float,
                 estimate: float | None, now: float) -> Narration | None:
        session = thought.session
        since = now - (turn.first_token_s or 0.0)
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": session,
                 "shadow.request.id": turn.request_id, "gen_ai.request.max_tokens": self.max_tokens,
                 "shadow.narrator.at": thought.at, "shadow.narrator.budget_ms": budget * 1e3,
                 "shadow.narrator.estimate_ms": -1.0 if estimate is None else estimate * 1e3,
                 "shadow.narrator.turn_spent_before_ms": book.spent_s * 1e3}
        with self.telemetry.span("shadow.narration", attrs) as span:
            shadow.sync()
            t0 = self.timer()
            chunks: list[ChunkRead] = []
            try:
                at, n_chunks = self._plan(shadow, thought)
                r0 = epoch_ns()
                chunks = shadow.read(ReadPlan(session, max_chunks=n_chunks)) if n_chunks else []
                r1 = epoch_ns()
                for c in chunks:  # one span and one count each, as the schedulers' chunks (spans: the read's)
                    self.telemetry.chunk("narrator", c, shadow.position(session).pending, r0, r1)
                t1 = self.timer()
                ids = shadow.decode(session, self.prompt_ids(), self.max_tokens, at=at)
                shadow.sync()
            except ShadowError as err:
                cost = self.timer() - t0
                self._spend(book, cost, None, chunks, failed=True)
                self.errors.append(f"{type(err).__name__}: {err}")
                span.set("shadow.narrator.error", str(err))
                span.set("shadow.narrator.spent_ms", cost * 1e3)
                return None
            t2 = self.timer()
            cost = t2 - t0
            spent_before = book.spent_s
            self._spend(book, cost, t2 - t1, chunks)
            text = one_line(get_tokens().decode([t for t in ids if t not in (IM_END, ENDOFTEXT)]))
            pos = shadow.position(session)
            n = Narration(session, turn.request_id, thought.number, thought.at, text, ids,
                          0 if at is not None else pos.length - thought.at, pos.committed, len(chunks),
                          cost * 1e3, None if estimate is None else estimate * 1e3, budget * 1e3,
                          spent_before * 1e3, since * 1e3, turn.rounds - thought.rounds)
            span.set("shadow.narrator.spent_ms", cost * 1e3)
            span.set("shadow.narrator.waited_rounds", n.waited_rounds)
            span.set("gen_ai.usage.output_tokens", len(ids))
        self.telemetry.count("narrations")
        with self._mu:
            self.summaries += 1
            self.last.append(n)
        return n

    def _spend(self, book: _TurnBook, cost: float, fork: float | None, chunks: list[ChunkRead],
               failed: bool = False) -> None:
        with self._mu:  # several requests' threads narrate at once
            book.spent_s += cost
            self.spent_s += cost
            self.telemetry.count("narrator_seconds", cost)
            self.failed += int(failed)
            self.last_cost_s = cost
            if fork is not None:
                self.last_fork_s = fork
            if chunks:
                self.last_chunk_s = chunks[-1].cost_s

    def _hand_over(self, n: Narration) -> None:
        with self._mu:
            subscribers = [callback for callback, _ in self._subscribers.values()]
        for callback in subscribers:
            try:
                callback(n)
            except Exception as err:  # a host's callback must not break Qwen's round
                self.errors.append(f"a narration callback failed: {type(err).__name__}: {err}")

    def status(self) -> NarratorStatus:
        with self._mu:
            return NarratorStatus(
                share=self.share, max_tokens=self.max_tokens, summaries=self.summaries, failed=self.failed,
                skipped=dict(self.skipped), waiting=sum(len(b.waiting) for b in self._turns.values()),
                spent_ms=self.spent_s * 1e3,
                last_cost_ms=None if self.last_cost_s is None else self.last_cost_s * 1e3,
                subscribers=len(self._subscribers), last=list(self.last), errors=list(self.errors))
