"""One row count's static tensors for the fast path: what a pass's inputs cross into, what the
captured pieces hand to the eager attention and back, and the captured graphs themselves.

A pass of ``n`` rows holds ``sessions`` sessions of ``seg`` rows each: a fork's pass is one
session of ``n`` rows, a batched read ``n / grid`` sessions of ``grid`` rows. Its inputs are
``[ids (n) | start of each session | valid | table | state addresses]`` in one device tensor,
written by one copy from pinned host memory, so they change with no new capture and no fill
launches. ``valid`` counts the real rows of each session (a fork's padding comes after them; a read
has none). A read's pass, captured whole, also takes the table its attention reads
(``AttentionBackend.attend_table``): a row per attention layer and grid chunk, each chunk's start and
split rule and its session's KV addresses; and where each session's conv and recurrent state lie
(``slot_sources``), so that one launch a kind in its graph moves them into the static slots and one
moves them back (``kernels.copy_slots``; zeros: nothing to move).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import kernels
from ..attention import table as attention_table
from ..attention.triton import split_fields
from ..config import Qwen35Config
from ..state import ModelState

# Host staging slots per row count: the host may queue this many passes (a fork's decode) before it
# waits for the oldest one's inputs to have reached the device.
STAGING_SLOTS = 4


@dataclass(eq=False)
class Rows:
    """One row count's static tensors. The attributes a piece sets are the same tensors on every replay."""

    n: int
    seg: int  # rows per session
    io: torch.Tensor
    attn: torch.Tensor  # attention output, written eagerly, read by the next piece
    staging: list[torch.Tensor] = field(default_factory=list)  # pinned host copies of io, used in turn
    staged: list[Any] = field(default_factory=list)  # per slot: the event recorded after its last copy
    turn: int = 0
    h: torch.Tensor | None = None
    delta: torch.Tensor | None = None
    proj: torch.Tensor | None = None
    # q, k, v of each attention layer, kept apart: a captured piece writes its own tensors on every
    # replay, and the eager step after it must read those (not the last piece's), and they must
    # stay allocated so that no later capture reuses their memory
    qkv: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    logits: torch.Tensor | None = None
    # fla's solve buffer for this row count, zeroed once (see ``gdn_fla.chunk_rule_in_place``)
    solve: torch.Tensor | None = None
    graphs: list[Any] = field(default_factory=list)  # one per piece, then (forks) the logits graph
    table_shape: tuple[int, ...] = ()  # (attention layers, entries, fields) of a read's table; () for none
    whole: Any = None  # a read's pass captured as one graph

    @classmethod
    def make(cls, n: int, seg: int, attn: torch.Tensor, device: torch.device,
             table_shape: tuple[int, ...] = ()) -> Rows:
        sessions = n // seg
        table = 1
        for size in table_shape:
            table *= size
        size = n + sessions + 1 + (table if table_shape else 0) + 2 * sessions
        rows = cls(n=n, seg=seg, io=torch.zeros(size, dtype=torch.long, device=device),
                   attn=attn, table_shape=table_shape)
        if device.type == "cuda":
            rows.staging = [torch.empty(rows.io.shape[0], dtype=torch.long, pin_memory=True)
                            for _ in range(STAGING_SLOTS)]
            rows.staged = [torch.cuda.Event() for _ in range(STAGING_SLOTS)]  # type: ignore[no-untyped-call]
        return rows

    @property
    def sessions(self) -> int:
        return self.n // self.seg

    @property
    def ids(self) -> torch.Tensor:
        return self.io[:self.n]

    @property
    def starts(self) -> torch.Tensor:
        return self.io[self.n:self.n + self.sessions]

    @property
    def valid(self) -> torch.Tensor:
        return self.io[self.n + self.sessions:self.n + self.sessions + 1]

    @property
    def _table_end(self) -> int:
        return self.io.shape[0] - 2 * self.sessions

    @property
    def table(self) -> torch.Tensor:
        return self.io[self.n + self.sessions + 1:self._table_end].view(self.table_shape)

    @property
    def slot_sources(self) -> torch.Tensor:
        """[2, sessions]: the address of each session's stacked conv state, then of its recurrent state."""
        return self.io[self._table_end:].view(2, self.sessions)

    def nbytes(self) -> int:
        """Its own bytes (``attn`` and ``solve`` are views of buffers the row counts share)."""
        return self.io.numel() * 8

    def stage(self, ids: torch.Tensor, starts: Sequence[int], valid: int, table: Sequence[int] = (),
              sources: Sequence[int] = ()) -> None:
        """Queue the copy of a pass's inputs to ``io``: one copy from pinned memory (ids already on
        the device, a decode step's argmax, are copied there apart). A slot is written only once
        the device has taken its previous contents. ``sources``: the sessions' state addresses
        (``slot_sources``, flattened), or none (zeros, for a pass that moves no state)."""
        n, s, end = self.n, self.sessions, self._table_end
        if len(table) != end - n - s - 1:
            raise ValueError(f"a pass of {n} rows takes a table of {end - n - s - 1} numbers, got {len(table)}")
        if sources and len(sources) != 2 * s:
            raise ValueError(f"a pass of {s} sessions takes {2 * s} state addresses, got {len(sources)}")
        if not self.staging:  # off CUDA: the copy is synchronous
            self.io[:n].copy_(ids)
            self.io[n:n + s] = torch.tensor(list(starts), dtype=torch.long)
            self.io[n + s] = valid
            self.io[n + s + 1:end] = torch.tensor(list(table), dtype=torch.long)
            self.io[end:] = torch.tensor(list(sources) or [0] * (2 * s), dtype=torch.long)
            return
        slot = self.turn % len(self.staging)
        self.turn += 1
        self.staged[slot].synchronize()  # returns at once for an event never recorded
        host = self.staging[slot]
        view = host.numpy()
        view[n:n + s] = starts
        view[n + s] = valid
        view[n + s + 1:end] = table
        view[end:] = sources or 0
        if ids.is_cuda:
            self.io[:n].copy_(ids)
            self.io[n:].copy_(host[n:], non_blocking=True)
        else:
            view[:n] = ids.numpy()
            self.io.copy_(host, non_blocking=True)
        self.staged[slot].record()


