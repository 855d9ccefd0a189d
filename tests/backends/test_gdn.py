"""The chunked torch gated delta rule against the token-by-token oracle."""

from __future__ import annotations

import pytest
import torch

from shadow.backends.qwen35.gdn import gated_delta_rule, gated_delta_rule_chunked, gated_delta_rule_loop


def _inputs(length: int, hk: int, hv: int, dk: int, dv: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(length, hk, dk, generator=gen).to(dtype)
    k = torch.randn(length, hk, dk, generator=gen).to(dtype)
    v = torch.randn(length, hv, dv, generator=gen).to(dtype)
    # Real gates: -exp(A_log) * softplus(a + dt_bias), with a spread of slow and fast decays.
    g = -torch.empty(length, hv).uniform_(0.01, 3.0, generator=gen)
    beta = torch.sigmoid(torch.randn(length, hv, generator=gen)).to(dtype)
    state = torch.randn(hv, dk, dv, generator=gen) * 0.1
    return q, k, v, g, beta, state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("length", [1, 3, 63, 64, 65, 200, 513])
@pytest.mark.parametrize(("hk", "hv"), [(2, 2), (2, 4)], ids=["heads-equal", "gva"])
def test_chunked_equals_loop(dtype, length, hk, hv):
    q, k, v, g, beta, state = _inputs(length, hk, hv, 16, 24, dtype, seed=length)
    o_ref, s_ref = gated_delta_rule_loop(q, k, v, g, beta, state)
    o, s = gated_delta_rule_chunked(q, k, v, g, beta, state)
    assert o.dtype == dtype and s.dtype == torch.float32
    assert o.shape == (length, hv, 24) and s.shape == (hv, 16, 24)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)


def test_state_carries_across_calls():
    q, k, v, g, beta, state = _inputs(300, 2, 4, 16, 16, torch.float32, seed=9)
    o_all, s_all = gated_delta_rule_chunked(q, k, v, g, beta, state)
    o1, s1 = gated_delta_rule_chunked(q[:128], k[:128], v[:128], g[:128], beta[:128], state)
    o2, s2 = gated_delta_rule_chunked(q[128:], k[128:], v[128:], g[128:], beta[128:], s1)
    torch.testing.assert_close(torch.cat([o1, o2]), o_all, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s2, s_all, rtol=1e-5, atol=1e-5)


def test_dispatch_on_cpu_is_the_chunked_form():
    args = _inputs(70, 2, 2, 16, 16, torch.float32, seed=1)
    o1, s1 = gated_delta_rule(*args)
    o2, s2 = gated_delta_rule_chunked(*args)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_same_inputs_same_bits():
    args = _inputs(512, 2, 4, 16, 16, torch.bfloat16, seed=5)
    o1, s1 = gated_delta_rule_chunked(*args)
    o2, s2 = gated_delta_rule_chunked(*args)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
