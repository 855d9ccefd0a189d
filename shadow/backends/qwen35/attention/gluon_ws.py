"""``gluon_wg``'s 128-row programs, warp-specialised (the ``gluon-ws`` backend, ``auto`` on a Hopper).

Why: in ``gluon_wg`` the two warpgroups of a program walk the key tiles in lockstep, since a slot is
fetched into again only after a CTA barrier that both reach. Here each warpgroup is a partition of
its own (64 query rows), and two one-warp partitions fetch the key and the value tiles, each slot
handed back by both consumers on an "empty" barrier: a consumer never waits for the other, so one
can take its softmax while the other's products run (FlashAttention-3's ping-pong, left to the warp
schedulers).

Exactness: each warpgroup runs ``gluon_wg``'s key loop for its 64 rows (``gluon.consume_tiles``):
the same tiles in the same order, the same instruction shapes, the same row reductions and the same
epilogue, over the same key range (the program's, as there). So the bits are ``gluon_wg``'s at 128
rows, and so is the split rule: ``torch.equal`` to it in every case of the attention probe on the
GPU, and in the backend's self-check.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from . import triton as tri
from .gluon import BN, consume_tiles, kv_layout, store_rows, tma_load
from .gluon_wg import WarpgroupAttention
from .table import check_kv

ROWS = 64  # a consumer warpgroup's query rows; a program has two
_ROWS, _BN = gl.constexpr(ROWS), gl.constexpr(BN)  # as the kernels read them


# A worker partition's arguments reach it as run-time values (Triton 3.6 keeps no constexpr across
# the split), so the partitions read their shapes from the shared buffers' types.
@gluon.jit
def _consume(wg: gl.constexpr, q_ptr, o_ptr, part_ptr, lse_ptr, q_smem, k_smem, v_smem, k_ready, k_empty, v_ready,
             v_empty, pid_m, h, e, s, start, n, lo, hi, tiles, max_splits, kv_heads, to_part, stride_qt, stride_qh,
             stride_ot, stride_oh, rows_total, qk_scale, G):
    D: gl.constexpr = q_smem.type.shape[2]
    BM: gl.constexpr = _ROWS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    base = pid_m * 2 * BM + wg * BM  # this warpgroup's first packed row

    rows_l = base + gl.arange(0, BM, layout=gl.SliceLayout(1, load_layout))
    d_l = gl.arange(0, D, layout=gl.SliceLayout(0, load_layout))
    t_l = rows_l // G
    q = gl.load(q_ptr + (t_l * stride_qt + (h * G + rows_l % G) * stride_qh)[:, None] + d_l[None, :],
                mask=(t_l < n)[:, None], other=0.0)
    q_one = q_smem.index(wg)
    q_one.store(q)
    fence_async_shared()

    full = (gl.minimum(hi, start + base // G + 1) - lo) // _BN
    acc, m_i, l_i = consume_tiles(q_one, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, k_empty, v_empty, base,
                                  start, lo, hi, full, tiles, h, qk_scale, G, BM, _BN, D, False, s_layout, o_layout)

    store_rows(acc, m_i, l_i, base, o_ptr, part_ptr, lse_ptr, (e * max_splits + s) * kv_heads + h, h, n, rows_total,
               stride_ot, stride_oh, G, to_part, s_layout, o_layout)


@gluon.jit
def _consume_second(q_ptr, o_ptr, part_ptr, lse_ptr, q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                    pid_m, h, e, s, start, n, lo, hi, tiles, max_splits, kv_heads, to_part, stride_qt, stride_qh,
                    stride_ot, stride_oh, rows_total, qk_scale, G):
    _consume(1, q_ptr, o_ptr, part_ptr, lse_ptr, q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, pid_m, h,
             e, s, start, n, lo, hi, tiles, max_splits, kv_heads, to_part, stride_qt, stride_qh, stride_ot, stride_oh,
             rows_total, qk_scale, G)


@gluon.jit
def _fetch(desc, smem, ready, empty, lo, h, tiles):
    """Tile j of ``desc`` into slot j % slots, once both consumers have handed the slot back."""
    D: gl.constexpr = smem.type.shape[2]
    SLOTS: gl.constexpr = smem.type.shape[0]
    for j in range(0, tiles):
        slot = j % SLOTS
        mbarrier.wait(empty.index(slot), ((j // SLOTS) & 1) ^ 1)  # a fresh barrier passes phase 1 at once
        mbarrier.expect(ready.index(slot), _BN * D * 2)
        tma_load(desc, [lo + j * _BN, h * D], ready.index(slot), smem.index(slot))


@gluon.jit
def _attn_ws_kernel(q_ptr, o_ptr, part_ptr, lse_ptr, tab_ptr, n, max_splits, stride_qt, stride_qh, stride_kt, stride_ot,
                    stride_oh, rows_total, qk_scale, G: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                    V_STAGES: gl.constexpr, Q_LAYOUT: gl.constexpr, KV_LAYOUT: gl.constexpr, REGS: gl.constexpr):
    # gluon_wg's table mode, the only one here (a launch without a table fails to lower in Triton
    # 3.6): program axis 2 is (entry, split), the entry's numbers from its row of the table
    pid_m = gl.program_id(0)
    h = gl.program_id(1)
    e = gl.program_id(2) // max_splits
    s = gl.program_id(2) % max_splits
    row = tab_ptr + e * 5
    start = gl.load(row).to(gl.int32)
    split_len = gl.load(row + 1).to(gl.int32)
    splits = gl.load(row + 2)
    if s >= splits:
        return
    to_part = splits > 1
    q_ptr += e * n * stride_qt
    o_ptr += e * n * stride_ot
    end = start + n
    k_base = gl.load(row + 3).to(gl.pointer_type(gl.bfloat16))
    v_base = gl.load(row + 4).to(gl.pointer_type(gl.bfloat16))
    kd = tma.make_tensor_descriptor(k_base, [end, stride_kt], [stride_kt, 1], [_BN, D], KV_LAYOUT)
    vd = tma.make_tensor_descriptor(v_base, [end, stride_kt], [stride_kt, 1], [_BN, D], KV_LAYOUT)

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, _ROWS, D], Q_LAYOUT)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, _BN, D], KV_LAYOUT)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [V_STAGES, _BN, D], KV_LAYOUT)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # both consumers hand a slot back
    for i in gl.static_range(V_STAGES):
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)

    lo = s * split_len
    t_max = gl.minimum(pid_m * 2 * _ROWS + 2 * _ROWS - 1, rows_total - 1) // G
    hi = gl.minimum(gl.minimum(lo + split_len, end), start + t_max + 1)
    tiles = gl.maximum(hi - lo + _BN - 1, 0) // _BN
    kv_heads = gl.num_programs(1)
    g = G + gl.program_id(0) * 0  # G as a run-time value: what the second consumer sees, so both see the same
    gl.warp_specialize([
        (_consume, (0, q_ptr, o_ptr, part_ptr, lse_ptr, q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                    pid_m, h, e, s, start, n, lo, hi, tiles, max_splits, kv_heads, to_part, stride_qt, stride_qh,
                    stride_ot, stride_oh, rows_total, qk_scale, g)),
        (_consume_second, (q_ptr, o_ptr, part_ptr, lse_ptr, q_smem, k_smem, v_smem, k_ready, k_empty, v_ready,
                           v_empty, pid_m, h, e, s, start, n, lo, hi, tiles, max_splits, kv_heads, to_part,
                           stride_qt, stride_qh, stride_ot, stride_oh, rows_total, qk_scale, g)),
        (_fetch, (kd, k_smem, k_ready, k_empty, lo, h, tiles)),
        (_fetch, (vd, v_smem, v_ready, v_empty, lo, h, tiles)),
    ], [4, 1, 1], [REGS, 24, 24])


def _shapes(g: int, d: int, stages: int, v_stages: int) -> dict[str, Any]:
    return {"G": g, "D": d, "STAGES": stages, "V_STAGES": v_stages,
            "Q_LAYOUT": gl.NVMMASharedLayout.get_default_for([ROWS, d], gl.bfloat16), "KV_LAYOUT": kv_layout(d),
            "REGS": REGS, "num_warps": 4, "maxnreg": MAXNREG}


# 12 warps launched (4 + 4 + 1 + 1, rounded to warpgroups) at MAXNREG registers a thread; then the
# fetching warps give theirs back and the consumer partition takes REGS (the default partition what is left)
MAXNREG, REGS = 168, 240


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor,
           stages: int = 3, v_stages: int = 2) -> None:
    """``gluon_wg.attend`` at 128 rows a program, through this kernel: as a table of one entry (the
    kernel's launch without a table fails to lower in Triton 3.6), the same split rule and merge. The
    row crosses from pinned memory without waiting for the stream (a synchronous copy cost a chunk's
    question about a millisecond at 32k), so the call cannot be captured in a graph: a replay would
    copy whatever that host memory holds then."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("gluon_ws.attend stages its table from host memory: not in a captured graph")
    n, heads, _ = q.shape
    check_kv(keys, values, start + n)
    step = tri.split_len(n * (heads // keys.shape[1]), keys.shape[1], start + n, 2 * ROWS, BN)
    row = torch.tensor([[start, step, -(-(start + n) // step), keys.data_ptr(), values.data_ptr()]]).pin_memory()
    attend_table(q, row.to(q.device, non_blocking=True), keys, out, stages, v_stages)


def attend_table(q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor, stages: int = 3,
                 v_stages: int = 2) -> None:
    """``gluon_wg.attend_table`` at 128 rows a program, through this kernel."""
    entries = table.shape[0]
    rows, heads, d = q.shape
    n, kv = rows // entries, like.shape[1]
    g = heads // kv
    rows_total = n * g
    most = tri.most_splits(rows_total, kv, 2 * ROWS)
    part = torch.empty(entries * most * kv * rows_total, d, device=q.device, dtype=torch.float32)
    lse = torch.empty(entries * most * kv * rows_total, device=q.device, dtype=torch.float32)
    tri.scratch_for_descriptors(q.device)
    _attn_ws_kernel[(triton.cdiv(rows_total, 2 * ROWS), kv, entries * most)](
        q, out, part, lse, table, n, most, q.stride(0), q.stride(1), like.stride(0), out.stride(0), out.stride(1),
        rows_total, d ** -0.5 * tri.LOG2E, **_shapes(g, d, stages, v_stages))
    if most > 1:
        tri.merge_table(part, lse, out, table, n, most, kv, rows_total, g, d)


class SpecialisedAttention(WarpgroupAttention):
    """``gluon-ws`` (``auto`` on a Hopper): this kernel for a table's chunks that ``gluon-wg`` serves,
    with its bits and split rule. A single call keeps ``gluon-wg``'s launch: this kernel's would stage
    a one-entry table from the host (``attend``), which costs a question more (benchmarks/README.md,
    "Attention kernels"); a read's pass, which brings its table, takes this one."""

    name = "gluon-ws"
    priority = 2

    def attend_table(self, q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor) -> None:
        if self.serves(q.device.type, q.dtype, q.shape[2]):
            attend_table(q, table, like, out, self.STAGES, self.V_STAGES)
            return
        super().attend_table(q, table, like, out)