def stacked(views: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tensor that ``views`` are consecutive slices of (``t.unbind(0)``), or None."""
    base = views[0]._base if views else None
    if base is None or not base.is_contiguous() or base.shape[0] != len(views):
        return None
    step = base.stride(0) * base.element_size()
    for i, v in enumerate(views):
        if v.data_ptr() != base.data_ptr() + i * step or v.shape != base.shape[1:]:
            return None
    return base


def read_table(states: Sequence[ModelState], starts: Sequence[int], seg: int, grid: int, layers: int, heads: int,
               like: torch.Tensor, bm: int) -> list[int]:
    """A read's attention table (``AttentionBackend.attend_table``), flattened: a row per attention
    layer and grid chunk, each at its own start, split in row blocks of ``bm`` (``block_rows``).
    Host time the device waits for, so what does not change from one pass to the next (a session's
    KV addresses, checked) is kept with the session (``ModelState.memo``), as the slots' addresses
    are (the host time it saves: benchmarks/README.md, ``read_host``)."""
    kv_heads = like.shape[1]
    chunks = [[split_fields(at, grid, heads, kv_heads, bm) for at in range(start, start + seg, grid)]
              for start in starts]
    held = [s.memo("kv", s.k + s.v, functools.partial(_kv_addresses, s)) for s in states]
    for (rows, _), start in zip(held, starts, strict=True):
        if rows < start + seg:  # reserve makes room first: a buffer short of it is a broken state
            raise ValueError(f"a session's KV buffers hold {rows} rows, its chunk needs {start + seg}")
    table: list[int] = []
    for i in range(layers):
        for (_, addresses), fields in zip(held, chunks, strict=True):
            for f in fields:
                table += f
                table += addresses[i]
    return table


def _kv_addresses(state: ModelState) -> tuple[int, list[tuple[int, int]]]:
    """The rows every KV buffer of ``state`` holds, and each layer's (K, V) addresses, checked as a
    table entry needs them."""
    for k, v in zip(state.k, state.v, strict=True):
        attention_table.check_kv(k, v, 0)
    pairs = [(k.data_ptr(), v.data_ptr()) for k, v in zip(state.k, state.v, strict=True)]
    return min(t.shape[0] for t in state.k + state.v), pairs


class Staging:
    """Each row count's ``Rows``, made on first use and kept, and the scratch buffers every row count
    shares (one pass runs at a time)."""

    def __init__(self, cfg: Qwen35Config, grid: int, n_attn: int, device: torch.device, dtype: torch.dtype) -> None:
        self.cfg, self.grid, self.n_attn, self.device, self.dtype = cfg, grid, n_attn, device, dtype
        self.rows: dict[tuple[int, int, bool], Rows] = {}  # by (rows, rows a session, a read's)
        self.scratch: dict[str, torch.Tensor] = {}  # by kind (``shared``)

    def get(self, n: int, seg: int, read: bool, whole_forks: bool, chunked: bool) -> Rows:
        """The ``Rows`` of ``n`` rows, ``seg`` a session, a read's or a fork's: with a table where the
        pass reads its attention from one (a read's, or a fork's with ``whole_forks``), and fla's solve
        buffer where it takes fla's chunked kernels (``chunked``)."""
        rows = self.rows.get((n, seg, read))
        if rows is None:
            cfg = self.cfg
            entries = n // self.grid if read else 1 if whole_forks else 0
            table = (self.n_attn, entries, attention_table.FIELDS) if entries else ()
            attn = self.shared("attn", n * cfg.num_attention_heads * cfg.head_dim).view(n, -1, cfg.head_dim)
            rows = Rows.make(n, seg, attn, self.device, table)
            if chunked:  # the solve writes the same blocks of a row at any row count
                rows.solve = self.shared("solve", n * cfg.linear_num_value_heads * kernels.FLA_CHUNK).view(
                    1, n, -1, kernels.FLA_CHUNK)
            self.rows[(n, seg, read)] = rows
        return rows

    def shared(self, kind: str, numel: int) -> torch.Tensor:
        """The first ``numel`` elements of one zeroed buffer of ``kind`` every row count shares, made
        anew when a row count needs more. Apart, the 0.8B's 20 read shapes would hold 0.5 GB of them
        (4 KB of attention output and 2 KB of solve a row)."""
        held = self.scratch.get(kind)
        if held is None or held.numel() < numel:
            held = self.scratch[kind] = torch.zeros(numel, device=self.device, dtype=self.dtype)
        return held[:numel]

    def nbytes(self) -> int:
        """The row counts' own bytes and the shared buffers'."""
        own = sum(r.nbytes() for r in self.rows.values())
        return own + sum(t.numel() * t.element_size() for t in self.scratch.values())
