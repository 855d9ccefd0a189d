"""The fast path's fused kernels (Triton), one launch where the torch forward takes five to ten.

Each kernel computes what a few lines of ``model.py`` compute, in fp32 inside the kernel and
rounded once at the end, so its bits differ from the torch forward's by bf16 rounding only; the
tests compare each with the torch lines it replaces. Every launch has a fixed configuration (no
autotuning): the same shape always runs the same code, in every process, which is what keeps a
session read over many turns bit-equal to a fresh prefill on this path.

Rows are tokens. Inputs are read through their row stride, so the kernels can read straight out
of the merged projections (``fast/forward.py``) without a copy. ``valid`` is a 1-element int tensor, the
number of real rows: rows at or above it are padding that must leave the recurrent state alone
(a question padded to a captured size). Being a tensor, it changes without a new capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _pow2(n: int) -> int:
    return triton.next_power_of_2(n)


# Rows per program of the row-wise kernels. One on the GPU: a row already fills a program there.
# Under Triton's interpreter (the CPU tests) every program costs milliseconds, so it takes many.
ROWS = 1 if torch.cuda.is_available() else 16
# The per-head kernels (a head is 128-256 wide) take a few rows even on the GPU.
HEAD_ROWS = 4 if torch.cuda.is_available() else 16


# ---- RMSNorm (Qwen3.5's 1 + w form), optionally after the residual add -------------------------


@triton.jit
def _rms_norm_kernel(x_ptr, delta_ptr, w_ptr, out_ptr, R, D, stride_x, stride_delta, stride_out, eps,
                     ADD: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS))[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    m = (row < R) & (cols < D)
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    # loaded before the stream's store, which the compiler may not move a load above: after it, the
    # weight's load would wait for the row's
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0)  # 1 + weight, fp32
    if ADD:
        d = tl.load(delta_ptr + row * stride_delta + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)  # the stream stays in model dtype
        tl.store(x_ptr + row * stride_x + cols, x, mask=m)
    xf = x.to(tl.float32)
    y = xf * tl.rsqrt(tl.sum(xf * xf, axis=1)[:, None] / D + eps)
    tl.store(out_ptr + row * stride_out + cols, (y * w).to(out_ptr.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, w1p: torch.Tensor, eps: float, out: torch.Tensor,
             add: torch.Tensor | None = None) -> None:
    """``out = rmsnorm(x) * w1p``; with ``add``, first ``x += add`` in place (the residual stream)."""
    rows, d = x.shape
    delta = x if add is None else add
    _rms_norm_kernel[(triton.cdiv(rows, ROWS),)](x, delta, w1p, out, rows, d, x.stride(0), delta.stride(0),
                                                 out.stride(0), eps, ADD=add is not None, ROWS=ROWS,
                                                 BLOCK=_pow2(d), num_warps=4)


# ---- MLP: silu(gate) * up ------------------------------------------------------------------


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, R, inter, stride_gu, stride_out, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS))[:, None]
    cols = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]
    m = (row < R) & (cols < inter)
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + inter + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor) -> None:
    """``out = silu(gate_up[:, :I]) * gate_up[:, I:]`` with ``I = out.shape[1]``."""
    rows, inter = out.shape
    block = 1024
    _silu_mul_kernel[(triton.cdiv(rows, ROWS), triton.cdiv(inter, block))](
        gate_up, out, rows, inter, gate_up.stride(0), out.stride(0), ROWS=ROWS, BLOCK=block, num_warps=4)


# ---- full attention: q/k norm and partial RoPE; the output gate --------------------------------


@triton.jit
def _qk_norm_rope_kernel(proj_ptr, qn_ptr, kn_ptr, inv_freq_ptr, start_ptr, q_ptr, k_ptr, v_ptr, R, SEG,
                         stride_proj, H, KVH, HD, RD, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                         ROT: tl.constexpr):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS))[:, None]
    head = tl.program_id(1)  # [0, H) queries, [H, H + KVH) keys, [H + KVH, H + 2 KVH) values
    cols = tl.arange(0, BLOCK)[None, :]
    mr = row < R
    m = mr & (cols < HD)
    base = proj_ptr + row * stride_proj
    if head < H + KVH:
        if head < H:
            src = base + head * 2 * HD  # q_proj interleaves [q | gate] per head
            w_ptr = qn_ptr
            dst = q_ptr + (row * H + head) * HD
        else:
            src = base + H * 2 * HD + (head - H) * HD
            w_ptr = kn_ptr
            dst = k_ptr + (row * KVH + head - H) * HD
        # every load before the first store, which the compiler may not move a load above
        xf = tl.load(src + cols, mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < HD, other=0.0)
        # The rotated columns apart, in a tile of their own: the cosine and sine (the kernel's
        # costliest arithmetic) run on RD columns, not the whole head. Same operations on the same
        # values as the whole-head form, so the same bits.
        rc = tl.arange(0, ROT)[None, :]
        half = RD // 2
        rot = rc < RD
        mrot = mr & rot
        partner = tl.where(rc < half, rc + half, rc - half)
        xr = tl.load(src + rc, mask=mrot, other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + rc, mask=rot, other=0.0)
        pf = tl.load(src + partner, mask=mrot, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=rot, other=0.0)
        # row r is row r % SEG of session r // SEG, which starts at its own position
        pos = (tl.load(start_ptr + row // SEG, mask=mr, other=0) + row % SEG).to(tl.float32)
        inv = tl.load(inv_freq_ptr + (rc % half), mask=rot, other=0.0)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=1)[:, None] / HD + eps)
        y = xf * rstd * w
        tl.store(dst + cols, y.to(q_ptr.dtype.element_ty), mask=m & (cols >= RD))
        yr = xr * rstd * wr
        py = pf * rstd * wp
        freq = pos * inv
        rotated = tl.where(rc < half, -py, py)
        tl.store(dst + rc, (yr * tl.cos(freq) + rotated * tl.sin(freq)).to(q_ptr.dtype.element_ty), mask=mrot)
    else:
        j = head - H - KVH
        x = tl.load(base + H * 2 * HD + KVH * HD + j * HD + cols, mask=m, other=0.0)
        tl.store(v_ptr + (row * KVH + j) * HD + cols, x, mask=m)


def qk_norm_rope(proj: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, inv_freq: torch.Tensor,
                 start: torch.Tensor, eps: float, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 seg: int | None = None) -> None:
    """From the merged projection ``[q|gate per head, k, v]``: normalised, rotated q [n,H,hd] and
    k [n,KVH,hd], and v [n,KVH,hd]. The rows are sessions of ``seg`` rows each (all of them, one
    session, by default); ``start[b]`` is the position of session b's first row."""
    rows, heads, hd = q.shape
    kvh = k.shape[1]
    rd = 2 * inv_freq.shape[0]
    _qk_norm_rope_kernel[(triton.cdiv(rows, HEAD_ROWS), heads + 2 * kvh)](
        proj, q_norm, k_norm, inv_freq, start, q, k, v, rows, seg or rows, proj.stride(0), heads, kvh, hd,
        rd, eps, ROWS=HEAD_ROWS, BLOCK=_pow2(hd), ROT=_pow2(rd), num_warps=4)


