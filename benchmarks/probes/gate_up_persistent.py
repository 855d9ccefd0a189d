"""A lead for the MLP's gate/up GEMM with SiLU: the shipped fused kernel (``gate_up.py``: a program a
tile, two accumulators) made persistent (one program an SM walking the tiles in grouped order, the
tile loop flattened into the K loop so that the next tile's loads are issued during this one's
epilogue), against the shipped kernel and cuBLAS then ``silu_mul``, at the 0.8B's shapes.

Why: in a read's pass of 8 sessions at 0-2k the fused kernel runs at about 500 TFLOP/s (2.77 of the
pass's 12.19 ms of kernels, ``read_rate-h100.json``'s ``batch_busy`` row at 836b7b8) where cuBLAS
runs the in-projection at about 660; K is 1,024, so each tile's 16 steps of K are short beside its
prologue and epilogue, which a persistent kernel can overlap.

Per row count M and launch shape: device us a call (CUDA graph); every variant's output against
cuBLAS + ``silu_mul`` (``torch.equal``: a read may take it only with cuBLAS's bits), and the first and
last session's rows against the same rows computed alone (batch invariance).

    python -m benchmarks.probes.gate_up_persistent --out DIR    # DIR/gate_up_persistent.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from benchmarks.common import captured, device_ms_per_call, environment
from shadow.backends.qwen35.fast import gate_up

DT = torch.bfloat16
HIDDEN, INTER, CHUNK = 1024, 3584, 512
MS = (512, 1024, 1536, 2048, 3072, 4096, 8192)
# (BM, BN, BK, warps, stages, flatten)
SHAPES = ((128, 128, 64, 8, 3, 1), (128, 128, 64, 8, 4, 1), (128, 128, 64, 8, 3, 0), (128, 64, 64, 4, 4, 1),
          (128, 64, 64, 8, 4, 1), (64, 128, 64, 4, 4, 1))


@triton.jit
def _grouped(t, n_m, n_n, GROUP: tl.constexpr):
    per_group = GROUP * n_n
    first_m = (t // per_group) * GROUP
    size_m = tl.minimum(n_m - first_m, GROUP)
    return first_m + (t % per_group) % size_m, (t % per_group) // size_m


@triton.jit
def _persistent_kernel(x_desc, w_desc, out_ptr, M, K, I, stride_out, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, GROUP: tl.constexpr, PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr):
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(I, BN)
    k_tiles = tl.cdiv(K, BK)
    for t in tl.range(tl.program_id(0), n_m * n_n, PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = _grouped(t, n_m, n_n, GROUP)
        m0, n0 = pid_m * BM, pid_n * BN
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            k = ki * BK
            a = x_desc.load([m0, k])
            acc_g = tl.dot(a, w_desc.load([n0, k]).T, acc_g)
            acc_u = tl.dot(a, w_desc.load([I + n0, k]).T, acc_u)
        g = acc_g.to(out_ptr.dtype.element_ty).to(tl.float32)  # rounded where cuBLAS stores them
        u = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
        rm = m0 + tl.arange(0, BM)
        rn = n0 + tl.arange(0, BN)
        tl.store(out_ptr + rm[:, None] * stride_out + rn[None, :],
                 (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=rm[:, None] < M)


def persistent(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, shape: tuple[int, ...], sms: int) -> None:
    bm, bn, bk, warps, stages, flatten = shape
    m, k = x.shape
    inter = out.shape[1]
    x_desc = TensorDescriptor(x, list(x.shape), [x.stride(0), 1], [bm, bk])
    w_desc = TensorDescriptor(w, list(w.shape), [w.stride(0), 1], [bn, bk])
    tiles = triton.cdiv(m, bm) * triton.cdiv(inter, bn)
    programs = min(sms, tiles)
    _persistent_kernel[(programs,)](x_desc, w_desc, out, m, k, inter, out.stride(0), BM=bm, BN=bn, BK=bk,
                                    GROUP=gate_up.GROUP, PROGRAMS=programs, FLATTEN=bool(flatten),
                                    num_warps=warps, num_stages=stages)


def _us(fn: Any) -> float:
    return device_ms_per_call(captured(fn).replay) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gate_up_persistent: needs CUDA")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(2 * INTER, HIDDEN, device="cuda", generator=gen) * HIDDEN ** -0.5).to(DT)
    xs = torch.randn(max(MS), HIDDEN, device="cuda", generator=gen).to(DT)
    rows: list[dict[str, Any]] = []
    for m in MS:
        x = xs[:m]
        want = torch.empty(m, INTER, device="cuda", dtype=DT)
        gate_up.unfused(x, w, want)
        flops = 2 * m * HIDDEN * 2 * INTER
        shipped = torch.empty_like(want)
        gate_up.gate_up_silu(x, w, shipped)
        row: dict[str, Any] = {
            "m": m, "cublas_us": _us(lambda x=x: F.linear(x, w)),
            "unfused_us": _us(lambda x=x, o=want: gate_up.unfused(x, w, o)),
            "shipped_us": _us(lambda x=x, o=shipped: gate_up.gate_up_silu(x, w, o)),
            "shipped_equal": bool(torch.equal(shipped, want)), "variants": {}}
        row["cublas_tflops"] = flops / row["cublas_us"] / 1e6
        row["shipped_tflops"] = flops / row["shipped_us"] / 1e6
        for shape in SHAPES:
            key = "x".join(map(str, shape))
            out = torch.empty_like(want)
            try:
                persistent(x, w, out, shape, sms)
                torch.cuda.synchronize()
                first, last = (torch.empty(CHUNK, INTER, device="cuda", dtype=DT) for _ in range(2))
                persistent(xs[:CHUNK], w, first, shape, sms)
                persistent(xs[m - CHUNK:m], w, last, shape, sms)
                us = _us(lambda x=x, o=out, s=shape: persistent(x, w, o, s, sms))
                row["variants"][key] = {
                    "us": us, "tflops": flops / us / 1e6, "equal_cublas": bool(torch.equal(out, want)),
                    "rows_equal_alone": bool(torch.equal(out[:CHUNK], first) and torch.equal(out[m - CHUNK:], last))}
            except Exception as err:  # a shape that does not compile here is reported, not fatal
                row["variants"][key] = {"error": f"{type(err).__name__}: {err}"[:300],
                                        "trace": traceback.format_exc()[-600:]}
        rows.append(row)
        print(f"M={m}: cuBLAS {row['cublas_us']:.1f} us, +silu_mul {row['unfused_us']:.1f}, shipped fused "
              f"{row['shipped_us']:.1f} ({row['shipped_equal']}); "
              + ", ".join(f"{k} {v.get('us', float('nan')):.1f} ({v.get('equal_cublas')})"
                          for k, v in row["variants"].items()), flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"probe": "gate_up_persistent", **environment(), "triton": triton.__version__, "sms": sms,
           "hidden": HIDDEN, "inter": INTER, "rows": rows}
    (out_dir / "gate_up_persistent.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out_dir / 'gate_up_persistent.json'}")


if __name__ == "__main__":
    main()
