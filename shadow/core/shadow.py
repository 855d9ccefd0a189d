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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import BadInput, UnknownSession
from .protocols import Prompter, Reader
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
class _Session:
    book: SessionBook
    tensors: Any
    last_cost_s: float | None = None


class Shadow:
    def __init__(self, reader: Reader, prompter: Prompter, clock: Callable[[], float] = time.monotonic) -> None:
        self.reader = reader
        self.prompter = prompter
        self.clock = clock
        self.grid = reader.grid
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.RLock()

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

    def _session(self, session: str) -> _Session:
        try:
            return self._sessions[session]
        except KeyError:
            raise UnknownSession(f"unknown session {session!r}") from None

    def feed_prompt(self, session: str, ids: Sequence[int]) -> None:
        """A turn's whole rendered prompt. A prompt that differs from what was read rolls the state
        back to the newest checkpoint at or below the first differing id (or to the start)."""
        prompt = self._check_ids(ids, "prompt")
        if not prompt:
            raise BadInput("empty prompt")
        with self._lock:
            s = self._sessions.get(session)
            if s is None:
                s = self._sessions[session] = _Session(SessionBook(self.grid), self.reader.new_session())
            rollback = s.book.feed_prompt(prompt)
            if rollback is not None:
                self.reader.roll_back(s.tensors, rollback.resume_at)
            self.reader.checkpoint_if_due(s.book, s.tensors)
            s.book.last_used = self.clock()

    def feed_output(self, session: str, ids: Sequence[int]) -> None:
        """Qwen's output ids, appended after what the session holds."""
        output = self._check_ids(ids, "output")
        with self._lock:
            s = self._session(session)
            s.book.feed_output(output)
            s.book.last_used = self.clock()

    # ---- reading -------------------------------------------------------------------------

    def read(self, session: str | None = None, budget_s: float | None = None,
             max_chunks: int | None = None) -> list[ChunkRead]:
        """Read whole chunks now: of ``session``, or of every session, longest backlog first.
        With a budget, a chunk starts only if its estimated cost (the last chunk's) still fits."""
        spent = 0.0
        done: list[ChunkRead] = []
        with self._lock:
            names = [session] if session is not None else sorted(
                self._sessions, key=lambda n: -self._sessions[n].book.pending)
            for name in names:
                s = self._session(name)
                while s.book.pending >= self.grid:
                    if max_chunks is not None and len(done) >= max_chunks:
                        return done
                    estimate = s.last_cost_s or 0.0
                    if budget_s is not None and spent + estimate > budget_s:
                        return done
                    first = s.book.committed
                    cost = self.reader.read_chunk(s.book, s.tensors)
                    s.last_cost_s = cost
                    s.book.last_used = self.clock()
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

    def ask(self, session: str, question: str | Sequence[int], choices: Sequence[str]) -> Answer:
        """The small model's choice among ``choices`` after the whole session and the question."""
        t0 = time.perf_counter()
        with self._lock:
            s = self._session(session)
            tokens = self._choice_tokens(choices)
            q = self._question(question)
            behind = s.book.pending
            logits = self.reader.fork_logits(s.book, s.tensors, q)
            probs = self.reader.probabilities(logits, tokens)
            s.book.last_used = self.clock()
        best = max(range(len(choices)), key=lambda i: probs[i])
        return Answer(choices[best], dict(zip(choices, probs, strict=True)), behind,
                      (time.perf_counter() - t0) * 1e3)

    def decode(self, session: str, prompt: str | Sequence[int], max_new: int = 64) -> list[int]:
        """Greedy decoding on top of the session (the narrator's fork); the session is untouched."""
        if max_new <= 0:
            raise BadInput("max_new must be positive")
        with self._lock:
            s = self._session(session)
            ids = self._question(prompt)
            return self.reader.fork_decode(s.book, s.tensors, ids, max_new, self.prompter.stop_ids)

    # ---- state -------------------------------------------------------------------------

    def export_state(self, session: str) -> dict[str, Any]:
        with self._lock:
            return self.reader.export(self._session(session).tensors)

    def fresh_state(self, ids: Sequence[int]) -> dict[str, Any]:
        return self.reader.fresh(self._check_ids(ids, "ids"))

    def book(self, session: str) -> SessionBook:
        return self._session(session).book

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "grid": self.grid,
                "sessions": {
                    name: {
                        "ids": len(s.book.ids),
                        "committed": s.book.committed,
                        "backlog": s.book.pending,
                        "turns": s.book.turns,
                        "checkpoints": list(s.book.checkpoints),
                        "rollbacks": s.book.rollbacks,
                        "reread": s.book.reread,
                        "bytes": s.tensors.nbytes(),
                        "last_used": s.book.last_used,
                    }
                    for name, s in self._sessions.items()
                },
            }

    def close(self) -> None:
        """A planned stop. (Parking resident sessions on disk comes with the state stores.)"""
        with self._lock:
            self._sessions.clear()