@triton.jit
def _gate_kernel(attn_ptr, proj_ptr, out_ptr, R, stride_proj, H, HD, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS))[:, None]
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK)[None, :]
    m = (row < R) & (cols < HD)
    a = tl.load(attn_ptr + (row * H + head) * HD + cols, mask=m, other=0.0).to(tl.float32)
    g = tl.load(proj_ptr + row * stride_proj + head * 2 * HD + HD + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + (row * H + head) * HD + cols, (a * tl.sigmoid(g)).to(out_ptr.dtype.element_ty), mask=m)


def output_gate(attn: torch.Tensor, proj: torch.Tensor, out: torch.Tensor) -> None:
    """``out = attn * sigmoid(gate)``, attn and out [n, H, hd] contiguous, gate read from ``proj``."""
    rows, heads, hd = attn.shape
    _gate_kernel[(triton.cdiv(rows, HEAD_ROWS), heads)](attn, proj, out, rows, proj.stride(0), heads, hd,
                                                        ROWS=HEAD_ROWS, BLOCK=_pow2(hd), num_warps=4)


# ---- Gated DeltaNet: conv + SiLU with its state, the gates, the gated output norm ---------------


@triton.jit
def _held_or_new(proj_ptr, state_ptr, c, mc, r, stride_proj, KERNEL: tl.constexpr):
    """Row ``r`` of [held columns | new rows] as fp32 over channels ``c``: held column ``r + KERNEL``
    of the state when ``r < 0``, else new row ``r``. Two masked loads, each contiguous."""
    rows = c * 0 + r  # the row as a vector: a mask of a tensor and a scalar test fails Triton 3.9's interpreter
    held = tl.load(state_ptr + c * KERNEL + (r + KERNEL), mask=mc & (rows < 0), other=0.0)
    new = tl.load(proj_ptr + r * stride_proj + c, mask=mc & (rows >= 0), other=0.0)
    return held.to(tl.float32) + new.to(tl.float32)


