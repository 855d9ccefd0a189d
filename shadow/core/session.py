"""One session's bookkeeping on the grid: what was fed, what is committed, where to roll back.

No tensors here: the reader keeps the state these numbers describe.

- ``ids``: every id the session holds, the latest prompt then Qwen's output so far, as an int32
  ``array`` (``array("i")``): a book lives as long as its session, and a list's int objects, one
  per id, pinned CPython's small-object arenas among each request's short-lived ints (the soaks:
  RSS +40 MiB/h, traced bytes flat). Any copy of a session's ids kept as long (the proxy's table)
  is held so too, and compared array to array (``first_difference``): an array never equals a list.
- ``committed``: rows whose state is read; always a multiple of ``grid``.
- the pending tail: ``ids[committed:]``; whole chunks of it are read as the scheduler allows.
- checkpoints: positions where the reader keeps a copy of the conv and recurrent state. One per
  turn, at the turn's *checkpoint line*: the last grid line at or below what the next prompt is
  expected to keep of it, its end less the generation prompt's ``<think>\n`` (``GENERATION_TAIL``
  ids; see the settled end). A line above ``committed`` is *wanted*: the reader copies the state
  when it commits that line. At most ``MAX_CHECKPOINTS``: the oldest is kept (the first turn's
  line, as a rule: agents that compact their history keep the first prompt, the system prompt and
  the task, and rewrite what follows it), then the newest; the second oldest is dropped.
- the settled end (``settled_end``): where the ids the next prompt is expected to keep end. Agents'
  templates mostly re-render Qwen's output: in the 35 real timelines, 1,690 of 1,790 later prompts
  kept the previous one but its last one or two ids (the generation prompt's ``<think>\n``) and
  none of the output (76 kept it whole). So it is the latest prompt's checkpoint line, unless this
  session's prompts kept the output before it more often than not (an agent whose template keeps
  it): then every id held. The ration reads only below it; what lies past it is read by the idle
  window, or by a question, which reads what it asks about.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

MAX_CHECKPOINTS = 6
GENERATION_TAIL = 2  # ids at a prompt's end that the next prompt drops: ``<think>`` and ``\n``
T = TypeVar("T")


def grid_line_at_or_below(position: int, grid: int) -> int:
    return position // grid * grid


def checkpoint_line(prompt_len: int, grid: int) -> int:
    """A turn's checkpoint line (the module's docstring): a prompt of 1,025 ids keeps its
    checkpoint at 512, since the next prompt, keeping 1,023 of them, would cut below 1,024."""
    return grid_line_at_or_below(max(0, prompt_len - GENERATION_TAIL), grid)


def first_difference(a: Sequence[T], b: Sequence[T]) -> int:
    r"""The first index where ``a`` and ``b`` differ, or the shorter length when one is a prefix: the
    length of their common prefix. Both of one kind (lists, ``array``\ s of one typecode, strings):
    slices are compared whole, at C speed. The one such count in the project (the facade's divergence
    check, the router's journal, the transcripts' reuse)."""
    n = min(len(a), len(b))
    # the usual case on a request's path (one extends the other), in one C-speed compare
    if (a if n == len(a) else a[:n]) == (b if n == len(b) else b[:n]):
        return n
    block = 4096
    start = 0
    while start < n and a[start:start + block] == b[start:start + block]:  # C-speed compare per block
        start += block
    for i in range(start, min(start + block, n)):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True, slots=True)
class Rollback:
    """What a divergent prompt did: ids agreed up to ``diverged_at``; state resumes at ``resume_at``."""

    diverged_at: int
    resume_at: int
    reread: int  # committed rows that must be read again: old committed - resume_at


@dataclass(frozen=True, slots=True)
class Position:
    """A read-only view of one session's bookkeeping: where its reader stands, nothing to mutate."""

    length: int = 0  # ids held
    committed: int = 0
    turns: int = 0
    checkpoints: tuple[int, ...] = ()
    rollbacks: int = 0
    reread: int = 0
    last_used: float = 0.0
    settled: int = 0  # ``SessionBook.settled_end``

    @property
    def pending(self) -> int:
        return self.length - self.committed

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Position:
        """From ``SessionBook.meta()`` (as a parked file keeps it)."""
        held = int(meta.get("n_ids", 0))
        return cls(held, int(meta.get("committed", 0)), int(meta.get("turns", 0)), tuple(meta.get("checkpoints", ())),
                   int(meta.get("rollbacks", 0)), int(meta.get("reread", 0)), float(meta.get("last_used", 0.0)),
                   settled_end(meta.get("prompt_lines", ()), held, meta.get("outputs_kept", [0, 0])))


def settled_end(prompt_lines: Sequence[int], held: int, outputs_kept: Sequence[int] = (0, 0)) -> int:
    """``SessionBook.settled_end`` from a book's fields: the latest prompt's line, or every id held
    where no prompt was fed (a book made from ids alone) or the prompts mostly kept the output."""
    kept, dropped = outputs_kept
    return min(prompt_lines[-1], held) if prompt_lines and kept <= dropped else held


