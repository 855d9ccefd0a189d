"""The fused GDN state-and-output kernel against its fp32 torch form (Triton's interpreter on the
CPU, fp32 products), and a session's bits whatever it is batched with."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from shadow.backends.qwen35.gdn_fused import state_and_output, state_and_output_reference


def _inputs(b: int, t: int, h: int, hv: int, dv: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, t, h, 128, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, t, h, 128, generator=gen), dim=-1)
    u = torch.randn(b, t, hv, dv, generator=gen)
    w = torch.randn(b, t, hv, 128, generator=gen) * 0.1
    gates = -torch.empty(b, t, hv).uniform_(0.01, 1.0, generator=gen)
    sums = torch.cat([gates[:, c:c + 64].cumsum(1) for c in range(0, t, 64)], dim=1) * 1.4426950408889634
    state = torch.randn(b, hv, 128, dv, generator=gen) * 0.1
    return q, k, u, w, sums.contiguous(), state


@pytest.mark.parametrize(("t", "h", "hv"), [(128, 2, 2), (100, 2, 4)], ids=["two-chunks", "ragged-gva"])
def test_fused_kernel_matches_its_torch_form(t, h, hv):
    q, k, u, w, g, s0 = _inputs(2, t, h, hv, 64, seed=t + hv)
    o_ref, s_ref = state_and_output_reference(q, k, u, w, g, s0)
    state, out = s0.clone(), torch.empty_like(u)
    state_and_output(q, k, u, w, g, state, out)
    torch.testing.assert_close(out, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, s_ref, rtol=1e-4, atol=1e-4)


def test_a_session_gets_the_same_bits_alone_and_batched():
    q, k, u, w, g, s0 = _inputs(3, 128, 2, 4, 64, seed=7)
    state, out = s0.clone(), torch.empty_like(u)
    state_and_output(q, k, u, w, g, state, out)
    for n in range(3):
        one = slice(n, n + 1)
        alone_state, alone_out = s0[one].clone(), torch.empty_like(u[one])
        state_and_output(q[one], k[one], u[one], w[one], g[one], alone_state, alone_out)
        assert torch.equal(alone_out, out[one]) and torch.equal(alone_state, state[one])


def test_the_state_chain_first_gives_the_same_bits():
    """``update_first`` moves the state before the chunk's output (a schedule to time on the GPU):
    the same operations on the same values, so the same bits, a ragged last chunk included."""
    q, k, u, w, g, s0 = _inputs(2, 100, 2, 4, 64, seed=11)
    forms = []
    for update_first in (False, True):
        state, out = s0.clone(), torch.empty_like(u)
        state_and_output(q, k, u, w, g, state, out, update_first=update_first)
        forms.append((out, state))
    assert torch.equal(forms[0][0], forms[1][0]) and torch.equal(forms[0][1], forms[1][1])


def test_refuses_what_it_was_not_written_for():
    q, k, u, w, g, s0 = _inputs(1, 64, 2, 2, 48, seed=1)
    with pytest.raises(ValueError, match="whole 32-column value blocks"):
        state_and_output(q, k, u, w, g, s0, torch.empty_like(u))
    q, k, u, w, g, s0 = _inputs(2, 1, 2, 2, 64, seed=1)  # one row a session faulted on an H100
    with pytest.raises(ValueError, match="more than one row a session"):
        state_and_output(q, k, u, w, g, s0, torch.empty_like(u))


def test_the_torch_form_is_the_rule_given_fla_s_w_and_u():
    """The reference is the model's rule: with w and u from the WY form (what fla's solve and
    ``recompute_w_u`` compute), it gives ``gated_delta_rule_chunked``'s output and state."""
    from shadow.backends.qwen35.gdn import gated_delta_rule_chunked

    t, h, hv, dv = 128, 2, 4, 32
    gen = torch.Generator().manual_seed(3)
    q = torch.nn.functional.normalize(torch.randn(t, h, 128, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(t, h, 128, generator=gen), dim=-1)
    v = torch.randn(t, hv, dv, generator=gen)
    gates = -torch.empty(t, hv).uniform_(0.01, 1.0, generator=gen)
    beta = torch.rand(t, hv, generator=gen)
    s0 = torch.randn(hv, 128, dv, generator=gen) * 0.1
    o_want, s_want = gated_delta_rule_chunked(q, k, v, gates, beta, s0, normalized=True)

    kh = k.repeat_interleave(hv // h, dim=1).transpose(0, 1)  # [HV, T, K]
    u, w, sums = torch.empty(hv, t, dv), torch.empty(hv, t, 128), torch.empty(hv, t)
    for c in range(0, t, 64):
        rows = slice(c, c + 64)
        cum = gates[rows].T.cumsum(-1)  # [HV, 64], natural log
        kb = kh[:, rows] * beta[rows].T[..., None]
        lower = torch.ones(64, 64, dtype=torch.bool).tril(-1)
        decay = (cum[..., :, None] - cum[..., None, :]).exp()
        system = torch.where(lower, (kb @ kh[:, rows].transpose(-1, -2)) * decay, 0.0) + torch.eye(64)
        vb = v[rows].transpose(0, 1) * beta[rows].T[..., None]
        u[:, rows] = torch.linalg.solve_triangular(system, vb, upper=False)
        w[:, rows] = torch.linalg.solve_triangular(system, kb * cum.exp()[..., None], upper=False)
        sums[:, rows] = cum * 1.4426950408889634
    o, s = state_and_output_reference(q[None], k[None], u.transpose(0, 1)[None], w.transpose(0, 1)[None],
                                      sums.T[None], s0[None])
    torch.testing.assert_close(o[0], o_want.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s[0], s_want, rtol=1e-4, atol=1e-4)


def test_the_fast_path_takes_the_fused_kernel_where_measured_and_where_written_for():
    """From ``FUSED_FROM`` sessions at Qwen3.5's head dims; fla's kernels for one session (faster
    there) and for head dims the kernel is not written for (the tests' tiny models: at 3d23cc0 the
    fused form was taken for them and refused them, failing four GPU tests)."""
    from shadow.backends.qwen35.gdn_fla import FUSED_FROM, use_fused

    assert not use_fused(1, 128, 128, 512)
    assert use_fused(FUSED_FROM, 128, 128, 512) and use_fused(16, 128, 128, 3)
    assert not use_fused(FUSED_FROM - 1, 128, 128, 512)
    assert not use_fused(8, 16, 16, 512) and not use_fused(8, 128, 48, 512)
    assert not use_fused(16, 128, 128, 1)  # a batched decode step: one row a session
