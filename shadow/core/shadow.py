"""The facade: sessions fed by a host, read on the grid, asked about. Torch-free; the tensor work is
the ``Reader``'s, the text work the ``Prompter``'s.

Questions given as text are rendered as one user turn with the Qwen3.5 template, thinking off:

    <|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n

appended after the session's ids (committed rows, then the pending tail), so the next token is
where the answer's letter goes. Each choice is a label that is one token (``A``, ``B``, ...); the
answer is the softmax over those tokens' logits from that one forward.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from .costs import ChunkCosts, fits
from .errors import BadInput, StateLost, UnknownSession
from .leases import Leases
from .plan import ALL_READY, ReadPlan
from .protocols import Prompter, Reader, StateStore, Telemetry, Window
from .questions import choice_tokens, question_ids
from .records import Answer, ChunkRead, SessionStatus, ShadowStatus, Sharing, StoreStatus
from .residency import Residency
from .session import Position, first_difference, int32_or_none
from .token_ids import checked, packed

OnPass = Callable[[list["ChunkRead"], "float | None", int, int], None]  # chunks, estimate, start, end (epoch ns)


def _holds_ids(session: str, ids: Sequence[int]) -> None:
    """A fork needs the session's ids: one without any lost them with a refused park (every feed
    brings at least one), and an answer from no context at all would pass for one about it."""
    if not ids:
        raise StateLost(f"session {session!r} holds no ids: its parked state was refused and its ids went with "
                        "it; the host's next prompt brings them back")


class Shadow:
    """Sessions fed by a host and read on the grid.

    Where each session's state lives (resident, parked, dropped; the cap) is the ``Residency``'s;
    its lock serialises every call here too, so the session a call uses is never evicted under it.
    """

    def __init__(self, reader: Reader, prompter: Prompter, clock: Callable[[], float] = time.monotonic, *,
                 memory: StateStore, disk: StateStore | None = None, cap_bytes: int | None = None,
                 max_sessions: int | None = None, telemetry: Telemetry | None = None,
                 leases: Leases | None = None) -> None:
        self.reader = reader
        self.telemetry = telemetry  # counts rollbacks, questions and a fork's tail chunks where they happen
        self.prompter = prompter
        self.clock = clock
        self.grid = reader.grid
        self.residency = Residency(reader.grid, reader.new_session, clock, memory=memory, disk=disk,
                                   cap_bytes=cap_bytes, max_sessions=max_sessions, telemetry=telemetry,
                                   leases=leases)
        self._lock = self.residency.lock
        self.costs = ChunkCosts()  # what a pass costs, by batch size and depth: every plan reads it
        # sessions with a whole chunk pending (a superset: see ``ready``); [True]: below the settled end
        self._ready: dict[bool, set[str]] = {False: set(), True: set()}
        self._changes = 0  # bumped whenever ``_ready`` may change: ``lowest_ready_depth``'s cache key
        self._lowest: dict[bool, tuple[int, int | None]] = {}
        for name in self.residency.names():  # sessions a planned stop parked
            self._mark(name)
        self.residency.on_forget.append(self._forgotten)

    def _forgotten(self, session: str) -> None:
        """The residency forgot ``session`` (a DELETE, the cap or MAX_SESSIONS): it is not ready any more."""
        for ready in self._ready.values():
            ready.discard(session)
        self._changes += 1

    @property
    def memory(self) -> StateStore:
        return self.residency.memory

    @property
    def disk(self) -> StateStore | None:
        return self.residency.disk

    @property
    def cap_bytes(self) -> int | None:
        return self.residency.cap_bytes

    def resident_bytes(self) -> int:
        return self.residency.resident_bytes()

    def restore(self, session: str) -> None:
        """Bring ``session`` back to the device now (from its parked file, or empty to be read again)."""
        with self._lock:
            self.residency.restore(session)
            self._mark(session)

    def park(self, session: str) -> None:
        """Park (or drop) ``session`` now, whatever the cap."""
        self.residency.park(session)

    # ---- feeding -------------------------------------------------------------------------

    def accepts(self, ids: Sequence[int]) -> bool:
        """Whether a feed would take ``ids`` as token ids (``token_ids.checked`` without the message)."""
        return packed(ids, self.reader.vocab_size) is not None

    def feed_prompt(self, session: str, ids: Sequence[int]) -> None:
        """A turn's whole rendered prompt. A prompt that differs from what was read rolls the state
        back to the newest checkpoint at or below the first differing id (or to the start)."""
        prompt = self._checked_prompt(session, ids)
        if not prompt:
            raise BadInput("empty prompt")
        with self.residency.using(session, create=True) as (book, tensors):
            rollback = book.feed_prompt(prompt)
            if rollback is not None:
                self.reader.roll_back(tensors, rollback.resume_at)
                if self.telemetry is not None:
                    self.telemetry.count("rollbacks")
                    self.telemetry.count("ids_reread", rollback.reread)
            self.reader.checkpoint_if_due(book, tensors)
            self._mark(session)

    def _checked_prompt(self, session: str, ids: Sequence[int]) -> array[int]:
        """The prompt checked, in time for a request's first token, as the book holds ids (int32): a
        turn's prompt repeats most of what the session holds, and ids equal to held ones were
        checked when they came, so only the rest is checked (a 15k-id prompt costs about 2 ms to
        check whole on this path's CPU)."""
        prompt = int32_or_none(ids)  # bools become ints; compared with the book's, array to array
        if prompt is None:  # not int32: BadInput names the first bad id
            checked(ids, self.reader.vocab_size, "prompt")
            raise BadInput("prompt holds ids past int32")  # only for a vocabulary past 2**31
        try:
            book = self.residency.held_book(session)
        except UnknownSession:
            book = None
        same = first_difference(book.ids, prompt) if book is not None else 0
        if packed(prompt[same:], self.reader.vocab_size) is None:
            checked(prompt[same:], self.reader.vocab_size, "prompt", offset=same)
        return prompt

    def feed_output(self, session: str, ids: Sequence[int]) -> None:
        """Qwen's output ids, appended after what the session holds."""
        output = checked(ids, self.reader.vocab_size, "output")
        with self._lock:
            book = self.residency.held_book(session)
            if book is not None:
                book.feed_output(output)  # bookkeeping only: no need to bring the state back
                book.last_used = self.clock()
                self.residency.used(session)
                self._mark(session)
                return
        with self.residency.using(session) as (book, _):
            book.feed_output(output)
            self._mark(session)

    # ---- reading -------------------------------------------------------------------------

    def position(self, session: str) -> Position:
        """Where the session's reader stands (a read-only copy); never brings its state back."""
        return self.residency.position(session)

    def session_ids(self, session: str) -> tuple[int, ...]:
        """Every id the session holds (a copy): what a fresh prefill to compare with reads."""
        return self.residency.session_ids(session)

    def counts(self, session: str) -> tuple[int, int]:
        """``(ids held, ids committed)`` of the session; never brings its state back."""
        return self.residency.counts(session)

    def backlog(self, session: str, settled: bool = False) -> int:
        """Ids of ``session`` not yet read (with ``settled``, below its settled end only: what the
        ration may read, ``SessionBook.settled_end``)."""
        end, committed = self.residency.counts(session, settled)
        return max(0, end - committed)

    def backlogs(self) -> dict[str, int]:
        """Ids not yet committed, per session (resident or parked): what schedulers poll."""
        with self._lock:
            return {name: self.residency.position(name).pending for name in self.residency.names()}

    def readable_backlogs(self) -> dict[str, int]:
        """``backlogs`` of the sessions the background may read: all but those dropped and not used
        since (what the idle window polls, so that it goes quiet once the host stops feeding)."""
        with self._lock:
            return {name: self.residency.position(name).pending for name in self.residency.names()
                    if not self.residency.awaits_use(name)}

    def committed_rows(self) -> dict[str, int]:
        """Rows read, per session (resident or parked)."""
        with self._lock:
            return {name: self.residency.position(name).committed for name in self.residency.names()}

    def sync(self) -> None:
        """Wait for the reader's queued device work (a no-op on the CPU)."""
        self.reader.sync()

    def warm_up(self) -> None:
        """One chunk through the model outside any session: kernels compiled and planned before a
        request waits on them."""
        with self._lock:
            self.reader.warm_up()
            self.reader.fingerprint  # noqa: B018  # computed now, in the idle window, before any restore needs it
            self.reader.fresh([0] * self.grid)
            self.prompter.question_ids("?")  # the chat template and the tokenizer, loaded before a question
            self.prompter.single_token("A")

    def read(self, plan: ReadPlan | str | None = ALL_READY, on_pass: OnPass | None = None,
             stop: Callable[[], bool] | None = None) -> list[ChunkRead]:
        """Read whole chunks now, as ``plan`` says (``ReadPlan``; by default every ready session, no
        bound), in passes of up to ``reader.max_batch`` sessions (one chunk each), while ``stop()`` is
        false; ``on_pass(chunks, estimate, start_ns, end_ns)`` follows each pass. This is the loop:
        the schedulers build the plan and do not repeat it. A session's name reads that session alone
        (``ReadPlan(name)``), None every ready one, as the facade always took them."""
        plan = ALL_READY if plan is None else ReadPlan(plan) if isinstance(plan, str) else plan
        spent, done = 0.0, list[ChunkRead]()
        with self._lock:
            if plan.session is not None:
                self.residency.check(plan.session)
            while (stop is None or not stop()) and not (plan.yields and self._lock.waiting):
                most = self.reader.max_batch if plan.max_chunks is None else min(self.reader.max_batch,
                                                                                 plan.max_chunks - len(done))
                line = self._line(plan.session, plan.favoured, plan.settled)[:max(0, most)]
                budget = None if plan.budget_s is None or (plan.first_pass_free and not done) else plan.budget_s
                names, estimate = self._fitting(line, spent, budget, plan.whole)
                if not names:
                    break
                left = None if plan.max_chunks is None else plan.max_chunks - len(done)
                span = self._span_room(names, spent, budget, left, plan.settled)
                chunks, start_ns, end_ns = self._read_pass(names, plan.uses, span)
                spent += sum(c.cost_s for c in chunks)
                done += chunks
                if on_pass is not None:
                    on_pass(chunks, estimate, start_ns, end_ns)
        return done

    def _line(self, session: str | None, favoured: Sequence[str], settled: bool = False) -> list[str]:
        """The sessions ``read`` may read next, in its order. Of the turns in flight the one nearest
        to fresh comes first: with the ration short, reading the most behind first left every turn
        a little behind (80 % fresh at 16 agents against 96 %, ``benchmarks/concurrency.py``)."""
        if session is not None:
            return [session] if self.backlog(session, settled) >= self.grid else []
        pending = {}
        for name in self._ready[settled]:
            end, committed = self.residency.counts(name, settled)
            if end - committed >= self.grid and not self.residency.awaits_use(name):
                pending[name] = end - committed
        first = set(favoured)
        ahead = sorted((n for n in pending if n in first), key=lambda n: (pending[n], n))
        rest = sorted((n for n in pending if n not in first), key=lambda n: (-self._last_used(n), n))
        return ahead + rest

    def _fitting(self, line: list[str], spent: float, budget: float | None,
                 whole: bool = False) -> tuple[list[str], float | None]:
        """The longest head of ``line`` whose pass's estimate fits what is left of ``budget`` (with
        ``whole``, the whole line or nothing)."""
        for n in range(len(line), len(line) - 1 if whole else 0, -1):
            estimate = self.costs.estimate([self.residency.counts(s)[1] for s in line[:n]])
            if budget is None or fits(spent, estimate, budget):
                return line[:n], estimate
        return [], None

    def _span_room(self, names: list[str], spent: float, budget: float | None, most: int | None,
                   settled: bool = False) -> int:
        """The most chunks a pass of ``names`` may read of its one session (a span, ``Reader.spans``):
        1 unless the pass holds one session and the reader takes spans (``ChunkCosts.span_that_fits``)."""
        if len(names) != 1 or not self.reader.spans:
            return 1
        end, committed = self.residency.counts(names[0], settled)
        room = (end - committed) // self.grid if most is None else min(most, (end - committed) // self.grid)
        return self.costs.span_that_fits(self.reader.spans, committed, self.grid, room, spent, budget)

    def _read_pass(self, names: list[str], uses: frozenset[str], span: int = 1) -> tuple[list[ChunkRead], int, int]:
        """One pass: each session resident for it, one chunk each, or one session's ``span`` chunks
        at most (stopping at a wanted checkpoint line); the cost recorded once."""
        with ExitStack() as held:
            got = [held.enter_context(self.residency.using(n, background=n not in uses)) for n in names]
            chunks = got[0][0].longest_span(self.reader.spans, span) if len(got) == 1 else 1
            depths = [b.committed + i * self.grid for b, _ in got for i in range(chunks)]
            start_ns = time.time_ns()
            if chunks > 1:
                cost = self.reader.read_span(*got[0], chunks)
            else:
                cost = self.reader.read_chunk(*got[0]) if len(got) == 1 else self.reader.read_chunks(got)
            end_ns = time.time_ns()
        self.costs.record(depths, cost)
        for name in names:
            self._mark(name)
        share = cost / len(depths)
        if chunks > 1:
            return [ChunkRead(names[0], d, self.grid, share, 1, chunks) for d in depths], start_ns, end_ns
        return [ChunkRead(n, d, self.grid, share, len(names)) for n, d in zip(names, depths, strict=True)], \
            start_ns, end_ns

    def _last_used(self, name: str) -> float:
        book = self.residency.held_book(name)
        return book.last_used if book is not None else self.residency.position(name).last_used

    def _mark(self, name: str) -> None:
        """Keep ``_ready`` true for ``name`` after its ids or its reading changed."""
        held, end, committed = self.residency.ends(name)
        for settled, pending in ((False, held - committed), (True, end - committed)):
            (self._ready[settled].add if pending >= self.grid else self._ready[settled].discard)(name)
        self._changes += 1

    def ready(self, settled: bool = False) -> list[str]:
        """Sessions the background may read now: a whole chunk pending (with ``settled``, below the
        settled end: what the ration may read), not dropped and unused since."""
        with self._lock:
            return [n for n in self._ready[settled] if not self.residency.awaits_use(n)]

    def lowest_ready_depth(self, settled: bool = False) -> int | None:
        """The shallowest read position among ``ready``'s sessions (None: none), for a round's cheap
        look: kept until a feed or a read changes what is pending. A session dropped meanwhile may
        linger in it, which only makes a look happen, never skips one."""
        with self._lock:
            seen, lowest = self._lowest.get(settled, (-1, None))
            if seen != self._changes:
                depths = [self.residency.counts(n)[1] for n in self.ready(settled)]
                lowest = min(depths) if depths else None
                self._lowest[settled] = (self._changes, lowest)
            return lowest

    def _read_tail(self, name: str, book: Any, tensors: Any, window: Window, upto: int | None = None) -> None:
        """Read the pending tail's whole chunks (below ``upto``) through the normal path before a
        fork: they are on the grid, so they are committed, exact and not wasted, and the fork then
        covers less than one chunk of the session (no attention over a long tail at once)."""
        end = len(book.ids) if upto is None else upto
        while end - book.committed >= self.grid:
            depth, t0 = book.committed, time.time_ns()
            cost = self.reader.read_chunk(book, tensors)
            self.costs.record([depth], cost)
            if self.telemetry is not None:
                self.telemetry.chunk(window, ChunkRead(name, depth, self.grid, cost), book.pending, t0, time.time_ns())
        self._mark(name)

    # ---- asking --------------------------------------------------------------------------

    def ask(self, session: str, question: str | Sequence[int], choices: Sequence[str],
            at: int | None = None) -> Answer:
        """The small model's choice among ``choices`` after the session and the question.

        ``at``: ask as if the session ended at that position (the router's insertion point). It
        must be at or above the committed length: rows below are read already and cannot be
        unread, so a caller that wants a position asks before the reader passes it."""
        t0 = time.perf_counter()
        with self._lock:
            self.residency.check(session)
            tokens = choice_tokens(self.prompter, choices)
            q = question_ids(self.prompter, self.reader.vocab_size, question)
            with self.residency.using(session) as (book, tensors):
                _holds_ids(session, book.ids)
                if at is not None and not book.committed <= at <= len(book.ids):
                    raise BadInput(f"cannot ask at {at}: the session has {len(book.ids)} ids and "
                                   f"{book.committed} are read already")
                behind = (len(book.ids) if at is None else at) - book.committed
                self._read_tail(session, book, tensors, "ask", upto=at)
                logits = self.reader.fork_logits(book, tensors, q, upto=at)
                probs = self.reader.probabilities(logits, tokens)
        best = max(range(len(choices)), key=lambda i: probs[i])
        took = time.perf_counter() - t0
        if self.telemetry is not None:
            self.telemetry.count("questions")
            self.telemetry.observe("question_seconds", took)
        return Answer(session=session, label=choices[best], probs=dict(zip(choices, probs, strict=True)),
                      behind=behind, latency_ms=took * 1e3)

    def decode(self, session: str, prompt: str | Sequence[int], max_new: int = 64,
               at: int | None = None) -> list[int]:
        """Greedy decoding on top of the session (the narrator's fork); the session is untouched but
        for the pending tail's whole chunks, read first as ``ask`` does. ``at``: as if the session
        ended there (the end of a thought), as long as the reader has not committed rows past it."""
        if max_new <= 0:
            raise BadInput("max_new must be positive")
        with self._lock:
            self.residency.check(session)
            ids = question_ids(self.prompter, self.reader.vocab_size, prompt)
            with self.residency.using(session) as (book, tensors):
                _holds_ids(session, book.ids)
                if at is not None and not book.committed <= at <= len(book.ids):
                    raise BadInput(f"cannot decode at {at}: the session has {len(book.ids)} ids and "
                                   f"{book.committed} are read already")
                self._read_tail(session, book, tensors, "narrator", upto=at)
                return self.reader.fork_decode(book, tensors, ids, max_new, self.prompter.stop_ids, upto=at)

    # ---- state -------------------------------------------------------------------------

    def export_state(self, session: str) -> dict[str, Any]:
        with self.residency.using(session) as (_, tensors):
            return self.reader.export(tensors)

    def fresh_state(self, ids: Sequence[int]) -> dict[str, Any]:
        return self.reader.fresh(checked(ids, self.reader.vocab_size, "ids"))

    def forget(self, session: str) -> None:
        """Drop everything of ``session``: its resident state, its parked file, its bookkeeping."""
        with self._lock:
            self.residency.forget(session)
            self._forgotten(session)

    def sessions(self) -> list[str]:
        return self.residency.names()

    def session_status(self, session: str) -> SessionStatus | None:
        """One session's line of ``status()``; None for a session never fed. Cheap enough to ask
        on every decode round: it touches only that session."""
        with self._lock:
            if session not in self.residency.names():
                return None
            p = self.residency.position(session)
            return SessionStatus(
                where=self.residency.where(session), ids=p.length, committed=p.committed, backlog=p.pending,
                turns=p.turns, checkpoints=list(p.checkpoints), rollbacks=p.rollbacks, reread=p.reread,
                bytes_resident=self.residency.bytes_resident(session),
                bytes_on_disk=self.residency.bytes_on_disk(session), last_used=p.last_used)

    def status(self) -> ShadowStatus:
        with self._lock:
            b = self.residency.bounds()
            store = StoreStatus(grid=self.grid, resident_bytes=self.resident_bytes(), cap_bytes=self.cap_bytes,
                                disk=self.disk is not None, park_failures=self.residency.park_failures,
                                last_store_error=self.residency.last_store_error, dropped_bytes=b.dropped_bytes,
                                rss_bytes=b.rss_bytes, max_sessions=b.max_sessions, forgotten=b.forgotten,
                                last_forgotten=b.last_forgotten, sharing=self.sharing(), lost=self.residency.lost,
                                fingerprint=self.reader.fingerprint)
            lines = {name: self.session_status(name) for name in self.residency.names()}
            return ShadowStatus(store, {name: line for name, line in lines.items() if line is not None})

    def sharing(self) -> Sharing | None:
        """The shared store's state (STORE), None without one."""
        leases = self.residency.leases
        return leases.sharing() if leases is not None else None

    def close(self) -> None:
        """A planned stop: after the call in flight (the lock), park every resident session."""
        self.residency.close()