def _int(meta: dict[str, Any], key: str, low: int = 0, high: int | None = None) -> int:
    v = meta.get(key)
    if type(v) is not int or v < low or (high is not None and v > high):
        raise ValueError(f"book {key} is {v!r}: not an int in [{low}, {'...' if high is None else high}]")
    return v


def _lines(meta: dict[str, Any], key: str, grid: int, low: int, high: int, *, strict: bool = True,
           most: int | None = MAX_CHECKPOINTS) -> list[int]:
    v = meta.get(key)
    if not isinstance(v, list) or (most is not None and len(v) > most) or any(type(x) is not int for x in v):
        raise ValueError(f"book {key} is {v!r}: not a list of {'' if most is None else f'at most {most} '}ints")
    bad = [x for x in v if x % grid or not low <= x <= high]
    if bad:
        raise ValueError(f"book {key} holds {bad}: not grid lines ({grid}) in [{low}, {high}]")
    if strict and v != sorted(set(v)):
        raise ValueError(f"book {key} is {v}: not ascending without repeats")
    return v


def checked_meta(raw: Any, grid: int) -> dict[str, Any]:
    """``SessionBook.meta()`` as a parked file gives it back, every field checked against the
    others and the reader's ``grid``: a file that passes cannot fail a later read. Raises
    ValueError naming the field."""
    if not isinstance(raw, dict):
        raise ValueError(f"book is {type(raw).__name__}, not an object")
    want = {*SessionBook._META, "n_ids"}
    meta: dict[str, Any] = {**SessionBook._ADDED_LATER, **raw}  # parked before these fields: as a book never given them
    if set(meta) != want:
        raise ValueError(f"book fields differ: missing {sorted(want - set(meta))}, unknown {sorted(set(meta) - want)}")
    if meta["grid"] != grid or type(meta["grid"]) is not int:
        raise ValueError(f"book grid is {meta['grid']!r}, this reader's is {grid}")
    n = _int(meta, "n_ids")
    committed = _int(meta, "committed", 0, n)
    if committed % grid:
        raise ValueError(f"book committed is {committed}: not a grid line ({grid})")
    for key in ("turns", "rollbacks", "reread"):
        _int(meta, key)
    last = meta["last_used"]
    if type(last) not in (int, float) or not math.isfinite(last):
        raise ValueError(f"book last_used is {last!r}: not a finite number")
    _lines(meta, "checkpoints", grid, grid, committed)
    _lines(meta, "wanted", grid, grid, n, most=None)  # one per turn fed while the reader lags
    _lines(meta, "prompt_lines", grid, 0, n, strict=False)
    _int(meta, "prompt_len")
    kept = meta["outputs_kept"]
    if not isinstance(kept, list) or len(kept) != 2 or any(type(x) is not int or x < 0 for x in kept):
        raise ValueError(f"book outputs_kept is {kept!r}: not two counts")
    return meta


def int32_ids(ids: Sequence[int]) -> array[int]:
    """``ids`` as a new ``array("i")`` (the typecode every held copy has, so ``first_difference``
    compares them whole), or ValueError: the array is made before anything changes."""
    try:
        return array("i", ids)
    except (TypeError, OverflowError) as e:  # a float, a str, an int past int32
        raise ValueError(f"ids must be int32 token ids: {e}") from None


def int32_or_none(ids: Sequence[int]) -> array[int] | None:
    """``int32_ids`` with None for ids it refuses (a caller that names the bad id itself)."""
    try:
        return array("i", ids)
    except (TypeError, OverflowError):
        return None