@triton.jit
def _new_row(proj_ptr, c, mc, t, i: tl.constexpr, first, SEG, n, stride_proj, BLOCK_T: tl.constexpr):
    """Row ``t + i`` of the block's session as fp32 (zero past the session's rows, the launch's
    rows, or the block's ``BLOCK_T``)."""
    rows = c * 0 + t + i
    real = mc & (rows < SEG) & (first + rows < n) & (i < BLOCK_T)
    return tl.load(proj_ptr + (t + i) * stride_proj + c, mask=real, other=0.0).to(tl.float32), real


@triton.jit
def _conv_out(xa, xb, xc, xd, w0, w1, w2, w3, region):
    acc = xa * w0 + xb * w1 + xc * w2 + xd * w3
    y = acc * tl.sigmoid(acc)
    if region < 2:  # q and k leave l2-normalised per head, as the rule wants them (fla's l2norm, eps 1e-6)
        y = y * tl.rsqrt(tl.sum(y * y, axis=0) + 1e-6)
    return y


@triton.jit
def _conv_silu_kernel(proj_ptr, state_ptr, w_ptr, out_ptr, valid_ptr, n, SEG, C, KD, stride_proj, stride_state,
                      KERNEL: tl.constexpr, BLOCK_T: tl.constexpr, HEAD: tl.constexpr):
    # One program: one head's channels over BLOCK_T (at most 8) rows of one session. Every load is
    # issued before any store: a store may alias a later load as far as the compiler knows, so a
    # walk that stored each row as it went waited a memory round trip a row (PTX for sm_90: load and
    # store alternating; timed against it in probes/loads_first.py). The arithmetic is the walk's. Rows
    # are sessions of SEG rows, each after its own held columns: a session's arithmetic is the same
    # whichever sessions share the launch.
    tl.static_assert(KERNEL == 4)
    tl.static_assert(BLOCK_T <= 8)
    g0 = tl.program_id(0) * BLOCK_T
    sess = g0 // SEG
    t0 = g0 - sess * SEG  # the block's first row within its session (blocks never straddle two)
    first = sess * SEG
    proj_ptr += first * stride_proj
    state_ptr += sess * stride_state
    c = tl.program_id(1) * HEAD + tl.arange(0, HEAD)
    mc = c < C
    w0 = tl.load(w_ptr + c * KERNEL + 0, mask=mc, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + c * KERNEL + 1, mask=mc, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + c * KERNEL + 2, mask=mc, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + c * KERNEL + 3, mask=mc, other=0.0).to(tl.float32)
    xa = _held_or_new(proj_ptr, state_ptr, c, mc, t0 - 3, stride_proj, KERNEL)
    xb = _held_or_new(proj_ptr, state_ptr, c, mc, t0 - 2, stride_proj, KERNEL)
    xc = _held_or_new(proj_ptr, state_ptr, c, mc, t0 - 1, stride_proj, KERNEL)
    x0, m0 = _new_row(proj_ptr, c, mc, t0, 0, first, SEG, n, stride_proj, BLOCK_T)
    x1, m1 = _new_row(proj_ptr, c, mc, t0, 1, first, SEG, n, stride_proj, BLOCK_T)
    x2, m2 = _new_row(proj_ptr, c, mc, t0, 2, first, SEG, n, stride_proj, BLOCK_T)
    x3, m3 = _new_row(proj_ptr, c, mc, t0, 3, first, SEG, n, stride_proj, BLOCK_T)
    x4, m4 = _new_row(proj_ptr, c, mc, t0, 4, first, SEG, n, stride_proj, BLOCK_T)
    x5, m5 = _new_row(proj_ptr, c, mc, t0, 5, first, SEG, n, stride_proj, BLOCK_T)
    x6, m6 = _new_row(proj_ptr, c, mc, t0, 6, first, SEG, n, stride_proj, BLOCK_T)
    x7, m7 = _new_row(proj_ptr, c, mc, t0, 7, first, SEG, n, stride_proj, BLOCK_T)
    region = tl.program_id(1) * HEAD // KD  # 0 q, 1 k, 2 and above v
    # out is [q (n*KD) | k (n*KD) | v (n*VD)], each block contiguous by rows over every session, as
    # fla wants them (its batch axis is the sessions)
    width = tl.where(region >= 2, C - 2 * KD, KD)
    base = out_ptr + tl.minimum(region, 2) * n * KD + (c - tl.minimum(region, 2) * KD) + (first + t0) * width
    dt = out_ptr.dtype.element_ty
    tl.store(base + 0 * width, _conv_out(xa, xb, xc, x0, w0, w1, w2, w3, region).to(dt), mask=m0)
    tl.store(base + 1 * width, _conv_out(xb, xc, x0, x1, w0, w1, w2, w3, region).to(dt), mask=m1)
    tl.store(base + 2 * width, _conv_out(xc, x0, x1, x2, w0, w1, w2, w3, region).to(dt), mask=m2)
    tl.store(base + 3 * width, _conv_out(x0, x1, x2, x3, w0, w1, w2, w3, region).to(dt), mask=m3)
    tl.store(base + 4 * width, _conv_out(x1, x2, x3, x4, w0, w1, w2, w3, region).to(dt), mask=m4)
    tl.store(base + 5 * width, _conv_out(x2, x3, x4, x5, w0, w1, w2, w3, region).to(dt), mask=m5)
    tl.store(base + 6 * width, _conv_out(x3, x4, x5, x6, w0, w1, w2, w3, region).to(dt), mask=m6)
    tl.store(base + 7 * width, _conv_out(x4, x5, x6, x7, w0, w1, w2, w3, region).to(dt), mask=m7)
    if t0 == 0:
        # The state moves on here, in the one program that read it: the new held columns are
        # columns [valid, valid + KERNEL) of [state | new rows], all read before any is written.
        # (Read after the stores, a round trip more for one program in 64 of a session's; read
        # with the rows, every program's masked loads cost the CPU tests' interpreter a third more.)
        valid = tl.load(valid_ptr)
        n0 = _held_or_new(proj_ptr, state_ptr, c, mc, valid - 4, stride_proj, KERNEL)
        n1 = _held_or_new(proj_ptr, state_ptr, c, mc, valid - 3, stride_proj, KERNEL)
        n2 = _held_or_new(proj_ptr, state_ptr, c, mc, valid - 2, stride_proj, KERNEL)
        n3 = _held_or_new(proj_ptr, state_ptr, c, mc, valid - 1, stride_proj, KERNEL)
        tl.debug_barrier()
        sdt = state_ptr.dtype.element_ty
        tl.store(state_ptr + c * KERNEL + 0, n0.to(sdt), mask=mc)
        tl.store(state_ptr + c * KERNEL + 1, n1.to(sdt), mask=mc)
        tl.store(state_ptr + c * KERNEL + 2, n2.to(sdt), mask=mc)
        tl.store(state_ptr + c * KERNEL + 3, n3.to(sdt), mask=mc)


