"""The fast path's chunk attention (``shadow/backends/qwen35/attention.py``) against torch's flash
kernel, on the 0.8B's heads (8 query heads, 2 KV heads, head dim 256), bf16, on the GPU.

For each depth and row count: ms per call (CUDA events), the largest error against an fp32
reference for both kernels, whether a repeat gives the same bits, and the host time of one call.
Several fixed launch shapes are timed; the first is the module's default.

    python -m benchmarks.probes.attention_triton --out DIR      # writes DIR/attention_triton.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from benchmarks.common import environment
from benchmarks.probes.attention_variants import event_ms
from shadow.backends.qwen35 import attention

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 256
SHAPES = [  # (bm, bn, warps, stages, target programs, least keys a split)
    (attention.BM, attention.BN, attention.WARPS, attention.STAGES, attention.TARGET_PROGRAMS, attention.MIN_SPLIT),
    (128, 64, 8, 2, 264, 1024), (128, 64, 8, 2, 264, 256), (64, 64, 4, 3, 264, 128), (128, 64, 8, 2, 132, 128),
]
CASES = [(512, 512), (512, 2560), (512, 8704), (512, 33280), (512, 100864), (384, 33152), (384, 100736), (32, 33024)]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for h in range(HEADS):  # a head at a time keeps the fp32 scores small
        kv = h // (HEADS // KV_HEADS)
        end = start + q.shape[0]
        s = q[:, h].float() @ k[:end, kv].float().T * HEAD_DIM ** -0.5
        rows = torch.arange(q.shape[0], device=q.device)
        allowed = torch.arange(end, device=q.device)[None, :] <= start + rows[:, None]
        out[:, h] = s.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[:end, kv].float()
    return out


def case(n: int, end: int) -> dict[str, object]:
    start = end - n
    gen = torch.Generator(device="cuda").manual_seed(end)
    q = torch.randn(n, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(end + 4096, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(end + 4096, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref = reference(q, k, v, start)

    def flash() -> torch.Tensor:
        o = F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], k[:end].permute(1, 0, 2)[None],
                                           v[:end].permute(1, 0, 2)[None], attn_mask=causal_lower_right(n, end),
                                           scale=HEAD_DIM ** -0.5, enable_gqa=True)
        return o[0].permute(1, 0, 2)

    row: dict[str, object] = {"rows": n, "keys": end, "flash_ms": event_ms(flash),
                              "flash_err": (flash().float() - ref).abs().max().item()}
    flops = 4 * n * HEADS * HEAD_DIM * (start + (n + 1) / 2)
    row["flash_tflops"] = flops / row["flash_ms"] / 1e9  # type: ignore[operator]
    variants = []
    for bm, bn, warps, stages, target, min_split in SHAPES:
        out = torch.empty_like(q)

        def ours(out: torch.Tensor = out, shape: tuple[int, ...] = (bm, bn, warps, stages, min_split, target)) -> None:
            attention.attend(q, k, v, start, out, bm=shape[0], bn=shape[1], warps=shape[2], stages=shape[3],
                             min_split=shape[4], target=shape[5])

        try:
            ms = event_ms(ours)
        except Exception as e:  # a shape that does not fit (shared memory, registers) is reported, not fatal
            variants.append({"shape": [bm, bn, warps, stages, target, min_split], "error": repr(e)[:300]})
            continue
        ours()
        first = out.clone()
        ours()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            ours()
        host_us = (time.perf_counter() - t0) / 50 * 1e6
        torch.cuda.synchronize()
        variants.append({"shape": [bm, bn, warps, stages, target, min_split], "ms": ms, "tflops": flops / ms / 1e9,
                         "err": (out.float() - ref).abs().max().item(), "repeat_equal": torch.equal(first, out),
                         "host_us": host_us})
    row["ours"] = variants
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for n, end in CASES:
        rows.append(case(n, end))
        r = rows[-1]
        best = min((v for v in r["ours"] if "ms" in v), key=lambda v: v["ms"], default=None)  # type: ignore[union-attr]
        print(f"rows {n:4d} keys {end:6d}: flash {r['flash_ms']:.3f} ms err {r['flash_err']:.4f} | "
              f"default {r['ours'][0]} | best {best}", flush=True)  # type: ignore[index]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_triton.json").write_text(json.dumps({**environment(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
