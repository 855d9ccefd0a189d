"""Chunk attention in Triton (the ``triton`` backend, and the kernel every other backend hands the
chunks it does not serve): a flash kernel for head dim 256 with the query heads of a KV head packed
as rows, split over the keys, merged by log-sum-exp. The split rule and the merge here are every
backend's.

Why our own kernel: a chunk is 512 queries against up to 200k keys at head dim 256 with 4 query
heads per KV head. Packing the 4 query heads of a KV head as rows (``m = token * G + head``) makes
every key tile serve 4x the rows, and splitting the keys fills the GPU's SMs when there are only
512 queries. (torch's flash and cuDNN against it, and the variants measured and not kept: in
benchmarks/README.md, "Attention kernels".)

Exactness: the split count and every block shape depend on ``(rows, end)`` alone, never on a
buffer's capacity or on the device's state, and the merge adds the splits in a fixed order. The
same chunk at the same depth therefore gives the same bits in every process, which is what keeps
a session read over many turns equal to a fresh prefill on the same grid.

Causality: query ``t`` (at absolute position ``start + t``) sees keys ``0 .. start + t``; rows
past ``n`` (padding) come last and are not written.

Hopper: the key tiles every row of a block sees come through the copy engine (TMA, a host tensor
descriptor of the first ``end`` rows, so nothing past the chunk is read); the causal edge and a
split's ragged end take masked pointer loads. The scale is folded into one multiply-add a score.
Triton's interpreter runs the same paths, descriptor loads too, so the CPU tests cover them (Triton
3.9's, the project's; the interpreter of the GPU image's Triton 3.6 failed 4 of those 5 tests).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .backend import AttentionBackend
from .table import check_kv

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
def _attn_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, o_ptr, part_ptr, lse_ptr, tab_ptr, start, n, end, split_len,
                 max_splits, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                 rows_total, qk_scale, G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 SPLIT: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr, FOLD: tl.constexpr,
                 TABLE: tl.constexpr):
    pid_m, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kd = k_desc
    vd = v_desc
    e = 0
    split = SPLIT
    if TABLE:  # program axis 2 is (entry, split); the entry's numbers come from its row of the table
        e = s // max_splits
        s = s % max_splits
        row = tab_ptr + e * 5  # (start, split length, splits, K's address, V's address)
        start = tl.load(row).to(tl.int32)
        split_len = tl.multiple_of(tl.load(row + 1).to(tl.int32), BN)  # split_len's rule: whole key tiles
        splits = tl.load(row + 2)
        if s >= splits:
            return
        split = splits > 1
        k_ptr = tl.multiple_of(tl.load(row + 3), 16).to(tl.pointer_type(k_ptr.dtype.element_ty))
        v_ptr = tl.multiple_of(tl.load(row + 4), 16).to(tl.pointer_type(v_ptr.dtype.element_ty))
        q_ptr += e * n * stride_qt
        o_ptr += e * n * stride_ot
        end = start + n
        if TMA:
            kd = tl.make_tensor_descriptor(k_ptr, [end, stride_kt], [stride_kt, 1], [BN, D])
            vd = tl.make_tensor_descriptor(v_ptr, [end, stride_vt], [stride_vt, 1], [BN, D])
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
        k = kd.load([kb, h * D]).T if TMA else tl.load(k_ptr + cols[None, :] * stride_kt + h * stride_kh + d[:, None])
        if UPCAST:
            k = k.to(tl.float32)
        p, alpha, m_i = _softmax_step(q, k, m_i, qk_scale, None, False, FOLD)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = vd.load([kb, h * D]) if TMA else tl.load(v_ptr + cols[:, None] * stride_vt + h * stride_vh + d[None, :])
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
    if split:
        at = ((e * max_splits + s) * tl.num_programs(1) + h) * rows_total + rows
        tl.store(part_ptr + at[:, None] * D + d[None, :], out, mask=row_ok[:, None])
        tl.store(lse_ptr + at, tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf")),
                 mask=row_ok)
    else:
        tl.store(o_ptr + t[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _merge_kernel(part_ptr, lse_ptr, o_ptr, tab_ptr, n, splits, max_splits, rows_total, stride_ot, stride_oh,
                  G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, TABLE: tl.constexpr):
    pid_m, h = tl.program_id(0), tl.program_id(1)
    heads = tl.num_programs(1)
    if TABLE:  # program axis 2 is the entry; one that did not split wrote its rows itself
        e = tl.program_id(2)
        splits = tl.load(tab_ptr + e * 5 + 2)
        if splits == 1:
            return
        part_ptr += e * max_splits * heads * rows_total * D
        lse_ptr += e * max_splits * heads * rows_total
        o_ptr += e * n * stride_ot
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

# Fixed launch shapes, never autotuned (the shapes measured against them: benchmarks/README.md,
# "Attention kernels"): 64 x 64 tiles, 4 warps, 3 stages of K and V through TMA.
BM, BN, WARPS, STAGES = (16, 16, 4, 1) if UPCAST else (64, 64, 4, 3)
SMS = 132  # a Hopper's multiprocessors: the split rule fills one or two waves of them
MIN_SPLIT = 64 if UPCAST else 1024
# K and V tiles through the copy engine (TMA); the scale folded into one multiply-add a score. Off,
# they give the kernel as it was at 80fc4c2 (the probe's baseline).
TMA, FOLD = True, True
MIN_ROWS = 16  # fewer query rows (decode, small forks) stay on torch's flash kernel


def fits(n: int, heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether this kernel serves a pass of ``n`` rows at this shape."""
    return n >= MIN_ROWS and head_dim == triton.next_power_of_2(head_dim) and head_dim <= 256 and heads % kv_heads == 0


