"""ModelState's KV buffers: growth keeps the held rows bit for bit; rows above them are never
written (the tests' ``torch.empty`` gives NaN, so no code can mistake one for a zero row)."""

from __future__ import annotations

import torch

from shadow.backends.qwen35 import KV_STEP, ModelState
from shadow.backends.qwen35.checkpoint import demo_text_config
from shadow.backends.qwen35.config import Qwen35Config


def test_reserve_keeps_held_rows_and_leaves_the_rest_unwritten() -> None:
    cfg = Qwen35Config.from_dict(demo_text_config())
    s = ModelState.empty(cfg, "cpu", torch.float32)
    s.reserve(100)
    assert s.capacity == KV_STEP
    rows = torch.randn(100, *s.k[0].shape[1:])
    s.k[0][:100].copy_(rows)
    s.length = 100
    s.reserve(KV_STEP + 1)  # one step more: the held rows are copied into the grown buffer
    assert s.capacity == 2 * KV_STEP
    assert torch.equal(s.k[0][:100], rows)
    assert torch.isnan(s.k[0][100:]).all() and torch.isnan(s.v[0]).all()
