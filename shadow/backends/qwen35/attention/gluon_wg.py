"""Chunk attention for Hopper in Gluon (the ``gluon-wg`` backend), beside ``triton.py``'s kernel:
the same arithmetic, with the tensor cores driven asynchronously, and programs of 64 rows (one
warpgroup) or 128 (two warpgroups sharing each key and value tile, in lockstep: a slot is fetched
into again only after a CTA barrier that follows both warpgroups' product waits). The backend runs
it at 128 rows; ``gluon-ws`` takes its single calls too.

Why: the Triton kernel is neither memory- nor math-bound on a Hopper; it waits on its own order of
work. Two warpgroups a program were faster where one, overlapping scores and values products, was
not (figures in benchmarks/README.md, "Attention kernels").

Exactness: each output element is the Triton kernel's sequence of operations on the same numbers,
``O_j = O_{j-1} * alpha_j + P_j V_j`` with the same instruction shapes (64 x 64 x 16 for the scores,
64 x 256 x 16 for the values), keys in the same order, the same row reductions over the same
register layouts and the same merge: at 64 rows a program it gave the Triton kernel's bits in every
case of the probe. At 128 rows the split rule is its own (``WarpgroupAttention.block_rows``). Each
warpgroup's key loop is ``gluon.consume_tiles``, which ``gluon-ws`` runs too.

Not under Triton's interpreter (Gluon has none): the CPU tests cannot run it; the backend's
self-check (``pytest -m gpu``) and the probe compare it on the GPU.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from . import triton as tri
from .gluon import BN, consume_tiles, descriptor, kv_layout, store_rows, tma_load
from .triton import TritonAttention

BM = 64  # the Triton kernel's rows a program (the shipped backend takes 128: ``Warpgroups``)
STAGES = 3


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
        tma_load(kd, [lo + i * BN, h * D], k_ready.index(i), k_smem.index(i), pred=go)
    for i in gl.static_range(V_STAGES):
        go = i < tiles
        mbarrier.expect(v_ready.index(i), nbytes, pred=go)
        tma_load(vd, [lo + i * BN, h * D], v_ready.index(i), v_smem.index(i), pred=go)

    acc, m_i, l_i = consume_tiles(q_smem, k_smem, v_smem, k_ready, v_ready, k_ready, v_ready, kd, vd, pid_m * BM, start,
                                  lo, hi, full, tiles, h, qk_scale, G, BM, BN, D, True, s_layout, o_layout)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(i))
    for i in gl.static_range(V_STAGES):
        mbarrier.invalidate(v_ready.index(i))

    # without a table, the constant decides (a branch on it failed to lower)
    store_rows(acc, m_i, l_i, pid_m * BM, o_ptr, part_ptr, lse_ptr, (e * max_splits + s) * gl.num_programs(1) + h, h,
               n, rows_total, stride_ot, stride_oh, G, SPLIT or (TABLE and split), s_layout, o_layout)


def _shapes(g: int, d: int, bm: int, stages: int, v_stages: int, split: bool, table: bool) -> dict[str, Any]:
    return {"G": g, "D": d, "BM": bm, "BN": BN, "STAGES": stages, "V_STAGES": v_stages, "SPLIT": split,
            "TABLE": table, "Q_LAYOUT": gl.NVMMASharedLayout.get_default_for([bm, d], gl.bfloat16),
            "KV_LAYOUT": kv_layout(d), "num_warps": bm // 16}


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor,
           bm: int = BM, stages: int = STAGES, v_stages: int = STAGES) -> Any:
    """``triton.attend`` (bf16, head dim 256, Hopper) through this kernel: the same split rule
    and the same merge. Returns the launched kernel."""
    n, heads, d = q.shape
    kv = keys.shape[1]
    g = heads // kv
    end = start + n
    rows_total = n * g
    step = tri.split_len(rows_total, kv, end, bm, BN)
    splits = triton.cdiv(end, step)
    grid = (triton.cdiv(rows_total, bm), kv, splits)
    common = (start, n, end, step, 1, q.stride(0), q.stride(1), keys.stride(0), out.stride(0), out.stride(1),
              rows_total, d ** -0.5 * tri.LOG2E)
    kd, vd = descriptor(keys, end), descriptor(values, end)
    if splits == 1:
        return _attn_wg_kernel[grid](q, kd, vd, out, out, out, out, *common,
                                     **_shapes(g, d, bm, stages, v_stages, False, False))
    part = torch.empty(splits * kv * rows_total, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(splits * kv * rows_total, device=q.device, dtype=torch.float32)
    kernel = _attn_wg_kernel[grid](q, kd, vd, out, part, lse, out, *common,
                                   **_shapes(g, d, bm, stages, v_stages, True, False))
    tri.merge(part, lse, out, n, splits, kv, rows_total, g, d)
    return kernel


def attend_table(q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor, bm: int = BM,
                 stages: int = STAGES, v_stages: int = STAGES) -> None:
    """``triton.attend_table`` through this kernel: every entry of ``table`` in one launch and one
    merge, each entry's split rule its depth's (``bm`` must be the rule's, ``block_rows``),
    the K and V descriptors made on the device from the entry's addresses."""
    entries = table.shape[0]
    rows, heads, d = q.shape
    n, kv = rows // entries, like.shape[1]
    g = heads // kv
    rows_total = n * g
    most = tri.most_splits(rows_total, kv, bm)
    part = torch.empty(entries * most * kv * rows_total, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(entries * most * kv * rows_total, device=q.device, dtype=torch.float32)
    tri.scratch_for_descriptors(q.device)
    # the host descriptors' places are taken by the device's; any descriptor of the right type will do
    kd = descriptor(like, like.shape[0])
    _attn_wg_kernel[(triton.cdiv(rows_total, bm), kv, entries * most)](
        q, kd, kd, out, part, lse, table, 0, n, 0, 0, most, q.stride(0), q.stride(1), like.stride(0), out.stride(0),
        out.stride(1), rows_total, d ** -0.5 * tri.LOG2E, **_shapes(g, d, bm, stages, v_stages, False, True))
    if most > 1:
        tri.merge_table(part, lse, out, table, n, most, kv, rows_total, g, d)


class WarpgroupAttention(TritonAttention):
    """``gluon-wg``: this kernel at 128 rows a program for the chunks it serves (bf16, head dim 256,
    on a Hopper), the Triton kernel for every other chunk. Its programs' rows are the split rule's
    unit on the chunks it serves (``block_rows``), so a table carries each chunk's own rule (the GPU
    tests at c974d7e failed where a head-dim-32 table carried the 128-row rule into the Triton
    kernel)."""

    name = "gluon-wg"
    priority = 1
    BM, STAGES, V_STAGES = 128, 3, 2  # the shipped launch (``gluon-ws`` shares its rows and stages)

    @classmethod
    def why_unavailable(cls, device: torch.device) -> str:
        if device.type != "cuda" or tri.UPCAST:
            return "Gluon's kernels run on a CUDA GPU only (there is no interpreter for them)"
        major, minor = torch.cuda.get_device_capability(device)
        if major != 9:  # wgmma is Hopper's alone
            return f"Gluon's kernels here are Hopper's (compute capability 9.x), this GPU is {major}.{minor}"
        return ""

    def serves(self, device_type: str, dtype: torch.dtype, head_dim: int) -> bool:
        """Whether a Gluon kernel reads chunks of this kind: bf16, head dim 256, on the GPU."""
        return device_type == "cuda" and dtype == torch.bfloat16 and head_dim == 256

    def block_rows(self, device_type: str, dtype: torch.dtype, head_dim: int) -> int:
        if self.serves(device_type, dtype, head_dim):
            return self.BM
        return super().block_rows(device_type, dtype, head_dim)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor) -> Any:
        if self.serves(q.device.type, q.dtype, q.shape[2]):
            return attend(q, keys, values, start, out, self.BM, self.STAGES, self.V_STAGES)
        return super().attend(q, keys, values, start, out)

    def attend_table(self, q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor) -> None:
        if self.serves(q.device.type, q.dtype, q.shape[2]):
            attend_table(q, table, like, out, self.BM, self.STAGES, self.V_STAGES)
            return
        super().attend_table(q, table, like, out)