@functools.lru_cache(maxsize=4096)  # a read's table asks it for every chunk of a pass: host time before the graph
def split_len(rows_total: int, kv_heads: int, end: int, bm: int = BM, bn: int = BN, min_split: int = MIN_SPLIT,
              target: int | None = None) -> int:
    """Keys per split, a multiple of ``bn``: a function of the shape and the depth only.

    The split count fills one wave of ``SMS`` programs, or two where two fill the SMs better by more
    than a tenth (one program an SM: a tile shape that fits two would want its own rule); at least
    ``min_split`` keys a split. ``target`` gives the rule before (``target // blocks`` splits), for
    the probes."""
    blocks = triton.cdiv(rows_total, bm) * kv_heads
    splits = _split_count(blocks, triton.cdiv(end, min_split), target)
    return triton.cdiv(triton.cdiv(end, splits), bn) * bn


def _split_count(blocks: int, most: int, target: int | None = None) -> int:
    if target is not None:
        return max(1, min(target // blocks, most))
    one, two = (max(1, min(w * SMS // blocks, most)) for w in (1, 2))

    def fill(s: int) -> float:
        return blocks * s / (SMS * triton.cdiv(blocks * s, SMS))

    return two if fill(two) > fill(one) + 0.1 else one


def most_splits(rows_total: int, kv_heads: int, bm: int = BM) -> int:
    """The most splits ``split_len`` gives at this shape, at any depth: the size of a table launch's
    split axis. The count depends on the depth only through ``cdiv(end, min_split)``, and past twice
    a wave of blocks that no longer changes it."""
    blocks = triton.cdiv(rows_total, bm) * kv_heads
    return max(_split_count(blocks, most) for most in range(1, 2 * SMS // blocks + 2))


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
        return _attn_kernel[grid](q, keys, values, *descs, out, out, out, out, start, n, end, step, 1, *common,
                                  SPLIT=False, TABLE=False, **shapes)
    part = torch.empty(splits * kv * rows_total, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(splits * kv * rows_total, device=q.device, dtype=torch.float32)
    kernel = _attn_kernel[grid](q, keys, values, *descs, out, part, lse, out, start, n, end, step, 1, *common,
                                SPLIT=True, TABLE=False, **shapes)
    merge(part, lse, out, n, splits, kv, rows_total, g, d)
    return kernel


MERGE_BM = 16


def merge(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, n: int, splits: int, kv: int, rows_total: int,
          g: int, d: int) -> None:
    """One chunk's splits (``part``, ``lse``, as the kernel stores them) into ``out``, in a fixed order."""
    _merge_kernel[(triton.cdiv(rows_total, MERGE_BM), kv)](part, lse, out, out, n, splits, 1, rows_total,
                                                         out.stride(0), out.stride(1), G=g, D=d, BM=MERGE_BM,
                                                         TABLE=False, num_warps=4)


@functools.lru_cache(maxsize=4096)
def split_fields(start: int, n: int, heads: int, kv_heads: int, bm: int) -> tuple[int, int, int]:
    """An entry's (start, split length, splits): ``attend``'s rule for a chunk of ``n`` rows at
    ``start``, in row blocks of ``bm`` (``block_rows``: the kernel that reads it)."""
    step = split_len(n * (heads // kv_heads), kv_heads, start + n, bm)
    return start, step, -(-(start + n) // step)


def attend_table(q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor, tma: bool = TMA) -> None:
    """``attend`` for every entry of ``table`` (``[E, table.FIELDS]`` on ``q``'s device) in one launch
    and one merge, the grid fixed by the shapes alone, so that it can be captured once and replayed
    at any depths: entry e's queries are rows ``[e * n, (e + 1) * n)`` of ``q`` (``[E * n, H, D]``)
    and ``out``, over the KV rows at its addresses. Each entry runs ``attend``'s code on its own
    numbers, in the same order (its split length and count are ``attend``'s at its depth), so it
    gives ``attend``'s bits for that chunk whatever the other entries hold. ``like`` is any tensor of
    the KV rows' dtype and ``[.., KV, D]`` contiguous layout (the kernel takes its strides)."""
    entries = table.shape[0]
    rows, heads, d = q.shape
    n, kv = rows // entries, like.shape[1]
    g = heads // kv
    rows_total = n * g
    most = most_splits(rows_total, kv)
    part = torch.empty(entries * most * kv * rows_total, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(entries * most * kv * rows_total, device=q.device, dtype=torch.float32)
    if tma:
        scratch_for_descriptors(q.device)
    _attn_kernel[(triton.cdiv(rows_total, BM), kv, entries * most)](
        q, like, like, like, like, out, part, lse, table, 0, n, 0, 0, most, q.stride(0), q.stride(1), like.stride(0),
        like.stride(1), like.stride(0), like.stride(1), out.stride(0), out.stride(1), rows_total, d ** -0.5 * LOG2E,
        G=g, D=d, BM=BM, BN=BN, UPCAST=UPCAST, TMA=tma, FOLD=FOLD, SPLIT=False, TABLE=True, num_warps=WARPS,
        num_stages=STAGES)
    if most > 1:
        merge_table(part, lse, out, table, n, most, kv, rows_total, g, d)


def merge_table(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, table: torch.Tensor, n: int, most: int,
                kv: int, rows_total: int, g: int, d: int) -> None:
    """Every entry's splits into ``out`` (an entry that did not split wrote its rows itself)."""
    _merge_kernel[(triton.cdiv(rows_total, MERGE_BM), kv, table.shape[0])](
        part, lse, out, table, n, 0, most, rows_total, out.stride(0), out.stride(1), G=g, D=d, BM=MERGE_BM,
        TABLE=True, num_warps=4)


_scratch_set = False


def scratch_for_descriptors(device: torch.device) -> None:
    """Tensor descriptors made on the device (``attend_table``) need scratch memory from the caller."""
    global _scratch_set
    if _scratch_set:
        return

    def scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device=device)

    triton.set_allocator(scratch)
    _scratch_set = True


class TritonAttention(AttentionBackend):
    """This module's kernel for every chunk: on any CUDA GPU, and on the CPU under Triton's
    interpreter (the tests)."""

    name = "triton"
    priority = 0

    @classmethod
    def why_unavailable(cls, device: torch.device) -> str:
        if device.type == "cuda" or UPCAST:
            return ""
        return "off CUDA, Triton's kernels run only under its interpreter (TRITON_INTERPRET=1, for tests)"

    def fits(self, n: int, heads: int, kv_heads: int, head_dim: int) -> bool:
        return fits(n, heads, kv_heads, head_dim)

    def block_rows(self, device_type: str, dtype: torch.dtype, head_dim: int) -> int:
        return BM

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor) -> Any:
        return attend(q, keys, values, start, out)

    def attend_table(self, q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor) -> None:
        attend_table(q, table, like, out)

    def table_row(self, start: int, n: int, heads: int, keys: torch.Tensor, values: torch.Tensor) -> list[int]:
        """(``[>= start + n, KV, D]`` buffers, rows first and contiguous.)"""
        check_kv(keys, values, start + n)
        bm = self.block_rows(keys.device.type, keys.dtype, keys.shape[2])
        return [*split_fields(start, n, heads, keys.shape[1], bm), keys.data_ptr(), values.data_ptr()]