def conv_silu(proj: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, key_dim: int, head: int,
              valid: torch.Tensor, out: torch.Tensor, block_t: int = 8, warps: int = 1) -> None:
    """The depthwise causal conv and SiLU over ``proj[:, :C]`` after the held columns ``state``
    [C, kernel]; writes [q | k | v] blocks into ``out`` (q and k l2-normalised per ``head``
    channels) and moves ``state`` on by ``valid`` rows, in one launch. With ``state`` of shape
    [B, C, kernel] the rows are B sessions of n / B rows each, every one after its own held
    columns and moved on by ``valid`` of its own rows."""
    if state.dim() == 2:
        state = state[None]
    sessions, c, kernel = state.shape
    n = proj.shape[0]
    seg = n // sessions
    if kernel != 4:
        raise ValueError(f"the fused conv is written for a kernel of 4 columns, the model has {kernel}")
    if key_dim % head or (c - 2 * key_dim) % head:
        raise ValueError(f"conv channels ({key_dim}, {c - 2 * key_dim}) are not whole heads of {head}")
    if seg * sessions != n or (sessions > 1 and seg % block_t):
        raise ValueError(f"{n} rows are not {sessions} sessions of whole {block_t}-row blocks")
    _conv_silu_kernel[(sessions * triton.cdiv(seg, block_t), c // head)](
        proj, state, weight, out, valid, n, triton.cdiv(seg, block_t) * block_t, c, key_dim, proj.stride(0),
        state.stride(0), KERNEL=kernel, BLOCK_T=block_t, HEAD=head, num_warps=warps)


def conv_silu_torch(proj: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, key_dim: int, head: int,
                    valid: torch.Tensor, out: torch.Tensor) -> None:
    """``conv_silu`` in torch, for the fast path off CUDA: the same taps in the same order, in fp32,
    rounded once. Under Triton's interpreter the kernel took 504 of the 548 s of the CPU replay test
    (``test_fast_path_replay_equals_fresh_and_forks_are_pure``, cProfile); its own tests keep running it.
    Every operation is per element or per row's head, so a session's bits do not depend on the
    sessions beside it."""
    if state.dim() == 2:
        state = state[None]
    sessions, c, kernel = state.shape
    n = proj.shape[0]
    seg = n // sessions
    if seg * sessions != n:
        raise ValueError(f"{n} rows are not {sessions} sessions of whole rows")
    cols = torch.cat((state, proj[:, :c].reshape(sessions, seg, c).transpose(1, 2)), dim=2)  # [B, C, kernel + seg]
    w = weight.float()
    acc = cols[..., 1:1 + seg].float() * w[:, 0, None]
    for j in range(1, kernel):
        acc = acc + cols[..., j + 1:j + 1 + seg].float() * w[:, j, None]
    y = (acc * torch.sigmoid(acc)).transpose(1, 2).contiguous()  # [B, seg, C]
    qk = y[..., :2 * key_dim].reshape(sessions, seg, -1, head)
    qk = qk * torch.rsqrt((qk * qk).sum(-1, keepdim=True) + 1e-6)  # fla's l2norm, as the kernel's
    y = y.to(out.dtype)
    y[..., :2 * key_dim] = qk.flatten(-2).to(out.dtype)
    out[:2 * n * key_dim].view(2, n, key_dim).copy_(y[..., :2 * key_dim].reshape(n, 2, key_dim).transpose(0, 1))
    out[2 * n * key_dim:].view(n, c - 2 * key_dim).copy_(y[..., 2 * key_dim:].reshape(n, -1))
    real = int(valid.reshape(-1)[0])
    state.copy_(cols[..., real:real + kernel])  # the held columns after the real rows


# fla's chunked GDN kernels take the gate as a running sum within each 64-row chunk, in log2 units
FLA_CHUNK = 64


@triton.jit
def _gates_kernel(proj_ptr, neg_a_ptr, dt_bias_ptr, valid_ptr, g_ptr, beta_ptr, R, SEG, stride_proj, b_off, a_off,
                  HV, ROWS: tl.constexpr, BLOCK: tl.constexpr, CUMSUM: tl.constexpr):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS))[:, None]
    h = tl.arange(0, BLOCK)[None, :]
    m = (row < R) & (h < HV)
    keep = row % SEG < tl.load(valid_ptr)  # valid counts each session's own rows
    b = tl.load(proj_ptr + row * stride_proj + b_off + h, mask=m, other=0.0).to(tl.float32)
    a = tl.load(proj_ptr + row * stride_proj + a_off + h, mask=m, other=0.0).to(tl.float32)
    x = a + tl.load(dt_bias_ptr + h, mask=h < HV, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
    g = tl.load(neg_a_ptr + h, mask=h < HV, other=0.0) * softplus
    # padding rows: no decay and no write, so the state passes them unchanged
    g = tl.where(keep & m, g, 0.0)
    if CUMSUM:  # the program's rows are one chunk: the running sum fla's kernels want, in log2 units
        g = tl.cumsum(g, axis=0) * 1.4426950408889634
    tl.store(g_ptr + row * HV + h, g, mask=m)
    tl.store(beta_ptr + row * HV + h, tl.where(keep, tl.sigmoid(b), 0.0).to(beta_ptr.dtype.element_ty), mask=m)


def gates(proj: torch.Tensor, b_off: int, a_off: int, neg_a: torch.Tensor, dt_bias: torch.Tensor,
          valid: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, chunk_sums: bool = False,
          seg: int | None = None) -> None:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` (fp32) and ``beta = sigmoid(b)``, per row and value head.
    ``chunk_sums``: g leaves as fla's chunked kernels take it, summed within each ``FLA_CHUNK`` rows
    and times 1/ln 2 (what fla's own cumsum launch would do, here in the same launch). Rows are
    sessions of ``seg`` rows (one session by default; a multiple of ``FLA_CHUNK`` when several),
    the first ``valid`` of each real."""
    rows, hv = g.shape
    per = FLA_CHUNK if chunk_sums else 16
    _gates_kernel[(triton.cdiv(rows, per),)](proj, neg_a, dt_bias, valid, g, beta, rows, seg or rows,
                                             proj.stride(0), b_off, a_off, hv, ROWS=per, BLOCK=_pow2(hv),
                                             CUMSUM=chunk_sums, num_warps=1 if not chunk_sums else 2)


@triton.jit
def _gated_norm_kernel(o_ptr, proj_ptr, w_ptr, out_ptr, R, stride_proj, z_off, HV, DV, eps, ROWS: tl.constexpr,
                       BLOCK: tl.constexpr):
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS))[:, None]
    head = tl.program_id(1)
    cols = tl.arange(0, BLOCK)[None, :]
    m = (row < R) & (cols < DV)
    o = tl.load(o_ptr + (row * HV + head) * DV + cols, mask=m, other=0.0).to(tl.float32)
    z = tl.load(proj_ptr + row * stride_proj + z_off + head * DV + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < DV, other=0.0).to(tl.float32)
    y = o * tl.rsqrt(tl.sum(o * o, axis=1)[:, None] / DV + eps) * w * (z * tl.sigmoid(z))
    tl.store(out_ptr + (row * HV + head) * DV + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def gated_norm(o: torch.Tensor, proj: torch.Tensor, z_off: int, weight: torch.Tensor, eps: float,
               out: torch.Tensor) -> None:
    """The GDN output norm: ``rmsnorm(o) * w * silu(z)`` per value head; o [n, HV, dv], out [n, HV*dv]."""
    rows, hv, dv = o.shape
    _gated_norm_kernel[(triton.cdiv(rows, HEAD_ROWS), hv)](o, proj, weight, out, rows, proj.stride(0), z_off, hv,
                                                           dv, eps, ROWS=HEAD_ROWS, BLOCK=_pow2(dv), num_warps=4)


# ---- sessions' states into the static slots and back -----------------------------------------


@triton.jit
def _copy_slots_kernel(sources_ptr, static_ptr, per_layer, layer_stride, INTO: tl.constexpr, BLOCK: tl.constexpr):
    b, layer, blk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    address = tl.load(sources_ptr + b)
    if address == 0:  # nothing staged: this session's state moves another way (or the pass is a capture's)
        return
    own = address.to(tl.pointer_type(static_ptr.dtype.element_ty))
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    m = offs < per_layer
    own_at = own + layer.to(tl.int64) * per_layer + offs
    static_at = static_ptr + layer.to(tl.int64) * layer_stride + b * per_layer + offs
    if INTO:
        tl.store(static_at, tl.load(own_at, mask=m), mask=m)
    else:
        tl.store(own_at, tl.load(static_at, mask=m), mask=m)


def copy_slots(static: torch.Tensor, sources: torch.Tensor, into: bool) -> None:
    """Session b's stacked state (``[layers, ...]``, contiguous, at the address ``sources[b]``) into
    slot b of ``static`` (``[layers, slots, ...]``, contiguous), or back: every session's layers in
    one launch, where a ``copy_`` a session runs strided at half the bandwidth
    (``benchmarks/probes/pass_levers.py``). A session whose address is 0 is left alone, so the
    launch can sit in a captured graph and the addresses change with what is staged."""
    layers, per_layer = static.shape[0], static[0, 0].numel()
    block = 4096
    _copy_slots_kernel[(sources.shape[0], layers, triton.cdiv(per_layer, block))](
        sources, static, per_layer, static.stride(0), INTO=into, BLOCK=block, num_warps=4)
