"""The CUDA path: fla's GDN against the torch form, bits that do not move, exact replay on the grid."""

from __future__ import annotations

import random

import pytest
import torch

from shadow import ShadowSettings, build_shadow
from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.backends.qwen35.gdn import gated_delta_rule, gated_delta_rule_chunked

pytestmark = pytest.mark.gpu


def _inputs(length: int, hk: int, hv: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(length, hk, 128, generator=gen, device="cuda").bfloat16() for _ in range(2))
    v = torch.randn(length, hv, 128, generator=gen, device="cuda").bfloat16()
    g = -torch.rand(length, hv, generator=gen, device="cuda") * 2 - 0.01
    beta = torch.rand(length, hv, generator=gen, device="cuda").bfloat16()
    s0 = torch.randn(hv, 128, 128, generator=gen, device="cuda") * 0.05
    return q, k, v, g, beta, s0


@pytest.mark.parametrize(("length", "hk", "hv"), [(37, 16, 16), (512, 16, 16), (1000, 16, 32)])
def test_fla_path_agrees_with_torch_form(length, hk, hv):
    args = _inputs(length, hk, hv, seed=length)
    o, s = gated_delta_rule(*args)  # fla on CUDA
    o_ref, s_ref = gated_delta_rule_chunked(*args)
    assert ((o.float() - o_ref.float()).norm() / o_ref.float().norm()) < 1e-2  # bf16 storage inside fla
    assert ((s - s_ref).norm() / s_ref.norm()) < 1e-2


def test_fla_path_same_inputs_same_bits():
    args = _inputs(2048, 16, 16, seed=3)
    first = gated_delta_rule(*args)
    for _ in range(3):
        again = gated_delta_rule(*args)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_replay_on_cuda_equals_fresh_prefill(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m", demo_text_config(), dtype=torch.bfloat16)
    sh = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device="cuda", dtype="bfloat16",
                                     grid=512, disk="off"))
    rng = random.Random(0)
    ids = [rng.randrange(248000) for _ in range(5000)]
    sh.feed_prompt("s", ids[:1800])
    sh.read()
    sh.feed_output("s", ids[1800:2300])
    sh.read()
    sh.feed_prompt("s", ids[:2000] + ids[2100:5000])  # a rollback
    sh.read()
    got, want = sh.export_state("s"), sh.fresh_state(list(sh.session_ids("s")))
    assert sh.position("s").rollbacks == 1
    for name in want:
        assert torch.equal(got[name], want[name]), name
