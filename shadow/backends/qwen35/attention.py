"""Chunk attention for the fast path: a Triton flash kernel for head dim 256 with the query heads
of a KV head packed as rows, split over the keys, merged by log-sum-exp.

Why our own kernel: a chunk is 512 queries against up to 200k keys at head dim 256 with 4 query
heads per KV head. torch's flash (FA2) runs that at about 300 TFLOP/s on an H200, and cuDNN is
slower (``benchmarks/probes/attention_variants.py``). Packing the 4 query heads of a KV head as rows
(``m = token * G + head``) makes every key tile serve 4x the rows, and splitting the keys fills
the GPU's SMs when there are only 512 queries.

Exactness: the split count and every block shape depend on ``(rows, end)`` alone, never on a
buffer's capacity or on the device's state, and the merge adds the splits in a fixed order. The
same chunk at the same depth therefore gives the same bits in every process, which is what keeps
a session read over many turns equal to a fresh prefill on the same grid.

Causality: query ``t`` (at absolute position ``start + t``) sees keys ``0 .. start + t``; rows
past ``n`` (padding) come last and are not written.

Hopper: the key tiles every row of a block sees come through the copy engine (TMA, a host tensor
descriptor of the first ``end`` rows, so nothing past the chunk is read); the causal edge and a
split's ragged end take masked pointer loads. The scale is folded into one multiply-add a score.
Measured and not kept (``benchmarks/results/history/attention_triton_*.json``): the value
accumulator in two halves of the head dim, Triton's warp specialisation of the key loop, a lazy
rescale (only when a row's maximum grew by 2^8), 64-row blocks two to an SM, other merge shapes.
Triton's interpreter runs the same paths, descriptor loads too, so the CPU tests cover them (Triton
3.9's, the project's; the interpreter of the GPU image's Triton 3.6 failed 4 of those 5 tests).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E = 1.4426950408889634


@triton.jit
def _softmax_step(q, k, m_i, qk_scale, keep, MASKED: tl.constexpr, FOLD: tl.constexpr):
    """One key tile's scores: the tile's probabilities (against the new running maximum), the
    factor that rescales what came before, and the new maximum (all in log2 units)."""
    qk = tl.dot(q, k)
    if MASKED:
        qk = tl.where(keep, qk, float("-inf"))
    if FOLD:  # the scale applied to the row maxima, then inside one multiply-add a score
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    else:
        qk = qk * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_safe = m_new
    if MASKED:
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    scaled = qk * qk_scale if FOLD else qk
    p = tl.math.exp2(scaled - m_safe[:, None])
    return p, tl.math.exp2(m_i - m_safe), m_new


@triton.jit
def _attn_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, o_ptr, part_ptr, lse_ptr, start, n, end, split_len,
                 stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                 rows_total, qk_scale, G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 SPLIT: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, FOLD: tl.constexpr):
    pid_m, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BM + tl.arange(0, BM)  # packed rows: token * G + head within the group
    t = rows // G
    head = h * G + rows % G
    row_ok = t < n
    d = tl.arange(0, D)
    q = tl.load(q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=row_ok[:, None],
                other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    pos = start + t
    lo = s * split_len
    # The last key any row of this block sees, and the first key where some row stops seeing.
    t_max = tl.minimum(pid_m * BM + BM - 1, rows_total - 1) // G
    hi = tl.minimum(tl.minimum(lo + split_len, end), start + t_max + 1)
    free = tl.minimum(hi, start + (pid_m * BM) // G + 1)  # keys every row of the block sees
    free = lo + tl.maximum(free - lo, 0) // BN * BN

    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    cols0 = tl.arange(0, BN)
    # Full tiles: every row sees every key; with TMA the copy engine fetches them (all in bounds).
    for kb in range(lo, free, BN):
        cols = kb + cols0
        if TMA:
            k = k_desc.load([kb, h * D]).T
        else:
            k = tl.load(k_ptr + cols[None, :] * stride_kt + h * stride_kh + d[:, None])
        if UPCAST:
            k = k.to(tl.float32)
        p, alpha, m_i = _softmax_step(q, k, m_i, qk_scale, None, False, FOLD)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([kb, h * D]) if TMA else tl.load(v_ptr + cols[:, None] * stride_vt + h * stride_vh + d[None, :])
        if UPCAST:
            v = v.to(tl.float32)
        acc = tl.dot(p.to(v.dtype), v, acc)
    # The causal edge and the split's end: masked loads, never past ``hi``.
    for kb in range(free, hi, BN):
        cols = kb + cols0
        col_ok = cols < hi
        k = tl.load(k_ptr + cols[None, :] * stride_kt + h * stride_kh + d[:, None], mask=col_ok[None, :], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        keep = col_ok[None, :] & (cols[None, :] <= pos[:, None])
        p, alpha, m_i = _softmax_step(q, k, m_i, qk_scale, keep, True, FOLD)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + cols[:, None] * stride_vt + h * stride_vh + d[None, :], mask=col_ok[:, None], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])

    seen = l_i > 0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    if SPLIT:
        at = (s * tl.num_programs(1) + h) * rows_total + rows
        tl.store(part_ptr + at[:, None] * D + d[None, :], out, mask=row_ok[:, None])
        tl.store(lse_ptr + at, tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf")),
                 mask=row_ok)
    else:
        tl.store(o_ptr + t[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _merge_kernel(part_ptr, lse_ptr, o_ptr, n, splits, rows_total, stride_ot, stride_oh, G: tl.constexpr,
                  D: tl.constexpr, BM: tl.constexpr):
    pid_m, h = tl.program_id(0), tl.program_id(1)
    heads = tl.num_programs(1)
    rows = pid_m * BM + tl.arange(0, BM)
    t = rows // G
    row_ok = t < n
    d = tl.arange(0, D)
    top = tl.full([BM], float("-inf"), tl.float32)
    for s in range(0, splits):
        top = tl.maximum(top, tl.load(lse_ptr + (s * heads + h) * rows_total + rows, mask=row_ok, other=0.0))
    total = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for s in range(0, splits):  # a fixed order: the same bits every time
        at = (s * heads + h) * rows_total + rows
        w = tl.math.exp2(tl.load(lse_ptr + at, mask=row_ok, other=float("-inf")) - top)
        total += w
        acc += w[:, None] * tl.load(part_ptr + at[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
    out = acc / tl.where(row_ok, total, 1.0)[:, None]
    head = h * G + rows % G
    tl.store(o_ptr + t[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None])


# Triton's interpreter (the CPU tests) multiplies bf16 tiles as raw integers: there the tiles are
# widened to fp32 first, and the blocks are small so that the tests see the split and the merge.
# On the GPU the products are bf16 tensor-core products.
UPCAST = os.environ.get("TRITON_INTERPRET") == "1"

# Fixed launch shapes (never autotuned; see the module docstring). On an H200, 64 x 64 tiles with 4
# warps and 3 stages of K and V through TMA, the scale folded, ran at 513 TFLOP/s at 32k and 545 at
# 100k (512 rows; 128 x 64 with 8 warps: 483 and 517; results/history/attention_triton_b159447.json).
BM, BN, WARPS, STAGES = (16, 16, 4, 1) if UPCAST else (64, 64, 4, 3)
SMS = 132  # an H200's multiprocessors: the split rule fills one or two waves of them
MIN_SPLIT = 64 if UPCAST else 1024
# K and V tiles through the copy engine (TMA); the scale folded into one multiply-add a score. Off,
# they give the kernel as it was at 80fc4c2 (the probe's baseline).
TMA, FOLD = True, True
MIN_ROWS = 16  # fewer query rows (decode, small forks) stay on torch's flash kernel


def fits(n: int, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether this kernel serves a pass of ``n`` rows at this shape."""
    return n >= MIN_ROWS and head_dim == triton.next_power_of_2(head_dim) and head_dim <= 256 and heads % kv_heads == 0


