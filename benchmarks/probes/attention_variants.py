"""Attention variants for a 512-row chunk at depth (0.8B: 8 query heads, 2 KV heads, head dim 256).

- flash with a bottom-right causal bias: what the fast path runs;
- cuDNN without a mask: an upper bound on what cuDNN could give;
- the past (no mask, the 4 query heads of a KV head packed as rows) and the chunk (causal)
  apart, merged by log-sum-exp, on flash or cuDNN: its error against flash, and whether it
  repeats bit for bit.

    python -m benchmarks.probes.attention_variants --out DIR      # writes DIR/attention_variants.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from benchmarks.common import environment

ROWS, HEADS, KV_HEADS, HEAD_DIM = 512, 8, 2, 256


def event_ms(fn: Callable[[], object], n: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def merge(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    m = torch.maximum(l1, l2)
    w1, w2 = (l1 - m).exp(), (l2 - m).exp()
    return ((o1.float() * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None]).to(o1.dtype)


def variants(keys: int) -> dict[str, object]:
    n, start, scale = ROWS, keys - ROWS, HEAD_DIM ** -0.5
    q = torch.randn(1, HEADS, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, KV_HEADS, keys, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, KV_HEADS, keys, HEAD_DIM, device="cuda", dtype=torch.bfloat16)

    def flash() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, keys), scale=scale,
                                              enable_gqa=True)

    ref = flash()
    out: dict[str, object] = {"flash_lower_right_ms": event_ms(flash)}
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out["cudnn_nomask_gqa_ms"] = event_ms(
                lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True))
    except RuntimeError as err:
        out["cudnn_nomask_gqa"] = str(err)[:200]

    def split(backend: SDPBackend) -> torch.Tensor:
        packed = q.view(1, KV_HEADS, HEADS // KV_HEADS * n, HEAD_DIM)  # enable_gqa's grouping of heads
        past_k, past_v = k[:, :, :start], v[:, :, :start]
        with sdpa_kernel(backend):
            if backend == SDPBackend.FLASH_ATTENTION:
                o1, l1 = torch.ops.aten._scaled_dot_product_flash_attention(
                    packed, past_k, past_v, 0.0, False, False, scale=scale)[:2]
            else:
                o1, l1 = torch.ops.aten._scaled_dot_product_cudnn_attention(
                    packed, past_k, past_v, None, True, 0.0, False, False, scale=scale)[:2]
        rep = HEADS // KV_HEADS
        chunk_k, chunk_v = k[:, :, start:].repeat_interleave(rep, 1), v[:, :, start:].repeat_interleave(rep, 1)
        o2, l2 = torch.ops.aten._scaled_dot_product_flash_attention(q, chunk_k, chunk_v, 0.0, True, False,
                                                                     scale=scale)[:2]
        return merge(o1.view(1, HEADS, n, HEAD_DIM), l1.view(1, HEADS, n), o2, l2)

    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        name = f"split_{backend.name}"
        try:
            first, again = split(backend), split(backend)
            out[name + "_ms"] = event_ms(lambda b=backend: split(b))
            out[name + "_err"] = float((first.float() - ref.float()).norm() / ref.float().norm())
            out[name + "_repeat_equal"] = bool(torch.equal(first, again))
        except RuntimeError as err:
            out[name] = str(err)[:200]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = {str(keys): variants(keys) for keys in (33_280, 100_864)}
    for keys, row in rows.items():
        print(keys, row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_variants.json").write_text(json.dumps({**environment(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
