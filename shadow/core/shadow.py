"""The facade: sessions fed by a host, read on the grid, asked about. Torch-free; the tensor work is
the ``Reader``'s, the text work the ``Prompter``'s.

Questions given as text are rendered as one user turn with the Qwen3.5 template, thinking off:

    <|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n

appended after the session's ids (committed rows, then the pending tail), so the next token is
where the answer's letter goes. Each choice is a label that is one token (``A``, ``B``, ...); the
answer is the softmax over those tokens' logits from that one forward.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .errors import BadInput, StoreError, UnknownSession
from .protocols import Prompter, Reader, StateStore
from .session import SessionBook

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


@dataclass
class _Entry:
    where: str  # "resident", "parked" or "dropped"
    book: SessionBook | None  # None: parked by an earlier process; the book is in its file
    last_cost_s: float | None = None


class Shadow:
    """Sessions fed by a host and read on the grid.

    Resident state lives in ``memory``; past ``cap_bytes`` (counted from the tensors held, KV
    capacity and checkpoints included) the least recently used session not in use is parked in
    ``disk``, or dropped and later read again from the start when there is no disk or the write
    fails. A parked session comes back on its next use. One lock serialises every call, so the
    session a call uses is never evicted under it; a session larger than the cap is resident
    while in use and parked as soon as the call ends.
    """

    def __init__(self, reader: Reader, prompter: Prompter, clock: Callable[[], float] = time.monotonic, *,
                 memory: StateStore, disk: StateStore | None = None, cap_bytes: int | None = None) -> None:
        self.reader = reader
        self.prompter = prompter
        self.clock = clock
        self.grid = reader.grid
        self.memory = memory
        self.disk = disk
        self.cap_bytes = cap_bytes
        self.park_failures = 0
        self.last_store_error = ""
        self._known: dict[str, _Entry] = {}
        self._in_use: set[str] = set()
        self._lock = threading.RLock()
        if disk is not None:  # sessions a planned stop parked, found again
            for name in disk.names():
                self._known[name] = _Entry("parked", None)

    # ---- residency -----------------------------------------------------------------------

    def _entry(self, session: str) -> _Entry:
        try:
            return self._known[session]
        except KeyError:
            raise UnknownSession(f"unknown session {session!r}") from None

    @contextmanager
    def _using(self, session: str, create: bool = False) -> Iterator[tuple[SessionBook, Any]]:
        with self._lock:
            entry = self._known.get(session)
            if entry is None:
                if not create:
                    raise UnknownSession(f"unknown session {session!r}")
                entry = self._known[session] = _Entry("resident", SessionBook(self.grid))
            self._in_use.add(session)
            try:
                book, tensors = self._make_resident(session, entry)
                yield book, tensors
                book.last_used = self.clock()
            finally:
                self._in_use.discard(session)
                self._enforce_cap()

    def _make_resident(self, name: str, entry: _Entry) -> tuple[SessionBook, Any]:
        held = self.memory.get(name)
        if held is not None:
            return held
        got = self.disk.get(name) if self.disk is not None and entry.where == "parked" else None
        if got is not None:
            parked_book, tensors = got
            book = entry.book if entry.book is not None else parked_book
        else:
            book = entry.book if entry.book is not None else SessionBook(self.grid)
            if book.committed:  # dropped, or its parked file was refused: read the same ids again
                book.reset_for_reread()
            tensors = self.reader.new_session()
        entry.book, entry.where = book, "resident"
        self.memory.put(name, book, tensors)
        return book, tensors

    def _evict(self, name: str) -> None:
        held = self.memory.get(name)
        if held is None:
            return
        book, tensors = held
        entry = self._known[name]
        self.memory.remove(name)
        if self.disk is not None:
            try:
                self.disk.put(name, book, tensors)
                entry.where = "parked"
                return
            except StoreError as err:
                self.park_failures += 1
                self.last_store_error = str(err)
        book.reset_for_reread()
        entry.where = "dropped"

    def resident_bytes(self) -> int:
        return sum((self.memory.info(n) or {}).get("bytes", 0) for n in self.memory.names())

    def _enforce_cap(self) -> None:
        if self.cap_bytes is None:
            return
        total = self.resident_bytes()
        def last_used(name: str) -> float:
            book = self._known[name].book
            return book.last_used if book is not None else 0.0

        idle = sorted((n for n in self.memory.names() if n not in self._in_use), key=last_used)
        for name in idle:
            if total <= self.cap_bytes:
                break
            total -= (self.memory.info(name) or {}).get("bytes", 0)
            self._evict(name)

    def restore(self, session: str) -> None:
        """Bring ``session`` back to the device now (from its parked file, or empty to be read again)."""
        with self._using(session):
            pass

    def park(self, session: str) -> None:
        """Park (or drop) ``session`` now, whatever the cap."""
        with self._lock:
            self._entry(session)
            if session in self._in_use:
                raise BadInput(f"session {session!r} is in use")
            self._evict(session)

    # ---- feeding -------------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int], what: str) -> list[int]:
        try:
            packed = array("q", ids)  # C-speed type check: ints only
        except (TypeError, OverflowError):
            bad = next((i for i, t in enumerate(ids) if not isinstance(t, int)), 0)
            raise BadInput(f"{what}[{bad}] = {list(ids)[bad]!r} is not a token id") from None
        vocab = self.reader.vocab_size
        if packed and not (min(packed) >= 0 and max(packed) < vocab):
            bad = next(i for i, t in enumerate(packed) if not 0 <= t < vocab)
            raise BadInput(f"{what}[{bad}] = {packed[bad]} is not a token id in [0, {vocab})")
        return packed.tolist()

    def feed_prompt(self, session: str, ids: Sequence[int]) -> None:
        """A turn's whole rendered prompt. A prompt that differs from what was read rolls the state
        back to the newest checkpoint at or below the first differing id (or to the start)."""
        prompt = self._check_ids(ids, "prompt")
        if not prompt:
            raise BadInput("empty prompt")
        with self._using(session, create=True) as (book, tensors):
            rollback = book.feed_prompt(prompt)
            if rollback is not None:
                self.reader.roll_back(tensors, rollback.resume_at)
            self.reader.checkpoint_if_due(book, tensors)

    def feed_output(self, session: str, ids: Sequence[int]) -> None:
        """Qwen's output ids, appended after what the session holds."""
        output = self._check_ids(ids, "output")
        with self._lock:
            entry = self._entry(session)
            if entry.book is not None and entry.where != "parked":
                entry.book.feed_output(output)  # bookkeeping only: no need to bring the state back
                entry.book.last_used = self.clock()
                return
        with self._using(session) as (book, _):
            book.feed_output(output)

    # ---- reading -------------------------------------------------------------------------

    def _position(self, name: str) -> tuple[int, int]:
        """(committed, ids held) of a known session, without bringing it back to the device."""
        entry = self._known[name]
        if entry.book is not None:
            return entry.book.committed, len(entry.book.ids)
        info = (self.disk.info(name) if self.disk else None) or {}
        return int(info.get("committed", 0)), int(info.get("n_ids", 0))

    def backlog(self, session: str) -> int:
        with self._lock:
            self._entry(session)
            committed, held = self._position(session)
            return held - committed

    def backlogs(self) -> dict[str, int]:
        """Ids not yet committed, per session (resident or parked): what schedulers poll."""
        with self._lock:
            return {name: held - committed for name, (committed, held) in
                    ((n, self._position(n)) for n in self._known)}

    def committed_rows(self) -> dict[str, int]:
        """Rows read, per session (resident or parked)."""
        with self._lock:
            return {name: self._position(name)[0] for name in self._known}

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
        """Read whole chunks now: of ``session``, or of every session with a whole chunk pending,
        resident ones first, longest backlog first. With a budget, a chunk starts only if its
        estimated cost (the session's last chunk's) still fits."""
        spent = 0.0
        done: list[ChunkRead] = []
        with self._lock:
            if session is not None:
                self._entry(session)
                names = [session]
            else:
                pending = {n: b for n, b in self.backlogs().items() if b >= self.grid}
                names = sorted(pending, key=lambda n: (self._known[n].where != "resident", -pending[n]))
            for name in names:
                entry = self._known[name]
                if self.backlog(name) < self.grid:
                    continue
                with self._using(name) as (book, tensors):
                    while book.pending >= self.grid:
                        if max_chunks is not None and len(done) >= max_chunks:
                            return done
                        estimate = entry.last_cost_s or 0.0
                        if budget_s is not None and spent + estimate > budget_s:
                            return done
                        first = book.committed
                        cost = self.reader.read_chunk(book, tensors)
                        entry.last_cost_s = cost
                        spent += cost
                        done.append(ChunkRead(name, first, self.grid, cost))
        return done

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
            self._entry(session)
            tokens = self._choice_tokens(choices)
            q = self._question(question)
            with self._using(session) as (book, tensors):
                if at is not None and not book.committed <= at <= len(book.ids):
                    raise BadInput(f"cannot ask at {at}: the session has {len(book.ids)} ids and "
                                   f"{book.committed} are read already")
                behind = (len(book.ids) if at is None else at) - book.committed
                logits = self.reader.fork_logits(book, tensors, q, upto=at)
                probs = self.reader.probabilities(logits, tokens)
        best = max(range(len(choices)), key=lambda i: probs[i])
        return Answer(choices[best], dict(zip(choices, probs, strict=True)), behind,
                      (time.perf_counter() - t0) * 1e3)

    def decode(self, session: str, prompt: str | Sequence[int], max_new: int = 64) -> list[int]:
        """Greedy decoding on top of the session (the narrator's fork); the session is untouched."""
        if max_new <= 0:
            raise BadInput("max_new must be positive")
        with self._lock:
            self._entry(session)
            ids = self._question(prompt)
            with self._using(session) as (book, tensors):
                return self.reader.fork_decode(book, tensors, ids, max_new, self.prompter.stop_ids)

    # ---- state -------------------------------------------------------------------------

    def export_state(self, session: str) -> dict[str, Any]:
        with self._using(session) as (_, tensors):
            return self.reader.export(tensors)

    def fresh_state(self, ids: Sequence[int]) -> dict[str, Any]:
        return self.reader.fresh(self._check_ids(ids, "ids"))

    def book(self, session: str) -> SessionBook:
        with self._lock:
            entry = self._entry(session)
            if entry.book is None:
                with self._using(session) as (book, _):
                    return book
            return entry.book

    def forget(self, session: str) -> None:
        """Drop everything of ``session``: its resident state, its parked file, its bookkeeping."""
        with self._lock:
            self._entry(session)
            if session in self._in_use:
                raise BadInput(f"session {session!r} is in use")
            self.memory.remove(session)
            if self.disk is not None:
                self.disk.remove(session)
            del self._known[session]

    def sessions(self) -> list[str]:
        with self._lock:
            return list(self._known)

    def session_status(self, session: str) -> dict[str, Any] | None:
        """One session's line of ``status()``; None for a session never fed. Cheap enough to ask
        on every decode round: it touches only that session."""
        with self._lock:
            e = self._known.get(session)
            if e is None:
                return None
            parked = (self.disk.info(session) if self.disk is not None else None) or {}
            resident = self.memory.info(session) or {}
            src: dict[str, Any] = e.book.meta() if e.book is not None else parked
            return {
                "where": e.where,
                "ids": src.get("n_ids", 0),
                "committed": src.get("committed", 0),
                "backlog": src.get("n_ids", 0) - src.get("committed", 0),
                "turns": src.get("turns", 0),
                "checkpoints": list(src.get("checkpoints", [])),
                "rollbacks": src.get("rollbacks", 0),
                "reread": src.get("reread", 0),
                "bytes_resident": resident.get("bytes", 0),
                "bytes_on_disk": parked.get("bytes", 0) if e.where == "parked" else 0,
                "last_used": src.get("last_used", 0.0),
            }

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "grid": self.grid,
                "resident_bytes": self.resident_bytes(),
                "cap_bytes": self.cap_bytes,
                "disk": self.disk is not None,
                "park_failures": self.park_failures,
                "last_store_error": self.last_store_error,
                "sessions": {name: self.session_status(name) for name in self._known},
            }

    def close(self) -> None:
        """A planned stop: after the call in flight (the lock), park every resident session."""
        with self._lock:
            for name in list(self.memory.names()):
                self._evict(name)
