"""A pass as captured pieces with attention run eagerly between them: every pass (a fork's, a
read's) where our kernel does not serve the grid, and a fork's where ``FastForward.fork_tables`` is
off (the probes' baseline).

Each session's K and V rows are written into its own buffers, and each chunk attends over its own
session's rows in a call of its own, so that its split rule sees that chunk's depth alone. Passes
of 16 rows or more take our kernel (the attention backend's ``attend``), fewer (decode) torch's flash kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ..attention.backend import AttentionBackend
from ..config import Qwen35Config
from ..model import Qwen35
from ..state import ModelState
from .staging import Rows


class Pieces(Protocol):
    """What a piecewise pass runs: the forward's pieces and attention (``FastForward``)."""

    model: Qwen35
    cfg: Qwen35Config
    device: torch.device
    attention: AttentionBackend
    n_attn: int
    read_stops_early: bool

    def rows_for(self, n: int, seg: int | None = None, read: bool = False) -> Rows: ...

    def run_piece(self, r: Rows, j: int) -> None: ...

    def chunk_rows(self, r: Rows) -> int: ...


def run(fast: Pieces, ids: torch.Tensor, states: Sequence[ModelState], real: int, logits: bool,
        seg: int | None = None) -> torch.Tensor | None:
    """One forward of ``ids`` (a captured row count: one session's, or ``seg`` rows, ``grid`` by
    default, for each of ``states``, the first ``real`` of each session's rows real) at each
    state's length, on the static conv and recurrent slots. Returns logits of the last real row
    if asked (one session)."""
    r = fast.rows_for(ids.shape[0], seg)
    if len(states) != r.sessions:
        raise ValueError(f"{r.n} rows are {r.sessions} sessions' passes, got {len(states)} sessions")
    starts = [s.length for s in states]
    for s in states:
        s.reserve(s.length + r.seg)
    r.stage(ids, starts, real)
    stop_early = not logits and fast.read_stops_early
    for j in range(fast.n_attn):
        fast.run_piece(r, j)
        attend(fast, r, states, j, starts, compute=not (stop_early and j == fast.n_attn - 1))
    if stop_early:
        return None
    fast.run_piece(r, fast.n_attn)
    if not logits:
        return None
    fast.run_piece(r, fast.n_attn + 1)
    assert r.logits is not None
    return r.logits


def attend(fast: Pieces, r: Rows, states: Sequence[ModelState], i: int, starts: Sequence[int],
           compute: bool) -> None:
    """Attention layer ``i`` of pass ``r``: write each session's K and V rows into it, and (if
    ``compute``) attend, a call a chunk at its own start."""
    q_all, k_all, v_all = r.qkv[i]
    spans = [(state, start, slice(b * r.seg, (b + 1) * r.seg))
             for b, (state, start) in enumerate(zip(states, starts, strict=True))]
    # every session's K and V rows in one multi-tensor launch, not two copies a session: the
    # launches between the pieces are host time the device waits for
    torch._foreach_copy_([t for s, at, _ in spans for t in (s.k[i][at:at + r.seg], s.v[i][at:at + r.seg])],
                         [t for _, _, rows in spans for t in (k_all[rows], v_all[rows])])
    if compute:
        step = fast.chunk_rows(r)
        for state, start, rows in spans:
            for at in range(rows.start, rows.stop, step):
                attend_one(fast, q_all[at:at + step], state, i, start + at - rows.start, r.attn[at:at + step])


def attend_one(fast: Pieces, q: torch.Tensor, state: ModelState, i: int, start: int, out: torch.Tensor) -> None:
    """``out`` = attention of ``q`` (rows from ``start``) over the session's rows of layer ``i``."""
    cfg, n = fast.cfg, q.shape[0]
    end = start + n
    if fast.attention.fits(n, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim):
        fast.attention.attend(q, state.k[i], state.v[i], start, out)
        return
    keys = state.k[i][:end].permute(1, 0, 2)[None]
    values = state.v[i][:end].permute(1, 0, 2)[None]
    if fast.model.attention == "lower-right":
        mask: Any = causal_lower_right(n, end)
    else:
        keys_at = torch.arange(end, device=fast.device)
        mask = keys_at[None, :] <= torch.arange(start, end, device=fast.device)[:, None]
    o = F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], keys, values, attn_mask=mask,
                                       scale=cfg.head_dim ** -0.5, enable_gqa=True)
    out.copy_(o[0].permute(1, 0, 2))