def split_len(rows_total: int, kv_heads: int, end: int, bm: int = BM, bn: int = BN, min_split: int = MIN_SPLIT,
              target: int | None = None) -> int:
    """Keys per split, a multiple of ``bn``: a function of the shape and the depth only.

    The split count fills one wave of ``SMS`` programs, or two where two fill the SMs better by more
    than a tenth (one program an SM: a tile shape that fits two would want its own rule); at least
    ``min_split`` keys a split. ``target`` gives the rule before (``target // blocks`` splits), for
    the probes."""
    blocks = triton.cdiv(rows_total, bm) * kv_heads
    most = triton.cdiv(end, min_split)
    if target is not None:
        splits = max(1, min(target // blocks, most))
    else:
        one, two = (max(1, min(w * SMS // blocks, most)) for w in (1, 2))

        def fill(s: int) -> float:
            return blocks * s / (SMS * triton.cdiv(blocks * s, SMS))

        splits = two if fill(two) > fill(one) + 0.1 else one
    return triton.cdiv(triton.cdiv(end, splits), bn) * bn


def _descriptor(t: torch.Tensor, end: int, block: list[int]) -> TensorDescriptor | None:
    """Rows ``[0, end)`` of ``t`` (``[rows, KV, D]``) as a 2-D ``[end, KV * D]`` tensor for the copy
    engine, or None where its layout does not allow one (then the kernel loads through pointers; the
    reader's KV buffers are whole allocations, so they always take the copy engine)."""
    d = t.shape[2]
    if t.stride(2) != 1 or t.stride(1) != d or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
        return None
    return TensorDescriptor(t, [end, t.shape[1] * d], [t.stride(0), 1], block)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor,
           bm: int = BM, bn: int = BN, warps: int = WARPS, stages: int = STAGES, min_split: int = MIN_SPLIT,
           target: int | None = None, tma: bool = TMA, fold: bool = FOLD) -> Any:
    """``out[t, h] = softmax(q[t, h] . keys[:start + t + 1, h // G]) . values`` for ``q`` of shape
    ``[n, H, D]`` and ``keys``/``values`` of shape ``[>= start + n, KV, D]`` (rows past ``start + n``
    are not read). Returns the launched attention kernel (its registers and spills, for the probes)."""
    n, heads, d = q.shape
    kv = keys.shape[1]
    g = heads // kv
    end = start + n
    rows_total = n * g
    step = split_len(rows_total, kv, end, bm, bn, min_split, target)
    splits = triton.cdiv(end, step)
    scale = d ** -0.5 * LOG2E
    grid = (triton.cdiv(rows_total, bm), kv, splits)
    k_desc = v_desc = None
    if tma:
        k_desc = _descriptor(keys, end, [bn, d])
        v_desc = _descriptor(values, end, [bn, d])
    use_tma = k_desc is not None and v_desc is not None
    common = (q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), values.stride(0), values.stride(1),
              out.stride(0), out.stride(1), rows_total, scale)
    shapes = {"G": g, "D": d, "BM": bm, "BN": bn, "UPCAST": UPCAST, "TMA": use_tma, "FOLD": fold, "num_warps": warps,
              "num_stages": stages}
    descs = (k_desc, v_desc) if use_tma else (keys, values)
    if splits == 1:
        return _attn_kernel[grid](q, keys, values, *descs, out, out, out, start, n, end, step, *common, SPLIT=False,
                                  **shapes)
    part = torch.empty(splits * kv * rows_total, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(splits * kv * rows_total, device=q.device, dtype=torch.float32)
    kernel = _attn_kernel[grid](q, keys, values, *descs, out, part, lse, start, n, end, step, *common, SPLIT=True,
                                **shapes)
    merge_bm = 16
    _merge_kernel[(triton.cdiv(rows_total, merge_bm), kv)](part, lse, out, n, splits, rows_total, out.stride(0),
                                                         out.stride(1), G=g, D=d, BM=merge_bm, num_warps=4)
    return kernel


def attend_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """The same attention in fp32 torch: what the kernel is checked against."""
    n, heads, d = q.shape
    g = heads // keys.shape[1]
    end = start + n
    k = keys[:end].float().repeat_interleave(g, dim=1)  # [end, H, D]
    v = values[:end].float().repeat_interleave(g, dim=1)
    scores = torch.einsum("thd,khd->htk", q.float(), k) * d ** -0.5
    allowed = torch.arange(end, device=q.device)[None, :] <= (start + torch.arange(n, device=q.device))[:, None]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("htk,khd->thd", scores.softmax(-1), v)
