"""A warm start: every kernel variant the fast path launches, launched once before a request can
need it (``warm_paths``, from ``TorchReader.warm_up``, after the graphs are captured). It drives the
reader through the few calls of ``WarmReader``.

Capturing the graphs runs the pieces of every row count, but not what runs eagerly between and
after them, and some of that compiles or loads on first use:

- our attention kernel (the attention backend's ``attend``) for piecewise passes of 16 rows or more (a pass from a
  table compiled its kernel when captured). Triton compiles one
  variant per ``SPLIT`` (a pass whose keys fit one split, and one that splits them), and per
  integer argument that is a multiple of 16 or not: the merge's split count is one. Which variant
  a pass takes depends on its depth, so the first chunk past ``MIN_SPLIT`` keys compiled the
  split and the merge mid-session (seconds; benchmarks/README.md). Each captured
  row count is launched here at the depths that give each variant (dummy rows: the bits of a
  kernel never depend on its inputs' history);
- torch's attention for fewer rows (decode, small forks), the checkpoint's copies, a fork's
  logits, the device argmax of a decode and the softmax over a question's choices: one real
  session on a scratch state goes through them (chunks past ``MIN_SPLIT``, a question of every
  captured size, a short decode), then is dropped.

With Triton's cache warm (``TRITON_CACHE_DIR``: the container puts it under ``DIR``, so a restart
finds it) the compiles are loads from disk.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from shadow.core.session import SessionBook

from ..attention import triton as attention_triton
from .forward import FastForward


class WarmReader(Protocol):
    """What the warm start drives: the reader's fast path and the calls a session makes."""

    grid: int

    @property
    def fast(self) -> FastForward | None: ...

    @property
    def vocab_size(self) -> int: ...

    def new_session(self) -> Any: ...

    def checkpoint_if_due(self, book: SessionBook, tensors: Any) -> None: ...

    def read_chunk(self, book: SessionBook, tensors: Any) -> float: ...

    def fork_logits(self, book: SessionBook, tensors: Any, extra: list[int],
                    upto: int | None = None) -> torch.Tensor: ...

    def probabilities(self, logits: torch.Tensor, token_ids: Sequence[int]) -> list[float]: ...

    def fork_decode(self, book: SessionBook, tensors: Any, prompt: list[int], max_new: int, stop: set[int],
                    upto: int | None = None) -> list[int]: ...

    def sync(self) -> None: ...


def split_classes(rows: int, heads: int, kv_heads: int, grid: int, bm: int, most: int = 16) -> dict[str, int]:
    """The key count (``end``) of a pass of ``rows`` query rows, on the grid, at which the attention
    (programs of ``bm`` rows, the backend's ``block_rows``) takes each variant: ``one`` split;
    ``split`` (a split count not a multiple of 16); ``split16`` (one that is, where the shape allows
    that many)."""
    g = heads // kv_heads
    found: dict[str, int] = {}
    limit = most * attention_triton.MIN_SPLIT + grid
    for end in range(rows, limit + 1, grid):
        step = attention_triton.split_len(rows * g, kv_heads, end, bm)
        splits = -(-end // step)
        kind = "one" if splits == 1 else ("split16" if splits % 16 == 0 else "split")
        found.setdefault(kind, end)
    return found


def attention_sizes(fast: FastForward) -> list[int]:
    """The row counts our attention kernel takes in a call of its own: the captured sizes up to the
    grid that fit it, where forks run piecewise (a batch pass attends per session, one grid of rows
    each, so its larger row counts never reach it); none where every pass reads a table in a graph,
    whose capture compiled it."""
    cfg = fast.cfg
    if fast.whole_forks:
        return []
    return [n for n in fast.sizes if n <= fast.grid
            and fast.attention.fits(n, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)]


def _attention_variants(fast: FastForward) -> int:
    """Each of ``attention_sizes`` at the depths of each variant; launches made."""
    cfg = fast.cfg
    heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bm = fast.block_rows()
    launched = 0
    for n in attention_sizes(fast):
        for end in split_classes(n, heads, kv, fast.grid, bm).values():
            q = torch.zeros(n, heads, d, device=fast.device, dtype=fast.model.dtype)
            keys = torch.zeros(end, kv, d, device=fast.device, dtype=fast.model.dtype)
            out = torch.empty_like(q)
            fast.attention.attend(q, keys, keys, end - n, out)
            launched += 1
    return launched


def _first_uses(reader: WarmReader, sizes: tuple[int, ...] | None = None) -> None:
    """One scratch session through the reader's own calls: chunks past ``MIN_SPLIT`` (a checkpoint
    taken on the way), a question of every captured size (or of ``sizes``) with its choices'
    softmax, a decode."""
    fast = reader.fast
    assert fast is not None
    grid = reader.grid
    chunks = attention_triton.MIN_SPLIT // grid + 1  # the last one attends over more than MIN_SPLIT keys
    vocab = reader.vocab_size
    ids = [(7 + 31 * i) % vocab for i in range(chunks * grid + max(fast.sizes))]
    book, tensors = SessionBook(grid), reader.new_session()
    book.feed_prompt(ids[:chunks * grid])
    for _ in range(chunks):
        reader.checkpoint_if_due(book, tensors)
        reader.read_chunk(book, tensors)
    for n in sizes or fast.sizes:
        logits = reader.fork_logits(book, tensors, ids[:n], upto=book.committed)
        reader.probabilities(logits, [0, 1])
    reader.fork_decode(book, tensors, ids[:8], max_new=3, stop=set(), upto=book.committed)
    reader.sync()


def warm_paths(reader: WarmReader) -> float:
    """Launch what the fast path runs outside its captured graphs (see the module docstring);
    seconds taken (0 without the fast path on CUDA; the CPU tests call the two steps themselves)."""
    fast = reader.fast
    if fast is None or fast.device.type != "cuda":
        return 0.0  # off CUDA the kernels run under Triton's interpreter: nothing compiles or loads
    t0 = time.perf_counter()
    _attention_variants(fast)
    _first_uses(reader)
    return time.perf_counter() - t0
