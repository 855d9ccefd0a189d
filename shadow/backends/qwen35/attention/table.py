"""The table a pass's attention reads on the device (``AttentionBackend.attend_table``), and the
launch that writes a pass's K and V rows through it.

One row an entry (a session's chunk), of (start, split length, splits, K's address, V's address),
int64: each chunk's own depth, split rule and KV buffers, so that one captured launch serves any
depths and any sessions. Every backend reads this layout.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FIELDS = 5  # (start, split length, splits, K's address, V's address)


def check_kv(keys: torch.Tensor, values: torch.Tensor, rows: int) -> None:
    """What a table entry needs of its KV buffers: contiguous, on 16 bytes, at least ``rows`` rows."""
    kv, d = keys.shape[1], keys.shape[2]
    for t in (keys, values):
        if not t.is_contiguous() or t.data_ptr() % 16 or t.shape[0] < rows:
            raise ValueError(f"a table entry needs contiguous KV rows [>= {rows}, {kv}, {d}] on 16 bytes, "
                             f"got {list(t.shape)} with strides {t.stride()} at {t.data_ptr() % 16} past 16")


@triton.jit
def _write_rows_kernel(k_src, v_src, tab_ptr, n, W: tl.constexpr, BR: tl.constexpr):
    e, blk = tl.program_id(0), tl.program_id(1)
    row = tab_ptr + e * 5
    start = tl.load(row)
    k_dst = tl.multiple_of(tl.load(row + 3), 16).to(tl.pointer_type(k_src.dtype.element_ty))
    v_dst = tl.multiple_of(tl.load(row + 4), 16).to(tl.pointer_type(v_src.dtype.element_ty))
    r = blk * BR + tl.arange(0, BR)
    c = tl.arange(0, W)
    ok = (r < n)[:, None]
    src = (e * n + r).to(tl.int64)[:, None] * W + c[None, :]
    dst = (start + r).to(tl.int64)[:, None] * W + c[None, :]
    tl.store(k_dst + dst, tl.load(k_src + src, mask=ok), mask=ok)
    tl.store(v_dst + dst, tl.load(v_src + src, mask=ok), mask=ok)


def write_rows(keys: torch.Tensor, values: torch.Tensor, table: torch.Tensor) -> None:
    """Entry e's K and V rows (rows ``[e * n, (e + 1) * n)`` of ``keys``/``values``, ``[E * n, KV, D]``
    contiguous) into its session's buffers at its start, the addresses read from ``table``: one
    launch however many sessions, and nothing the host computes per pass beyond the table."""
    entries = table.shape[0]
    n = keys.shape[0] // entries
    width = keys.shape[1] * keys.shape[2]
    if not (keys.is_contiguous() and values.is_contiguous()) or width != triton.next_power_of_2(width):
        raise ValueError(f"write_rows takes contiguous rows of a power-of-two width, got {list(keys.shape)}")
    br = 16
    _write_rows_kernel[(entries, triton.cdiv(n, br))](keys, values, table, n, W=width, BR=br, num_warps=4)
