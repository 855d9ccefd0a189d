"""The gated delta rule's state pass and its output in one Triton kernel (the fast path's last two
GDN launches, after fla's solve and ``recompute_w_u``).

fla runs them as two kernels: its state kernel walks a session's 64-row chunks in order and
stores the state every chunk enters (bf16, ``[B, chunks, HV, K, V]``: 33 MB a layer for 8 sessions
of 512 rows) and the new values ``v_new``; its output kernel reads both back. Here one program
walks the chunks as fla's state kernel does, for one session, one value head and ``BV`` value
columns, and computes each chunk's output from the state in its registers before moving it on:
the per-chunk states and ``v_new`` never reach memory.

The arithmetic is fla's, operation for operation (fla-core 0.6.0, ``chunk_delta_h`` with
``BV`` columns a program, then ``chunk_o``): ``v_new = u - w h`` (bf16 products, fp32 sums),
rounded to bf16 where fla stores it; ``o = (q h) 2^g scale + ([q k^T 2^(g_i - g_j)]_{j<=i}) v_new
scale`` with ``h`` rounded to bf16 as fla stores it and the key dimension summed in two halves in
fla's order; then ``h <- h 2^g_last + k^T (v_new 2^(g_last - g))``. The products' shapes differ
(``BV`` output columns where fla's output kernel takes 64), and still the bits are fla's: on the
H200 at 1 to 16 sessions (``benchmarks/probes/gdn_fused_ab.py``) and against fla's wrapper, a
ragged last chunk and shared key heads included (``tests/backends/test_gpu.py``). So the fast path
may take either form at any batch size (``gdn_fla.use_fused``) without a session's bits moving.

Batch invariance: a program's rows are its session's (``bos = n * T``), its state block is its
own, and nothing it computes depends on the other sessions or on B, so a session's bits are the
same whatever it is read with.

``state_and_output_reference`` is the same computation in fp32 torch, what the kernel is checked
against on the CPU (Triton's interpreter, fp32 products: it multiplies bf16 tiles as raw integers).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

UPCAST = os.environ.get("TRITON_INTERPRET") == "1"
# 32 value columns a program (as fla's pinned state kernel), 4 warps, 2 stages: the fastest launch
# shape on the H200 at 8 and 16 sessions, level with 64 columns (``results/gdn_fused_ab.json``).
# The shape is part of the arithmetic: one stage at 32 or 16 columns does not give fla's bits on an
# H100 (``results/gdn_fused_ab-h100.json``), so a new shape is taken only with its bits checked.
BV, WARPS, STAGES = 32, 4, 2


@triton.jit
def _move_state(h1, h2, k1, k2, b_v, b_g, g, m_t, i_t, T, HV: tl.constexpr, BT: tl.constexpr, DOT: tl.constexpr,
                KEY_DT: tl.constexpr):
    """The state past the chunk: ``h 2^g_last + k^T (v_new 2^(g_last - g))``, ``v_new`` unrounded."""
    last = tl.minimum((i_t + 1) * BT, T) - 1
    g_last = tl.load(g + last * HV).to(tl.float32)
    b_v = b_v * tl.where(m_t, tl.math.exp2(g_last - b_g), 0)[:, None]
    decay = tl.math.exp2(g_last)
    h1 *= decay
    h2 *= decay
    b_v = b_v.to(KEY_DT).to(DOT)
    return tl.dot(k1, b_v, h1), tl.dot(k2, b_v, h2)


@triton.jit
def _state_out_kernel(q, k, u, w, g, o, state, T, scale, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                      V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr,
                      UPDATE_FIRST: tl.constexpr = False):
    tl.static_assert(K == 128)  # two key halves of 64, as fla's blockdim-64 kernels hold them
    pid = tl.program_id(0).to(tl.int64)
    nv = V // BV
    i_v, i_nh = pid % nv, pid // nv
    i_n, i_h = i_nh // HV, i_nh % HV
    bos = i_n * T
    q += (bos * H + i_h // (HV // H)) * K
    k += (bos * H + i_h // (HV // H)) * K
    u += (bos * HV + i_h) * V
    w += (bos * HV + i_h) * K
    o += (bos * HV + i_h) * V
    g += bos * HV + i_h
    state += i_nh * K * V

    o_v = i_v * BV + tl.arange(0, BV)
    o_k1 = tl.arange(0, 64)
    o_k2 = 64 + o_k1
    h1 = tl.load(state + o_k1[:, None] * V + o_v[None, :]).to(tl.float32)
    h2 = tl.load(state + o_k2[:, None] * V + o_v[None, :]).to(tl.float32)
    for i_t in range(tl.cdiv(T, BT)):
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        # the new values: u - w h
        w1 = tl.load(w + o_t[:, None] * (HV * K) + o_k1[None, :], mask=m_t[:, None], other=0.0).to(DOT)
        w2 = tl.load(w + o_t[:, None] * (HV * K) + o_k2[None, :], mask=m_t[:, None], other=0.0).to(DOT)
        hd1 = h1.to(DOT)  # what fla stores of the state, and both its kernels multiply by
        hd2 = h2.to(DOT)
        b_v = tl.dot(w1, hd1)
        b_v = tl.dot(w2, hd2, b_v)
        b_v = tl.load(u + o_t[:, None] * (HV * V) + o_v[None, :], mask=m_t[:, None], other=0.0) - b_v
        v_new = b_v.to(u.dtype.element_ty).to(DOT)  # rounded as fla stores it for its output kernel
        if UPDATE_FIRST:  # the state's chain first; the output (off the chain) after it
            k1 = tl.load(k + o_k1[:, None] + o_t[None, :] * (H * K), mask=m_t[None, :], other=0.0).to(DOT)
            k2 = tl.load(k + o_k2[:, None] + o_t[None, :] * (H * K), mask=m_t[None, :], other=0.0).to(DOT)
            b_g = tl.load(g + o_t * HV, mask=m_t, other=0.0).to(tl.float32)
            h1, h2 = _move_state(h1, h2, k1, k2, b_v, b_g, g, m_t, i_t, T, HV, BT, DOT, k.dtype.element_ty)
        # the chunk's output, from the state it entered and its new values
        q1 = tl.load(q + o_t[:, None] * (H * K) + o_k1[None, :], mask=m_t[:, None], other=0.0).to(DOT)
        q2 = tl.load(q + o_t[:, None] * (H * K) + o_k2[None, :], mask=m_t[:, None], other=0.0).to(DOT)
        if not UPDATE_FIRST:
            k1 = tl.load(k + o_k1[:, None] + o_t[None, :] * (H * K), mask=m_t[None, :], other=0.0).to(DOT)
            k2 = tl.load(k + o_k2[:, None] + o_t[None, :] * (H * K), mask=m_t[None, :], other=0.0).to(DOT)
        b_o = tl.dot(q1, hd1)
        b_a = tl.dot(q1, k1)
        b_o = tl.dot(q2, hd2, b_o)
        b_a = tl.dot(q2, k2, b_a)
        if not UPDATE_FIRST:
            b_g = tl.load(g + o_t * HV, mask=m_t, other=0.0).to(tl.float32)
        b_o = b_o * tl.math.exp2(b_g)[:, None]
        b_a = b_a * tl.math.exp2(b_g[:, None] - b_g[None, :])
        b_a = tl.where((o_t[:, None] >= o_t[None, :]) & (m_t[:, None] & m_t[None, :]), b_a, 0)
        b_o = b_o * scale + tl.dot(b_a.to(DOT), v_new) * scale
        tl.store(o + o_t[:, None] * (HV * V) + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_t[:, None])
        if not UPDATE_FIRST:
            h1, h2 = _move_state(h1, h2, k1, k2, b_v, b_g, g, m_t, i_t, T, HV, BT, DOT, k.dtype.element_ty)
    tl.store(state + o_k1[:, None] * V + o_v[None, :], h1.to(state.dtype.element_ty))
    tl.store(state + o_k2[:, None] * V + o_v[None, :], h2.to(state.dtype.element_ty))


def fits(key_dim: int, value_dim: int, bv: int = BV, rows: int = 64) -> bool:
    """Whether the kernel is written for these head dims (Qwen3.5's 128 and 128 are) and this many
    rows a session. Not one: at one row (a batched decode step) the compiled kernel made an illegal
    memory access on an H100 (2, 16 sessions; 16 and 32 value heads) or gave other bits than fla's
    (2 sessions, 32 heads), while 3, 64 and 512 rows gave fla's bits (cb9588a). Triton compiles an
    integer argument equal to 1 as a constant, so one row is a kernel of its own."""
    return key_dim == 128 and value_dim % bv == 0 and rows != 1


def state_and_output(q: torch.Tensor, k: torch.Tensor, u: torch.Tensor, w: torch.Tensor, g_sums: torch.Tensor,
                     state: torch.Tensor, out: torch.Tensor, bv: int = BV, warps: int = WARPS,
                     stages: int = STAGES, update_first: bool = False) -> None:
    """B sessions of T rows each (fla's batch axis): q, k ``[B, T, H, K]``, u ``[B, T, HV, V]``, w
    ``[B, T, HV, K]``, g_sums ``[B, T, HV]`` fp32 (the gate summed within 64-row chunks, log2 units),
    state ``[B, HV, K, V]`` fp32, moved on in place (each program reads its block before it writes
    it, and no two share one); writes o into ``out`` ``[B, T, HV, V]``. ``update_first`` moves the
    state on before each chunk's output is computed: the same operations on the same values, a
    schedule to time (``benchmarks/probes/gdn_fused_ab.py``)."""
    b, t, h, dk = k.shape
    hv, dv = u.shape[2], u.shape[3]
    for x in (q, k, u, w, g_sums, state, out):
        if not x.is_contiguous():
            raise ValueError(f"state_and_output takes contiguous tensors, got strides {x.stride()}")
    if not fits(dk, dv, bv, rows=t) or state.shape != (b, hv, dk, dv):
        raise ValueError(f"state_and_output is written for key dim 128, whole {bv}-column value blocks and "
                         f"more than one row a session; got k {list(k.shape)}, u {list(u.shape)}, "
                         f"state {list(state.shape)}")
    dot = tl.float32 if UPCAST else tl.bfloat16
    _state_out_kernel[(dv // bv * b * hv,)](q, k, u, w, g_sums, out, state, t, dk ** -0.5, H=h, HV=hv, K=dk, V=dv,
                                           BT=64, BV=bv, DOT=dot, UPDATE_FIRST=update_first, num_warps=warps,
                                           num_stages=stages)


def state_and_output_reference(q: torch.Tensor, k: torch.Tensor, u: torch.Tensor, w: torch.Tensor,
                               g_sums: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same in fp32 torch, chunk by chunk: (o ``[B, T, HV, V]``, the final state)."""
    t, h, dk = k.shape[1:]
    hv = u.shape[2]
    rep = hv // h
    qf, kf = (x.float().repeat_interleave(rep, dim=2) for x in (q, k))  # [B, T, HV, K]
    uf, wf, gf = u.float(), w.float(), g_sums.float()
    s = state.float().clone()
    out = torch.empty_like(uf)
    for c in range(0, t, 64):
        rows = slice(c, min(c + 64, t))
        qc, kc, uc, wc, gc = (x[:, rows].transpose(1, 2) for x in (qf, kf, uf, wf, gf))  # heads before rows
        v_new = uc - wc @ s
        decay = gc[..., :, None] - gc[..., None, :]
        causal = torch.ones(decay.shape[-2:], dtype=torch.bool, device=decay.device).tril()
        a = torch.where(causal, (qc @ kc.transpose(-1, -2)) * torch.exp2(decay), 0.0)
        o = ((qc @ s) * torch.exp2(gc)[..., None] + a @ v_new) * dk ** -0.5
        out[:, rows] = o.transpose(1, 2)
        g_last = gc[..., -1:]
        s = s * torch.exp2(g_last)[..., None] + kc.transpose(-1, -2) @ (v_new * torch.exp2(g_last - gc)[..., None])
    return out, s
