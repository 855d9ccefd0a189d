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
from dataclasses import dataclass
from typing import Any

from .errors import BadInput, UnknownSession
from .protocols import Prompter, Reader, StateStore
from .residency import Residency
from .session import Position, first_difference

MAX_CHOICES = 26


@dataclass(frozen=True, slots=True)
class Answer:
    label: str
    probs: dict[str, float]
    behind: int  # ids of the session not yet committed when asked (the fork read them)
    lag_ms: float


@dataclass(frozen=True, slots=True)
class ChunkRead:
    session: str
    first_row: int
    rows: int
    cost_s: float


class Shadow:
    """Sessions fed by a host and read on the grid.

    Where each session's state lives (resident, parked, dropped; the cap) is the ``Residency``'s;
    its lock serialises every call here too, so the session a call uses is never evicted under it.
    """

    def __init__(self, reader: Reader, prompter: Prompter, clock: Callable[[], float] = time.monotonic, *,
                 memory: StateStore, disk: StateStore | None = None, cap_bytes: int | None = None,
                 max_sessions: int | None = None) -> None:
        self.reader = reader
        self.prompter = prompter
        self.clock = clock
        self.grid = reader.grid
        self.residency = Residency(reader.grid, reader.new_session, clock, memory=memory, disk=disk,
                                   cap_bytes=cap_bytes, max_sessions=max_sessions)
        self._lock = self.residency.lock
        self._last_cost_s: dict[str, float] = {}  # per session: the estimate of its next chunk
        self.residency.on_forget.append(self._forgotten)

    def _forgotten(self, session: str) -> None:
        self._last_cost_s.pop(session, None)

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
        self.residency.restore(session)

    def park(self, session: str) -> None:
        """Park (or drop) ``session`` now, whatever the cap."""
        self.residency.park(session)

    # ---- feeding -------------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int], what: str, offset: int = 0) -> list[int]:
        """``ids`` as a list of ints in the vocabulary, or BadInput naming the first bad one (its
        index counted from ``offset``). On a request's path: an unsigned array takes ints in
        [0, 2**32) only, at C speed (three times faster than a signed one here), leaving the top."""
        packed = self._packed(ids)
        if packed is None:
            vocab = self.reader.vocab_size
            bad = next(i for i, t in enumerate(ids) if not isinstance(t, int) or not 0 <= t < vocab)
            value = list(ids)[bad]
            if not isinstance(value, int):
                raise BadInput(f"{what}[{offset + bad}] = {value!r} is not a token id")
            raise BadInput(f"{what}[{offset + bad}] = {value} is not a token id in [0, {vocab})")
        return packed.tolist()  # ints, even where bools came in

    def _packed(self, ids: Sequence[int]) -> array[int] | None:
        try:
            packed = array("I", ids)
        except (TypeError, OverflowError):
            return None
        return packed if not packed or max(packed) < self.reader.vocab_size else None

    def accepts(self, ids: Sequence[int]) -> bool:
        """Whether a feed would take ``ids`` as token ids (``_check_ids`` without the message)."""
        return self._packed(ids) is not None

    def feed_prompt(self, session: str, ids: Sequence[int]) -> None:
        """A turn's whole rendered prompt. A prompt that differs from what was read rolls the state
        back to the newest checkpoint at or below the first differing id (or to the start)."""
        prompt = self._checked_prompt(session, ids if isinstance(ids, list) else list(ids))
        if not prompt:
            raise BadInput("empty prompt")
        with self.residency.using(session, create=True) as (book, tensors):
            rollback = book.feed_prompt(prompt)
            if rollback is not None:
                self.reader.roll_back(tensors, rollback.resume_at)
            self.reader.checkpoint_if_due(book, tensors)

    def _checked_prompt(self, session: str, ids: list[int]) -> list[int]:
        """The prompt checked, in time for a request's first token: a turn's prompt repeats most of
        what the session holds, and ids equal to held ones were checked when they came, so only the
        rest is checked (a 15k-id prompt costs about 2 ms to check whole on this path's CPU). The
        held ids are taken for the equal part, so the result holds ints only either way."""
        try:
            book = self.residency.held_book(session)
        except UnknownSession:
            book = None
        same = first_difference(book.ids, ids) if book is not None else 0
        held = book.ids[:same] if book is not None and same else []
        return held + self._check_ids(ids[same:], "prompt", offset=same)

    def feed_output(self, session: str, ids: Sequence[int]) -> None:
        """Qwen's output ids, appended after what the session holds."""
        output = self._check_ids(ids, "output")
        with self._lock:
            book = self.residency.held_book(session)
            if book is not None:
                book.feed_output(output)  # bookkeeping only: no need to bring the state back
                book.last_used = self.clock()
                self.residency.used(session)
                return
        with self.residency.using(session) as (book, _):
            book.feed_output(output)

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

    def backlog(self, session: str) -> int:
        held, committed = self.residency.counts(session)
        return held - committed

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
            self.reader.fresh([0] * self.grid)

    def read(self, session: str | None = None, budget_s: float | None = None,
             max_chunks: int | None = None) -> list[ChunkRead]:
        """Read whole chunks now: of ``session`` (a use), or of every session with a whole chunk
        pending but those dropped and not used since, resident ones first, longest backlog first.
        With a budget, a chunk starts only if its estimated cost (the session's last chunk's) still fits."""
        spent = 0.0
        done: list[ChunkRead] = []
        with self._lock:
            if session is not None:
                self.residency.check(session)
                names = [session]
            else:
                pending = {n: b for n, b in self.readable_backlogs().items() if b >= self.grid}
                names = sorted(pending, key=lambda n: (self.residency.where(n) != "resident", -pending[n]))
            for name in names:
                if self.backlog(name) < self.grid or (session is None and self.residency.awaits_use(name)):
                    continue  # (dropped meanwhile, to make room for the one read before it)
                with self.residency.using(name, background=session is None) as (book, tensors):
                    while book.pending >= self.grid:
                        if max_chunks is not None and len(done) >= max_chunks:
                            return done
                        estimate = self._last_cost_s.get(name, 0.0)
                        if budget_s is not None and spent + estimate > budget_s:
                            return done
                        first = book.committed
                        cost = self.reader.read_chunk(book, tensors)
                        self._last_cost_s[name] = cost
                        spent += cost
                        done.append(ChunkRead(name, first, self.grid, cost))
        return done

    def _read_tail(self, name: str, book: Any, tensors: Any, upto: int | None = None) -> None:
        """Read the pending tail's whole chunks (below ``upto``) through the normal path before a
        fork: they are on the grid, so they are committed, exact and not wasted, and the fork then
        covers less than one chunk of the session (no attention over a long tail at once)."""
        end = len(book.ids) if upto is None else upto
        while end - book.committed >= self.grid:
            self._last_cost_s[name] = self.reader.read_chunk(book, tensors)

    # ---- asking --------------------------------------------------------------------------

    def _choice_tokens(self, choices: Sequence[str]) -> list[int]:
        if not choices:
            raise BadInput("choices is empty")
        if len(choices) > MAX_CHOICES:
            raise BadInput(f"{len(choices)} choices; at most {MAX_CHOICES}")
        if len(set(choices)) != len(choices):
            raise BadInput("choices repeat a label")
        tokens = []
        for c in choices:
            t = self.prompter.single_token(c)
            if t is None:
                raise BadInput(f"choice {c!r} is not one token")
            tokens.append(t)
        return tokens

    def _question(self, question: str | Sequence[int]) -> list[int]:
        if isinstance(question, str):
            if not question.strip():
                raise BadInput("empty question")
            return self.prompter.question_ids(question)
        ids = self._check_ids(question, "question")
        if not ids:
            raise BadInput("empty question")
        return ids

    def ask(self, session: str, question: str | Sequence[int], choices: Sequence[str],
            at: int | None = None) -> Answer:
        """The small model's choice among ``choices`` after the session and the question.

        ``at``: ask as if the session ended at that position (the router's insertion point). It
        must be at or above the committed length: rows below are read already and cannot be
        unread, so a caller that wants a position asks before the reader passes it."""
        t0 = time.perf_counter()
        with self._lock:
            self.residency.check(session)
            tokens = self._choice_tokens(choices)
            q = self._question(question)
            with self.residency.using(session) as (book, tensors):
                if at is not None and not book.committed <= at <= len(book.ids):
                    raise BadInput(f"cannot ask at {at}: the session has {len(book.ids)} ids and "
                                   f"{book.committed} are read already")
                behind = (len(book.ids) if at is None else at) - book.committed
                self._read_tail(session, book, tensors, upto=at)
                logits = self.reader.fork_logits(book, tensors, q, upto=at)
                probs = self.reader.probabilities(logits, tokens)
        best = max(range(len(choices)), key=lambda i: probs[i])
        return Answer(choices[best], dict(zip(choices, probs, strict=True)), behind,
                      (time.perf_counter() - t0) * 1e3)

    def decode(self, session: str, prompt: str | Sequence[int], max_new: int = 64,
               at: int | None = None) -> list[int]:
        """Greedy decoding on top of the session (the narrator's fork); the session is untouched but
        for the pending tail's whole chunks, read first as ``ask`` does. ``at``: as if the session
        ended there (the end of a thought), as long as the reader has not committed rows past it."""
        if max_new <= 0:
            raise BadInput("max_new must be positive")
        with self._lock:
            self.residency.check(session)
            ids = self._question(prompt)
            with self.residency.using(session) as (book, tensors):
                if at is not None and not book.committed <= at <= len(book.ids):
                    raise BadInput(f"cannot decode at {at}: the session has {len(book.ids)} ids and "
                                   f"{book.committed} are read already")
                self._read_tail(session, book, tensors, upto=at)
                return self.reader.fork_decode(book, tensors, ids, max_new, self.prompter.stop_ids, upto=at)

    # ---- state -------------------------------------------------------------------------

    def export_state(self, session: str) -> dict[str, Any]:
        with self.residency.using(session) as (_, tensors):
            return self.reader.export(tensors)

    def fresh_state(self, ids: Sequence[int]) -> dict[str, Any]:
        return self.reader.fresh(self._check_ids(ids, "ids"))

    def forget(self, session: str) -> None:
        """Drop everything of ``session``: its resident state, its parked file, its bookkeeping."""
        with self._lock:
            self.residency.forget(session)
            self._last_cost_s.pop(session, None)

    def sessions(self) -> list[str]:
        return self.residency.names()

    def session_status(self, session: str) -> dict[str, Any] | None:
        """One session's line of ``status()``; None for a session never fed. Cheap enough to ask
        on every decode round: it touches only that session."""
        with self._lock:
            if session not in self.residency.names():
                return None
            p = self.residency.position(session)
            return {
                "where": self.residency.where(session),
                "ids": p.length,
                "committed": p.committed,
                "backlog": p.pending,
                "turns": p.turns,
                "checkpoints": list(p.checkpoints),
                "rollbacks": p.rollbacks,
                "reread": p.reread,
                "bytes_resident": self.residency.bytes_resident(session),
                "bytes_on_disk": self.residency.bytes_on_disk(session),
                "last_used": p.last_used,
            }

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "grid": self.grid,
                "resident_bytes": self.resident_bytes(),
                "cap_bytes": self.cap_bytes,
                "disk": self.disk is not None,
                "park_failures": self.residency.park_failures,
                "last_store_error": self.residency.last_store_error,
                **self.residency.bounds(),
                "sessions": {name: self.session_status(name) for name in self.residency.names()},
            }

    def close(self) -> None:
        """A planned stop: after the call in flight (the lock), park every resident session."""
        self.residency.close()
