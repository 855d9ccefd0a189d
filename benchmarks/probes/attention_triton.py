"""The fast path's chunk attention (``shadow/backends/qwen35/attention/``: the Triton kernel, and
the Gluon ones) against torch's flash kernel, on the 0.8B's heads (8 query heads, 2 KV heads, head
dim 256), bf16, on the GPU.

For each depth and row count: ms per call (CUDA events), the largest error against an fp32
reference for both kernels, whether a repeat gives the same bits, the host time of one call, and
the attention kernel's registers and spills. Several fixed variants are timed (tiles, split
rule, K/V through the copy engine, the scale folded), each compared with
the first one's bits; the first is the module's default, the second the kernel as it was at
80fc4c2 (eight splits for a 512-row chunk, pointer loads). The JSON is written after each variant,
so a call cut short keeps what it measured.

    python -m benchmarks.probes.attention_triton --out DIR      # writes DIR/attention_triton.json
    python -m benchmarks.probes.attention_triton --out DIR --leads wg   # the Gluon kernel: attention_triton-wg.json
    python -m benchmarks.probes.attention_triton --out DIR --leads ws   # it warp-specialised: attention_triton-ws.json
    python -m benchmarks.probes.attention_triton --once 33280 [--wg]   # one call (for ncu), nothing written

Clusters of two CTAs (Triton's ``num_ctas``, to share each key tile) were a lead set here: they do
not compile in Triton 3.6 (``results/history/attention_triton-cluster_b5d88f4.json``; the code is in git at b5d88f4).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention.bias import causal_lower_right

from benchmarks.common import environment
from benchmarks.probes.attention_variants import event_ms
from shadow.backends.qwen35.attention import triton as attention

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 256
OLD = {"bm": 128, "bn": 64, "warps": 8, "stages": 2, "target": 264, "min_split": 1024, "tma": False,
       "fold": False}  # the kernel measured at 80fc4c2
DEFAULT = {"bm": attention.BM, "bn": attention.BN, "warps": attention.WARPS, "stages": attention.STAGES,
           "target": None, "min_split": attention.MIN_SPLIT, "tma": attention.TMA, "fold": attention.FOLD}
LEADS: list[dict[str, Any]] = [  # changes to DEFAULT
    {"tma": False}, {"bm": 128, "bn": 64, "warps": 8, "stages": 2}, {"target": 264}, {"target": 132},
]
WG_LEADS: list[dict[str, Any]] = [  # bm 128: two warpgroups share each tile (the split rule changes with it)
    {"kernel": "wg", "stages": 3}, {"kernel": "wg", "bm": 128, "stages": 3, "v_stages": 2},
]
WG_SHIPPED = {**DEFAULT, "kernel": "wg", "bm": 128, "stages": 3, "v_stages": 2}
VARIANT_SETS = {"default": [DEFAULT, OLD] + [{**DEFAULT, **lead} for lead in LEADS],
                "wg": [DEFAULT] + [{**DEFAULT, **lead} for lead in WG_LEADS],
                # the shipped Gluon kernel first (the bits the lead must give), then it warp-specialised
                "ws": [WG_SHIPPED, {**WG_SHIPPED, "kernel": "ws"}]}
CASES = [(512, 33280), (512, 100864), (384, 33152), (304, 33072), (512, 8704), (32, 33024), (512, 512)]


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


def flops(n: int, end: int) -> float:
    return 4 * n * HEADS * HEAD_DIM * (end - n + (n + 1) / 2)


def prepare(n: int, end: int) -> dict[str, Any]:
    """Inputs, the fp32 reference and torch's flash kernel for one case."""
    start = end - n
    gen = torch.Generator(device="cuda").manual_seed(end)
    q = torch.randn(n, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(end + 4096, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(end + 4096, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    k[end:] = float("nan")  # rows past the chunk must not be read
    v[end:] = float("nan")
    ref = reference(q, k, v, start)

    def flash() -> torch.Tensor:
        o = F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], k[:end].permute(1, 0, 2)[None],
                                           v[:end].permute(1, 0, 2)[None], attn_mask=causal_lower_right(n, end),
                                           scale=HEAD_DIM ** -0.5, enable_gqa=True)
        return o[0].permute(1, 0, 2)

    ms = event_ms(flash)
    row = {"rows": n, "keys": end, "flash_ms": ms, "flash_tflops": flops(n, end) / ms / 1e9,
           "flash_err": (flash().float() - ref).abs().max().item()}
    return {"row": row, "q": q, "k": k, "v": v, "ref": ref, "start": start}


def measure(case: dict[str, Any], variant: dict[str, Any]) -> dict[str, Any]:
    q, k, v, start, ref = case["q"], case["k"], case["v"], case["start"], case["ref"]
    n, end = case["row"]["rows"], case["row"]["keys"]
    out = torch.empty_like(q)

    def ours() -> Any:
        if variant.get("kernel") == "ws":
            from shadow.backends.qwen35.attention import gluon_ws
            return gluon_ws.attend(q, k, v, start, out, stages=variant["stages"], v_stages=variant["v_stages"])
        if variant.get("kernel") == "wg":  # imported here: Gluon's Hopper modules are not needed elsewhere
            from shadow.backends.qwen35.attention import gluon_wg
            return gluon_wg.attend(q, k, v, start, out, bm=variant["bm"], stages=variant["stages"],
                                       v_stages=variant.get("v_stages", variant["stages"]))
        return attention.attend(q, k, v, start, out, bm=variant["bm"], bn=variant["bn"], warps=variant["warps"],
                                stages=variant["stages"], min_split=variant["min_split"], target=variant["target"],
                                tma=variant["tma"], fold=variant["fold"])

    try:
        kernel = ours()
        ms = event_ms(ours)
    except Exception as e:  # a variant that does not compile or fit (shared memory, registers) is reported
        return {"error": repr(e)[:400]}
    ours()
    first = out.clone()
    ours()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        ours()
    host_us = (time.perf_counter() - t0) / 50 * 1e6
    torch.cuda.synchronize()
    if "default_out" not in case:  # the first variant measured is the module's default
        case["default_out"] = out.clone()
    return {"ms": ms, "tflops": flops(n, end) / ms / 1e9, "err": (out.float() - ref).abs().max().item(),
            "repeat_equal": torch.equal(first, out), "equal_to_default": torch.equal(out, case["default_out"]),
            "host_us": host_us,
            "regs": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--leads", choices=sorted(VARIANT_SETS), default="default")
    parser.add_argument("--once", type=int, metavar="KEYS", help="one default call of 512 rows, for a profiler")
    parser.add_argument("--wg", action="store_true", help="with --once: the Gluon kernel")
    args = parser.parse_args()
    if args.once:
        case = prepare(512, args.once)
        out = torch.empty_like(case["q"])
        for _ in range(2):  # the first compiles; a profiler filtering on the kernel's name sees both
            if args.wg:
                from shadow.backends.qwen35.attention import gluon_wg
                gluon_wg.attend(case["q"], case["k"], case["v"], case["start"], out)
            else:
                attention.attend(case["q"], case["k"], case["v"], case["start"], out)
        torch.cuda.synchronize()
        return
    if args.out is None:
        parser.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    name = "attention_triton.json" if args.leads == "default" else f"attention_triton-{args.leads}.json"
    cases = [prepare(n, end) for n, end in CASES]
    for c in cases:
        r = c["row"]
        print(f"rows {r['rows']:4d} keys {r['keys']:6d}: flash {r['flash_ms']:.3f} ms "
              f"({r['flash_tflops']:.0f} TFLOP/s)", flush=True)
    variants: list[dict[str, Any]] = []
    for variant in VARIANT_SETS[args.leads]:
        found = {"variant": variant, "cases": []}
        variants.append(found)
        for c in cases:
            m = measure(c, variant)
            found["cases"].append({"rows": c["row"]["rows"], "keys": c["row"]["keys"], **m})
            print(variant, c["row"]["rows"], c["row"]["keys"], m, flush=True)
        doc = {**environment(), "triton": triton.__version__, "cases": [c["row"] for c in cases],
               "variants": variants}
        (args.out / name).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
