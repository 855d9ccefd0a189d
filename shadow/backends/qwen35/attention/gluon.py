"""What the two Gluon kernels (``gluon_wg``, ``gluon_ws``) share, written once: the copy engine's
load, the key loop of a warpgroup's 64 rows (``consume_tiles``: scores, softmax step, values
product), its softmax step and its epilogue, and the layout of the key and value tiles.

The loop is one warpgroup's work in both kernels: ``gluon_wg`` runs it for each of its program's
warpgroups in lockstep (``FETCH``: the warpgroup itself fetches the next tile into a slot it just
used), ``gluon_ws`` in each consumer partition (the slot handed back on an "empty" barrier to a
fetching warp). Everything else is the same instructions on the same numbers in the same order, so
the two kernels give the same bits (``gluon_ws``'s docstring).

Written for Triton 3.6's Gluon (the GPU image's); Triton 3.9 compiles it too (its copy engine's
load is named ``async_load``). Not under Triton's interpreter (Gluon has none).
"""

from __future__ import annotations

from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

BN = 64  # key rows a tile: the Triton kernel's, so the split rule and the merge are shared
# Triton renamed the copy engine's load (3.6: async_copy_global_to_shared, which later versions keep
# only to raise); the kernels take whichever this Triton has.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def softmax_tile(scores, m_i, l_i, j, full, lo, hi, pos, cols0, qk_scale, BN: gl.constexpr):
    """Tile j's scores, masked past the causal edge and the split's end, folded into each row's
    running maximum and sum: (probabilities, the rescale of what came before, maximum, sum)."""
    if j >= full:  # tiles before ``full`` are seen whole by every row (a mask of all true changes no bit)
        cols = lo + j * BN + cols0
        keep = (cols[None, :] < hi) & (cols[None, :] <= pos[:, None])
        scores = gl.where(keep, scores, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(scores, 1) * qk_scale)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    p = gl.exp2(scores * qk_scale - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def consume_tiles(q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, kd, vd, base, start, lo, hi, full, tiles,
                  h, qk_scale, G, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, FETCH: gl.constexpr,
                  s_layout: gl.constexpr, o_layout: gl.constexpr):
    """One warpgroup's ``BM`` query rows (packed rows ``base ..``, in ``q_smem``) over key tiles
    ``0 .. tiles`` of its split from ``lo``: ``O_j = O_{j-1} * alpha_j + P_j V_j``, tile j's scores
    issued beside tile j - 1's values product (FlashAttention-3's overlap within a warpgroup).
    Returns (acc, row maxima, row sums).

    A used slot goes back at once: with ``FETCH`` this warpgroup fetches the slot's next tile itself
    (``kd``, ``vd``); without, it arrives on the slot's "empty" barrier (``k_free``, ``v_free``) for
    the warp that fetches. Tiles before ``full`` are seen whole by every row."""
    STAGES: gl.constexpr = k_smem.type.shape[0]
    V_STAGES: gl.constexpr = v_smem.type.shape[0]
    nbytes: gl.constexpr = BN * D * 2
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s = base + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    pos = start + rows_s // G
    cols0 = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    zeros_s = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    p_prev = gl.zeros([BM, BN], gl.bfloat16, layout=p_layout)
    for j in range(0, tiles):
        slot = j % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        scores = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        # the tile before's values (at j = 0 a product of zeros over tile 0's values: exactly zero)
        before = gl.maximum(j - 1, 0)
        mbarrier.wait(v_ready.index(before % V_STAGES), (before // V_STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_smem.index(before % V_STAGES), acc, is_async=True)
        scores = warpgroup_mma_wait(num_outstanding=1, deps=(scores, ))
        # tile j's keys are used: fetch tile j + STAGES's into their slot, or hand the slot back
        if FETCH:
            go = j + STAGES < tiles
            mbarrier.expect(k_ready.index(slot), nbytes, pred=go)
            tma_load(kd, [lo + (j + STAGES) * BN, h * D], k_ready.index(slot), k_smem.index(slot), pred=go)
        else:
            mbarrier.arrive(k_free.index(slot), count=1)
        p, alpha, m_i, l_i = softmax_tile(scores, m_i, l_i, j, full, lo, hi, pos, cols0, qk_scale, BN)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        # tile j - 1's values are used: fetch tile j - 1 + V_STAGES's into their slot, or hand it back
        if FETCH:
            go = (j > 0) & (j - 1 + V_STAGES < tiles)
            mbarrier.expect(v_ready.index(before % V_STAGES), nbytes, pred=go)
            tma_load(vd, [lo + (j - 1 + V_STAGES) * BN, h * D], v_ready.index(before % V_STAGES),
                     v_smem.index(before % V_STAGES), pred=go)
        else:
            mbarrier.arrive(v_free.index(before % V_STAGES), count=1, pred=j > 0)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_prev = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    if tiles > 0:
        last = tiles - 1
        mbarrier.wait(v_ready.index(last % V_STAGES), (last // V_STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_smem.index(last % V_STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return acc, m_i, l_i


@gluon.jit
def store_rows(acc, m_i, l_i, base, o_ptr, part_ptr, lse_ptr, block, h, n, rows_total, stride_ot, stride_oh, G,
               to_part, s_layout: gl.constexpr, o_layout: gl.constexpr):
    """A block's rows (packed rows ``base ..``), normalised: into the output (bf16), or where the chunk
    splits into its split's partial sums (fp32) with each row's log-sum-exp for the merge."""
    BM: gl.constexpr = acc.type.shape[0]
    D: gl.constexpr = acc.type.shape[1]
    rows_s = base + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    seen = l_i > 0
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = acc / gl.where(l_o > 0, l_o, 1.0)[:, None]
    rows_o = base + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    t_o = rows_o // G
    ok_o = t_o < n
    d_o = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    if to_part:
        at = block * rows_total + rows_o
        gl.store(part_ptr + at[:, None] * D + d_o[None, :], out, mask=ok_o[:, None])
        at_s = block * rows_total + rows_s
        gl.store(lse_ptr + at_s, gl.where(seen, m_i + gl.log2(gl.where(seen, l_i, 1.0)), float("-inf")),
                 mask=rows_s // G < n)
    else:
        gl.store(o_ptr + (t_o * stride_ot + (h * G + rows_o % G) * stride_oh)[:, None] + d_o[None, :],
                 out.to(gl.bfloat16), mask=ok_o[:, None])


def kv_layout(d: int) -> Any:
    return gl.NVMMASharedLayout.get_default_for([BN, d], gl.bfloat16)


def descriptor(t: torch.Tensor, end: int) -> TensorDescriptor:
    """Rows ``[0, end)`` of ``t`` (``[rows, KV, D]``, rows contiguous) as ``[end, KV * D]`` tiles of
    ``BN`` rows and one head, for the copy engine; rows past ``end`` come as zeros."""
    d = t.shape[2]
    return TensorDescriptor(t, [end, t.shape[1] * d], [t.stride(0), 1], [BN, d], kv_layout(d))
