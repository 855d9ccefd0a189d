"""A warm start: every kernel variant the fast path launches, launched once before a request can
need it (``warm_paths``, from ``TorchReader.warm_up``, after the graphs are captured).

Capturing the graphs runs the pieces of every row count, but not what runs eagerly between and
after them, and some of that compiles or loads on first use:

- our attention kernel (``attention.py``) for piecewise passes of 16 rows or more (a pass from a
  table compiled its kernel when captured). Triton compiles one
  variant per ``SPLIT`` (a pass whose keys fit one split, and one that splits them), and per
  integer argument that is a multiple of 16 or not: the merge's split count is one. Which variant
  a pass takes depends on its depth, so the first chunk past ``MIN_SPLIT`` keys compiled the
  split and the merge mid-session (2 s on the H200, measured on the 0.8B at 65c9fac). Each captured
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
from typing import TYPE_CHECKING

import torch

from shadow.core.session import SessionBook

from . import attention, attention_kernel

if TYPE_CHECKING:
    from shadow.backends.reader import TorchReader

    from .fast import FastForward


def split_classes(rows: int, heads: int, kv_heads: int, grid: int, bm: int, most: int = 16) -> dict[str, int]:
    """The key count (``end``) of a pass of ``rows`` query rows, on the grid, at which the attention
    (programs of ``bm`` rows, ``attention_kernel.block_rows``) takes each variant: ``one`` split;
    ``split`` (a split count not a multiple of 16); ``split16`` (one that is, where the shape allows
    that many)."""
    g = heads // kv_heads
    found: dict[str, int] = {}
    limit = most * attention.MIN_SPLIT + grid
    for end in range(rows, limit + 1, grid):
        step = attention.split_len(rows * g, kv_heads, end, bm)
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
            and attention.fits(n, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)]


def _attention_variants(fast: FastForward) -> int:
    """Each of ``attention_sizes`` at the depths of each variant; launches made."""
    cfg = fast.cfg
    heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bm = attention_kernel.block_rows(fast.device.type, fast.model.dtype, d)
    launched = 0
    for n in attention_sizes(fast):
        for end in split_classes(n, heads, kv, fast.grid, bm).values():
            q = torch.zeros(n, heads, d, device=fast.device, dtype=fast.model.dtype)
            keys = torch.zeros(end, kv, d, device=fast.device, dtype=fast.model.dtype)
            out = torch.empty_like(q)
            attention.attend(q, keys, keys, end - n, out)
            launched += 1
    return launched


def _first_uses(reader: TorchReader, sizes: tuple[int, ...] | None = None) -> None:
    """One scratch session through the reader's own calls: chunks past ``MIN_SPLIT`` (a checkpoint
    taken on the way), a question of every captured size (or of ``sizes``) with its choices'
    softmax, a decode."""
    fast = reader.fast
    assert fast is not None
    grid = reader.grid
    chunks = attention.MIN_SPLIT // grid + 1  # the last one attends over more than MIN_SPLIT keys
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


def warm_paths(reader: TorchReader) -> float:
    """Launch what the fast path runs outside its captured graphs (see the module docstring);
    seconds taken (0 without the fast path on CUDA; the CPU tests call the two steps themselves)."""
    fast = reader.fast
    if fast is None or fast.device.type != "cuda":
        return 0.0  # off CUDA the kernels run under Triton's interpreter: nothing compiles or loads
    t0 = time.perf_counter()
    _attention_variants(fast)
    _first_uses(reader)
    return time.perf_counter() - t0