@dataclass
class SessionBook:
    grid: int
    ids: array[int] = field(default_factory=lambda: array("i"))
    committed: int = 0
    checkpoints: list[int] = field(default_factory=list)  # positions held, ascending, all <= committed
    wanted: list[int] = field(default_factory=list)  # checkpoint lines not yet reached
    turns: int = 0
    rollbacks: int = 0
    reread: int = 0
    last_used: float = 0.0
    prompt_lines: list[int] = field(default_factory=list)  # the last turns' checkpoint lines
    prompt_len: int = 0  # the latest prompt's
    # later prompts that kept the output before them whole, and those that did not (``settled_end``)
    outputs_kept: list[int] = field(default_factory=lambda: [0, 0])

    _META: ClassVar[tuple[str, ...]] = ("grid", "committed", "checkpoints", "wanted", "turns", "rollbacks",
                                        "reread", "last_used", "prompt_lines", "prompt_len", "outputs_kept")
    _ADDED_LATER: ClassVar[dict[str, Any]] = {"prompt_len": 0, "outputs_kept": [0, 0]}  # fields added later

    # What a held id costs the host: its 4 bytes in the int32 array (no int object). The GB cap
    # counts it, so that the ids of long or many dropped sessions cannot grow unseen.
    ID_BYTES: ClassVar[int] = 4

    def __post_init__(self) -> None:
        # a book made with a list (a fresh prefill's, a test's) holds int32 all the same
        if not (isinstance(self.ids, array) and self.ids.typecode == "i"):
            self.ids = int32_ids(self.ids)

    def ids_nbytes(self) -> int:
        return len(self.ids) * self.ID_BYTES

    def meta(self) -> dict[str, Any]:
        """Everything but the ids, JSON-ready (the ids travel as a tensor beside it)."""
        return {**{k: getattr(self, k) for k in self._META}, "n_ids": len(self.ids)}

    def position(self) -> Position:
        return Position(len(self.ids), self.committed, self.turns, tuple(self.checkpoints), self.rollbacks,
                        self.reread, self.last_used, self.settled_end)

    @classmethod
    def from_meta(cls, meta: dict[str, Any], ids: Sequence[int]) -> SessionBook:
        book = cls(grid=int(meta["grid"]), ids=int32_ids(ids))
        for k in cls._META[1:]:
            v = meta.get(k, cls._ADDED_LATER.get(k))
            setattr(book, k, list(v) if isinstance(v, list) else v)  # never the defaults' own list
        return book

    def reset_for_reread(self) -> None:
        """The state is gone (dropped, or its parked file refused): read the same ids again from 0,
        taking checkpoints again at the recent turns' lines."""
        self.reread += self.committed
        self.committed = 0
        self.checkpoints = []
        self.wanted = sorted({line for line in self.prompt_lines if 0 < line <= len(self.ids)})

    @property
    def pending(self) -> int:
        return len(self.ids) - self.committed

    @property
    def settled_end(self) -> int:
        """Where the ids the next prompt is expected to keep end (the module's docstring says why)."""
        return settled_end(self.prompt_lines, len(self.ids), self.outputs_kept)

    @property
    def whole_chunks_pending(self) -> int:
        return self.pending // self.grid

    def feed_prompt(self, prompt: Sequence[int]) -> Rollback | None:
        """Take a turn's whole prompt. Returns the rollback it forces, if any; the caller must then
        restore the state at ``resume_at`` (a held checkpoint, or the empty state at 0)."""
        if not prompt:
            raise ValueError("empty prompt")
        new = int32_ids(prompt)  # array against array: an array never equals a list
        cut = first_difference(self.ids, new)
        rollback = None
        if cut < len(self.ids):  # the prompt does not extend what was read
            if cut < self.committed:
                resume = max((c for c in self.checkpoints if c <= cut), default=0)
                rollback = Rollback(cut, resume, self.committed - resume)
                self.committed = resume
                self.checkpoints = [c for c in self.checkpoints if c <= resume]
                self.rollbacks += 1
                self.reread += rollback.reread
            self.wanted = [w for w in self.wanted if w <= cut]
        if len(self.ids) > self.prompt_len > 0:  # the turn before had output: did this prompt keep it?
            self.outputs_kept[0 if cut >= len(self.ids) else 1] += 1
        self.ids = new
        self.prompt_len = len(new)
        self.turns += 1
        line = checkpoint_line(len(new), self.grid)
        self.prompt_lines = [*[p for p in self.prompt_lines if p <= cut and p != line], line][-MAX_CHECKPOINTS:]
        if line > 0 and line not in self.checkpoints and line not in self.wanted:
            self.wanted.append(line)
            self.wanted.sort()
        return rollback

    def feed_output(self, output: Sequence[int]) -> None:
        self.ids.extend(int32_ids(output))  # whole or not at all: extending from a list stops at a bad id

    def longest_span(self, sizes: Sequence[int], most: int) -> int:
        """The largest of ``sizes`` (or 1) up to ``most`` chunks, all pending, with no wanted
        checkpoint line strictly inside: the reader copies the state at a line, so a span may only end there."""
        start, pending = self.committed, self.pending // self.grid
        return max((k for k in sizes if k <= min(most, pending)
                    and not any(start < w < start + k * self.grid for w in self.wanted)), default=1)

    def checkpoint_due(self) -> bool:
        """Whether the state at ``committed`` is a wanted checkpoint (the reader then keeps a copy)."""
        return self.committed in self.wanted

    def took_checkpoint(self) -> int | None:
        """Record the copy at ``committed``; returns the position of a checkpoint to drop, if any:
        past ``MAX_CHECKPOINTS``, the second oldest (the oldest outlives compactions)."""
        self.wanted.remove(self.committed)
        self.checkpoints.append(self.committed)
        self.checkpoints.sort()
        if len(self.checkpoints) > MAX_CHECKPOINTS:
            return self.checkpoints.pop(1)
        return None

    def committed_chunk(self) -> None:
        self.committed += self.grid
