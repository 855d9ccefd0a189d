"""The gated delta rule of Qwen3.5's Gated-DeltaNet layers, for one sequence.

Shapes (one session, no batch axis):

    q, k   [T, Hk, dk]   model dtype, before the l2 norm (the rule normalises them in fp32)
    v      [T, Hv, dv]   model dtype; value head j reads key head j // (Hv // Hk)
    g      [T, Hv]       fp32 log-decay (<= 0)
    beta   [T, Hv]       model dtype, in (0, 1)
    state  [Hv, dk, dv]  fp32 recurrent state S
    ->  o  [T, Hv, dv]   in v's dtype, and the new state [Hv, dk, dv] fp32

Per token (docs/model.md, "Gated-DeltaNet"): S <- S * exp(g_t); delta = beta_t (v_t - S^T k_t); S <- S + k_t delta^T;
o_t = S^T q_t, with q and k l2-normalised and q scaled by dk^-1/2.

``gated_delta_rule`` is the one entry point: the fla Triton kernels on CUDA (``gdn_fla``), the
chunked torch form elsewhere. ``gated_delta_rule_loop`` is the token-by-token oracle for tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # the torch form's block; the session grid (512) is a multiple, so blocks never straddle it


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def _prepare(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, normalized: bool = False
) -> tuple[torch.Tensor, ...]:
    """fp32, heads first, q and k normalised (unless they come ``normalized``) and expanded to the value heads."""
    rep = v.shape[1] // k.shape[1]
    qf = (q.float() if normalized else _l2norm(q.float())) * (q.shape[-1] ** -0.5)
    kf = k.float() if normalized else _l2norm(k.float())
    if rep > 1:
        qf = qf.repeat_interleave(rep, dim=1)
        kf = kf.repeat_interleave(rep, dim=1)
    return (
        qf.transpose(0, 1),  # [H, T, dk]
        kf.transpose(0, 1),
        v.float().transpose(0, 1),  # [H, T, dv]
        g.float().transpose(0, 1),  # [H, T]
        beta.float().transpose(0, 1),
    )


def gated_delta_rule_loop(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule token by token: slow, obviously right, the oracle the fast forms are tested against."""
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta)
    s = state.float().clone()
    out = torch.empty_like(vf)
    for t in range(qf.shape[1]):
        s = s * gf[:, t].exp()[:, None, None]
        recalled = torch.einsum("hkv,hk->hv", s, kf[:, t])
        delta = bf[:, t, None] * (vf[:, t] - recalled)
        s = s + kf[:, t, :, None] * delta[:, None, :]
        out[:, t] = torch.einsum("hkv,hk->hv", s, qf[:, t])
    return out.transpose(0, 1).to(v.dtype), s


def gated_delta_rule_chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, normalized: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule in blocks of CHUNK tokens (the WY form), in fp32 torch.

    Inside a block with cumulative log-decay G and gamma_i = exp(G_i), the deltas solve
    (I + A) delta = beta v - beta gamma (K S0), A_ij = beta_i exp(G_i - G_j) k_i.k_j (j < i),
    so delta = U - W S0 with U, W from one unit-lower-triangular solve per block. Then
    o = (gamma q) S0 + [q_i.k_j exp(G_i - G_j)]_{j<=i} delta and
    S = gamma_C S0 + sum_j exp(G_C - G_j) k_j delta_j^T.
    """
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, normalized)
    heads, length, dk = kf.shape
    dv = vf.shape[-1]
    pad = (-length) % CHUNK
    if pad:  # zero gate and zero beta: padded tokens leave the state as it was
        qf, kf, vf = (F.pad(x, (0, 0, 0, pad)) for x in (qf, kf, vf))
        gf, bf = (F.pad(x, (0, pad)) for x in (gf, bf))
    n = (length + pad) // CHUNK
    qc, kc, vc = (x.reshape(heads, n, CHUNK, -1) for x in (qf, kf, vf))
    bc = bf.reshape(heads, n, CHUNK, 1)
    cum = gf.reshape(heads, n, CHUNK).cumsum(-1)  # G

    above = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=qf.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(above, float("-inf")).exp()  # exp(G_i - G_j)
    kb = kc * bc
    system = (kb @ kc.transpose(-1, -2)) * decay  # its diagonal is ignored: the solve is unitriangular
    u = torch.linalg.solve_triangular(system, vc * bc, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * cum.exp()[..., None], upper=False, unitriangular=True)
    attn = (qc @ kc.transpose(-1, -2)) * decay  # [H, n, C, C], zero above the diagonal
    q_decayed = qc * cum.exp()[..., None]
    k_to_end = kc * (cum[..., -1:] - cum).exp()[..., None]
    block_decay = cum[..., -1].exp()[..., None, None]  # [H, n, 1, 1]

    s = state.float()
    out = torch.empty(heads, n, CHUNK, dv, dtype=torch.float32, device=qf.device)
    for i in range(n):
        delta = u[:, i] - w[:, i] @ s
        out[:, i] = q_decayed[:, i] @ s + attn[:, i] @ delta
        s = s * block_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ delta
    o = out.reshape(heads, n * CHUNK, dv)[:, :length]
    return o.transpose(0, 1).to(v.dtype), s.reshape(heads, dk, dv)


def gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule on the best path for the tensors' device: fla's Triton kernels on CUDA (when
    fla is installed), the chunked torch form elsewhere. Same signature and semantics."""
    if q.is_cuda:
        from . import gdn_fla

        if gdn_fla.available():
            return gdn_fla.gated_delta_rule(q, k, v, g, beta, state)
    return gated_delta_rule_chunked(q, k, v, g, beta, state)
