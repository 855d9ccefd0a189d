"""Chunk attention for Hopper in Gluon, beside ``attention.py``'s Triton kernel: the same
arithmetic, with the tensor cores driven asynchronously, and programs of 64 rows (one warpgroup)
or 128 (two warpgroups sharing each key and value tile). On a Hopper a single call takes it at 128
rows, and a read's pass its warp-specialised form (``attention_ws``, the same bits; see
``attention_kernel``).

Why: on an H200 the Triton kernel (64 packed query rows a program, 64-key tiles, one warpgroup)
holds the SMs at about 55 % of their throughput and L2 at about 32 % (Nsight Compute at 32k keys,
``benchmarks/results/ncu_attention.txt``): neither memory- nor math-bound, it waits on its own order
of work. Issuing tile j's scores beside tile j-1's values product (FlashAttention-3's overlap within
a warpgroup) did not change that: 64-row programs ran at the Triton kernel's speed. Two warpgroups
a program did: 547 / 584 TFLOP/s at 32k / 100k against 515 / 543 (``results/attention_triton-wg.json``).

Exactness: each output element is the Triton kernel's sequence of operations on the same numbers,
``O_j = O_{j-1} * alpha_j + P_j V_j`` with the same instruction shapes (64 x 64 x 16 for the scores,
64 x 256 x 16 for the values), keys in the same order, the same row reductions over the same
register layouts and the same merge: at 64 rows a program the H200 gave the Triton kernel's bits in
every case of the probe. At 128 rows the split rule is its own (``attention_kernel.block_rows``),
and the GPU tests pass with it (18 at 5d8828d); c974d7e's failure was the split rule's unit, not
this kernel (``attention_kernel``). A slot is fetched into only after a CTA barrier that follows
both warpgroups' product waits (the compiled code, Triton 3.6, sm_90a).

Not under Triton's interpreter (Gluon has none): the CPU tests cannot run it; the probe compares it
with the Triton kernel bit for bit on the GPU. Written for Triton 3.6's Gluon (the GPU image's);
Triton 3.9 compiles it too (its copy engine's load is named ``async_load``).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import attention

BM, BN = 64, 64  # attention.py's tiles: the split rule and the merge are shared
STAGES = 3
# Triton renamed the copy engine's load (3.6: async_copy_global_to_shared, which later versions keep
# only to raise); the kernel takes whichever this Triton has.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _softmax_tile(scores, m_i, l_i, j, full, lo, hi, pos, cols0, qk_scale, BN: gl.constexpr):
    """Tile j's scores, masked past the causal edge and the split's end, folded into each row's
    running maximum and sum: (probabilities, the rescale of what came before, maximum, sum).
    ``attention_ws`` takes the same step."""
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
def _store_rows(acc, m_i, l_i, base, o_ptr, part_ptr, lse_ptr, block, h, n, rows_total, stride_ot, stride_oh, G,
                to_part, s_layout: gl.constexpr, o_layout: gl.constexpr):
    """A block's rows (packed rows ``base ..``), normalised: into the output (bf16), or where the chunk
    splits into its split's partial sums (fp32) with each row's log-sum-exp for the merge.
    ``attention_ws`` ends the same way."""
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


@gluon.jit
def _attn_wg_kernel(q_ptr, k_desc, v_desc, o_ptr, part_ptr, lse_ptr, tab_ptr, start, n, end, split_len, max_splits,
                    stride_qt, stride_qh, stride_kt, stride_ot, stride_oh, rows_total, qk_scale, G: gl.constexpr,
                    D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, V_STAGES: gl.constexpr,
                    SPLIT: gl.constexpr, TABLE: gl.constexpr, Q_LAYOUT: gl.constexpr, KV_LAYOUT: gl.constexpr):
    pid_m = gl.program_id(0)
    h = gl.program_id(1)
    s = gl.program_id(2)
    e = 0
    split = False
    kd = k_desc
    vd = v_desc
    if TABLE:  # program axis 2 is (entry, split); the entry's numbers come from its row of the table
        e = s // max_splits
        s = s % max_splits
        row = tab_ptr + e * 5  # (start, split length, splits, K's address, V's address)
        start = gl.load(row).to(gl.int32)
        split_len = gl.load(row + 1).to(gl.int32)
        splits = gl.load(row + 2)
        if s >= splits:
            return
        split = splits > 1
        q_ptr += e * n * stride_qt
        o_ptr += e * n * stride_ot
        end = start + n
        k_base = gl.load(row + 3).to(gl.pointer_type(gl.bfloat16))
        v_base = gl.load(row + 4).to(gl.pointer_type(gl.bfloat16))
        kd = tma.make_tensor_descriptor(k_base, [end, stride_kt], [stride_kt, 1], [BN, D], KV_LAYOUT)
        vd = tma.make_tensor_descriptor(v_base, [end, stride_kt], [stride_kt, 1], [BN, D], KV_LAYOUT)
    # a warpgroup (4 warps) a 64-row block; with 128 rows, two warpgroups share each key and value tile
    W: gl.constexpr = BM // 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [W, 1], [1, 0])

    # the query block: packed rows (token * G + head within the group), through registers into shared memory
    rows_l = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, load_layout))
    d_l = gl.arange(0, D, layout=gl.SliceLayout(0, load_layout))
    t_l = rows_l // G
    q = gl.load(q_ptr + (t_l * stride_qt + (h * G + rows_l % G) * stride_qh)[:, None] + d_l[None, :],
                mask=(t_l < n)[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, D], Q_LAYOUT, q)
    fence_async_shared()

    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], KV_LAYOUT)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [V_STAGES, BN, D], KV_LAYOUT)
    # K and V of a tile arrive on barriers of their own: a tile's scores wait for its keys only, and
    # its key slot is fetched into again as soon as the scores are multiplied, a tile before its values
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
    for i in gl.static_range(V_STAGES):
        mbarrier.init(v_ready.index(i), count=1)

    lo = s * split_len
    t_max = gl.minimum(pid_m * BM + BM - 1, rows_total - 1) // G
    hi = gl.minimum(gl.minimum(lo + split_len, end), start + t_max + 1)
    tiles = gl.maximum(hi - lo + BN - 1, 0) // BN
    # tiles before ``full`` are seen whole by every row: no mask (a mask of all true changes no bit)
    full = (gl.minimum(hi, start + (pid_m * BM) // G + 1) - lo) // BN
    nbytes: gl.constexpr = BN * D * 2
    for i in gl.static_range(STAGES):
        go = i < tiles
        mbarrier.expect(k_ready.index(i), nbytes, pred=go)
        _tma_load(kd, [lo + i * BN, h * D], k_ready.index(i), k_smem.index(i), pred=go)
    for i in gl.static_range(V_STAGES):
        go = i < tiles
        mbarrier.expect(v_ready.index(i), nbytes, pred=go)
        _tma_load(vd, [lo + i * BN, h * D], v_ready.index(i), v_smem.index(i), pred=go)

    rows_s = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
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
        # tile j's keys are used: fetch tile j + STAGES's into their slot
        go = j + STAGES < tiles
        mbarrier.expect(k_ready.index(slot), nbytes, pred=go)
        _tma_load(kd, [lo + (j + STAGES) * BN, h * D], k_ready.index(slot), k_smem.index(slot), pred=go)
        p, alpha, m_i, l_i = _softmax_tile(scores, m_i, l_i, j, full, lo, hi, pos, cols0, qk_scale, BN)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        # tile j - 1's values are used: fetch tile j - 1 + V_STAGES's into their slot
        go = (j > 0) & (j - 1 + V_STAGES < tiles)
        mbarrier.expect(v_ready.index(before % V_STAGES), nbytes, pred=go)
        _tma_load(vd, [lo + (j - 1 + V_STAGES) * BN, h * D], v_ready.index(before % V_STAGES),
                  v_smem.index(before % V_STAGES), pred=go)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_prev = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    if tiles > 0:
        last = tiles - 1
        mbarrier.wait(v_ready.index(last % V_STAGES), (last // V_STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_smem.index(last % V_STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(i))
    for i in gl.static_range(V_STAGES):
        mbarrier.invalidate(v_ready.index(i))

    # without a table, the constant decides (a branch on it failed to lower)
    _store_rows(acc, m_i, l_i, pid_m * BM, o_ptr, part_ptr, lse_ptr, (e * max_splits + s) * gl.num_programs(1) + h, h,
                n, rows_total, stride_ot, stride_oh, G, SPLIT or (TABLE and split), s_layout, o_layout)


def kv_layout(d: int) -> Any:
    return gl.NVMMASharedLayout.get_default_for([BN, d], gl.bfloat16)


def descriptor(t: torch.Tensor, end: int) -> TensorDescriptor:
    """Rows ``[0, end)`` of ``t`` (``[rows, KV, D]``, rows contiguous) as ``[end, KV * D]`` tiles of
    ``BN`` rows and one head, for the copy engine; rows past ``end`` come as zeros."""
    d = t.shape[2]
    return TensorDescriptor(t, [end, t.shape[1] * d], [t.stride(0), 1], [BN, d], kv_layout(d))


def _shapes(g: int, d: int, bm: int, stages: int, v_stages: int, split: bool, table: bool) -> dict[str, Any]:
    return {"G": g, "D": d, "BM": bm, "BN": BN, "STAGES": stages, "V_STAGES": v_stages, "SPLIT": split,
            "TABLE": table, "Q_LAYOUT": gl.NVMMASharedLayout.get_default_for([bm, d], gl.bfloat16),
            "KV_LAYOUT": kv_layout(d), "num_warps": bm // 16}


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor,
           bm: int = BM, stages: int = STAGES, v_stages: int = STAGES) -> Any:
    """``attention.attend`` (bf16, head dim 256, Hopper) through this kernel: the same split rule
    and the same merge. Returns the launched kernel."""
    n, heads, d = q.shape
    kv = keys.shape[1]
    g = heads // kv
    end = start + n
    rows_total = n * g
    step = attention.split_len(rows_total, kv, end, bm, BN)
    splits = triton.cdiv(end, step)
    grid = (triton.cdiv(rows_total, bm), kv, splits)
    common = (start, n, end, step, 1, q.stride(0), q.stride(1), keys.stride(0), out.stride(0), out.stride(1),
              rows_total, d ** -0.5 * attention.LOG2E)
    kd, vd = descriptor(keys, end), descriptor(values, end)
    if splits == 1:
        return _attn_wg_kernel[grid](q, kd, vd, out, out, out, out, *common,
                                     **_shapes(g, d, bm, stages, v_stages, False, False))
    part = torch.empty(splits * kv * rows_total, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(splits * kv * rows_total, device=q.device, dtype=torch.float32)
    kernel = _attn_wg_kernel[grid](q, kd, vd, out, part, lse, out, *common,
                                   **_shapes(g, d, bm, stages, v_stages, True, False))
    attention.merge(part, lse, out, n, splits, kv, rows_total, g, d)
    return kernel


def attend_table(q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor, bm: int = BM,
                 stages: int = STAGES, v_stages: int = STAGES) -> None:
    """``attention.attend_table`` through this kernel: every entry of ``table`` in one launch and one
    merge, each entry's split rule its depth's (``bm`` must be the rule's, ``attention_kernel.block_rows``),
    the K and V descriptors made on the device from the entry's addresses."""
    entries = table.shape[0]
    rows, heads, d = q.shape
    n, kv = rows // entries, like.shape[1]
    g = heads // kv
    rows_total = n * g
    most = attention.most_splits(rows_total, kv, bm)
    part = torch.empty(entries * most * kv * rows_total, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(entries * most * kv * rows_total, device=q.device, dtype=torch.float32)
    attention._scratch_for_descriptors(q.device)
    # the host descriptors' places are taken by the device's; any descriptor of the right type will do
    kd = descriptor(like, like.shape[0])
    _attn_wg_kernel[(triton.cdiv(rows_total, bm), kv, entries * most)](
        q, kd, kd, out, part, lse, table, 0, n, 0, 0, most, q.stride(0), q.stride(1), like.stride(0), out.stride(0),
        out.stride(1), rows_total, d ** -0.5 * attention.LOG2E, **_shapes(g, d, bm, stages, v_stages, False, True))
    if most > 1:
        attention.merge_table(part, lse, out, table, n, most, kv, rows_total, g, d)
