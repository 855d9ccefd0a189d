"""The router's class question in shadow mode (a profile's ``shadow.router: shadow``).

For a turn whose prompt has at least ``router_min_tokens`` ids, the host hands over the question its
router asks Qwen (text or ids, the class letters, and the router's own answer). The question waits
until the reader reaches the turn's insertion point (the prompt's last ``<|im_end|>``, rounded down
to the grid), and the idle window then asks it. Each answer is journaled, one JSON line in
``DIR/shadow.jsonl``: the label, its probability, the router's label and whether they agree, how far
behind the shadow was when the turn began, and the lag from the turn's start to the answer. Nothing of
the turn changes. Each line also carries what ``shadow router-eval`` needs to ask again offline: the
question and its choices, whether the host's router decided the class on that turn (``fresh``), the
grid, and the prompt's ids up to the insertion point, as the ids kept from the session's previous line
plus the new ones, with their SHA-256 (``shadow/data/router_journal.schema.json`` describes a line).

The question forks at the insertion point itself (``Shadow.ask(..., at=insertion)``) as long as the
reader has not committed rows past it; when it has (a long idle window ran on), the fork starts from
the committed rows and ``extra_ids`` in the journal says how many ids past the insertion point the
answer has seen (``at_insertion`` is false then).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from shadow.core.errors import ShadowError
from shadow.core.protocols import Asker
from shadow.core.scheduling import NullTelemetry, Telemetry, ask_span
from shadow.core.session import first_difference, grid_line_at_or_below

from .records import RouterRecord, RouterStatus
from .tokens import IM_END


def insertion_point(prompt: Sequence[int]) -> int:
    """Just past the prompt's last ``<|im_end|>`` (the end of the last message before the generation
    prompt); the prompt's length when it has none."""
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == IM_END:
            return i + 1
    return len(prompt)


@dataclass
class RouterQuestion:
    session: str
    request_id: str
    question: str | list[int]
    choices: list[str]
    router_label: str | None
    insertion: int
    behind_at_start: int
    asked_at: float
    prompt_len: int = 0
    fresh: bool | None = None  # the host's router decided the class on this turn (False: carried forward)
    ids: array[int] = field(default_factory=lambda: array("I"))  # the prompt up to the insertion point


def ids_sha256(ids: Sequence[int]) -> str:
    """SHA-256 (hex) of ``ids`` as little-endian uint32: the journal's check on the ids it holds."""
    packed = ids if isinstance(ids, array) and ids.typecode == "I" else array("I", ids)
    assert packed.itemsize == 4
    if sys.byteorder != "little":
        packed = array("I", packed)
        packed.byteswap()
    return hashlib.sha256(packed.tobytes()).hexdigest()


@dataclass
class RouterShadow:
    journal: Path | None = None
    clock: Callable[[], float] = time.monotonic
    telemetry: Telemetry = field(default_factory=NullTelemetry)
    keep: int = 32
    # Sessions whose last journaled ids are kept to write the next line's as a difference; past it the
    # least recently journaled one is forgotten and its next line holds all its ids again.
    bases: int = 64

    def __post_init__(self) -> None:
        self._mu = threading.Lock()
        self._journal_mu = threading.Lock()
        self._base: OrderedDict[str, array[int]] = OrderedDict()
        self._waiting: list[RouterQuestion] = []
        self.asked = 0
        self.agreed = 0
        self.compared = 0
        self.failed = 0
        self.last: deque[RouterRecord] = deque(maxlen=self.keep)

    def enqueue(self, q: RouterQuestion) -> None:
        with self._mu:
            self._waiting.append(q)

    def _ready(self, shadow: Asker) -> list[RouterQuestion]:
        committed = shadow.committed_rows()
        grid = shadow.grid
        with self._mu:
            return [q for q in self._waiting
                    if committed.get(q.session, -1) >= grid_line_at_or_below(q.insertion, grid)]

    def pending(self, shadow: Asker) -> bool:
        return bool(self._ready(shadow))

    def answer(self, shadow: Asker, busy: Callable[[], bool]) -> None:
        for q in self._ready(shadow):
            if busy():
                return
            with self._mu:
                if q not in self._waiting:
                    continue
                self._waiting.remove(q)
            self._ask(shadow, q)

    def _ask(self, shadow: Asker, q: RouterQuestion) -> None:
        record = RouterRecord(session=q.session, request_id=q.request_id, router_label=q.router_label,
                              fresh=q.fresh, behind_at_start=q.behind_at_start, insertion=q.insertion,
                              prompt_len=q.prompt_len, grid=shadow.grid, choices=list(q.choices))
        with ask_span(self.telemetry, "router", q.session, q.choices) as span:
            try:
                pos = shadow.position(q.session)
                held = pos.length
                # Exactly at the insertion point while the reader has not passed it; past it, the
                # fork can only start from the committed rows (extra_ids says how far past).
                at = q.insertion if pos.committed <= q.insertion <= held else None
                answer = shadow.ask(q.session, q.question, q.choices, at=at)
            except ShadowError as err:
                self.failed += 1
                record.error = str(err)
                span.failed(err)
            else:
                self.asked += 1
                agree = None if q.router_label is None else answer.label == q.router_label
                if agree is not None:
                    self.compared += 1
                    self.agreed += int(agree)
                record.label, record.probability, record.probs = answer.label, answer.probs[answer.label], answer.probs
                record.agree, record.behind, record.at_insertion = agree, answer.behind, at is not None
                record.extra_ids = 0 if at is not None else held - q.insertion
                record.lag_s, record.latency_ms = self.clock() - q.asked_at, answer.latency_ms
                span.answered(answer)
        self.last.append(record)
        if self.journal is not None:
            self._write(q, record)

    def _write(self, q: RouterQuestion, record: RouterRecord) -> None:
        assert self.journal is not None
        question = q.question if isinstance(q.question, str) else list(q.question)
        # One writer at a time: a line's kept ids refer to the line before it in the file.
        with self._journal_mu:
            base = self._base.pop(q.session, None)
            keep = first_difference(base, q.ids) if base is not None else 0
            line = {**msgspec.to_builtins(record), "question": question,
                    "ids": {"keep": keep, "add": q.ids[keep:].tolist()}, "ids_sha256": ids_sha256(q.ids)}
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            with self.journal.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
            # only once the line is written: a failed write leaves the next line whole
            self._base[q.session] = q.ids
            while len(self._base) > self.bases:
                self._base.popitem(last=False)

    def status(self) -> RouterStatus:
        with self._mu:
            waiting = len(self._waiting)
        return RouterStatus(asked=self.asked, compared=self.compared, agreed=self.agreed,
                            agreement=self.agreed / self.compared if self.compared else None,
                            failed=self.failed, waiting=waiting,
                            journal=str(self.journal) if self.journal else None, last=list(self.last))
