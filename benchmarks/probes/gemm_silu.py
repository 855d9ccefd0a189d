"""A lead for the MLP's row-wise cost: the gate and up projections and ``silu(gate) * up`` in one
Triton GEMM, against what the fast path runs (cuBLAS's GEMM into ``[rows, 2 I]`` bf16, then
``kernels.silu_mul``), at the 0.8B's shapes (hidden 1024, I = 3584), bf16.

Why: ``probes/pass_busy.py`` puts the row-wise kernels at 0.31-0.45 ms a session of every pass, at
about their memory rate; ``silu_mul`` moves 11 MB a session a layer and the GEMM writes 7.3 MB that
it only reads back. Here each program holds a tile of the gate's and the same tile of the up's
accumulators, rounds each to bf16 (where the fast path stores them) and writes ``silu(g) * u``:
the ``[rows, 2 I]`` intermediate never reaches memory.

Per row count M (512 a session: B = 1, 3, 4, 6, 8, 16) and launch shape: device us a call (CUDA
graph, ``device_ms_per_call``) of cuBLAS alone, cuBLAS + ``silu_mul`` and the fused kernel, its
tiles by pointer loads or through the copy engine (TMA, a shape's last field). Checks:
the fused kernel's rows of one session alone ``torch.equal`` to the same rows inside every larger
M (batch invariance, what a read's pass needs); its error and the shipped form's error against an
fp32 reference, and the share of outputs where the two forms' bits agree (a new GEMM gives new
bits: taken, it would move every session's state, equal still to a fresh prefill read the same way).

    python -m benchmarks.probes.gemm_silu --out DIR     # DIR/gemm_silu.json; CUDA only
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

from benchmarks.common import captured, device_ms_per_call, environment
from shadow.backends.qwen35 import kernels
from shadow.backends.qwen35.fast.gate_up import gate_up_silu as gate_up_silu_tma
from shadow.backends.qwen35.fast.gate_up import tile

DT = torch.bfloat16
HIDDEN, INTER, CHUNK = 1024, 3584, 512
MS = (512, 1536, 2048, 3072, 4096, 8192)
# (BM, BN, BK, warps, stages, tma): two accumulators of BM x BN a program; tma: the tiles through the
# copy engine (host-made descriptors) rather than pointer loads
SHAPES = ((128, 128, 64, 8, 3, 0), (128, 128, 64, 8, 4, 0), (128, 64, 64, 4, 4, 0), (128, 64, 64, 8, 4, 0),
          (64, 128, 64, 4, 4, 0), (256, 64, 64, 8, 3, 0),
          (128, 128, 64, 8, 3, 1), (128, 128, 64, 8, 4, 1), (128, 64, 64, 4, 4, 1), (128, 64, 64, 8, 4, 1),
          (64, 128, 64, 4, 4, 1))


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, M, K, I, stride_x, stride_w, stride_out,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid_m, pid_n = tile(M, I, BM, BN, GROUP)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x = x_ptr + rm[:, None] * stride_x + rk[None, :]
    wg = w_ptr + rn[None, :] * stride_w + rk[:, None]  # W's gate rows as a [BK, BN] tile
    wu = wg + I * stride_w  # the up rows, I below
    row_ok = rm[:, None] < M
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, K, BK):
        a = tl.load(x, mask=row_ok, other=0.0)
        acc_g = tl.dot(a, tl.load(wg), acc_g)
        acc_u = tl.dot(a, tl.load(wu), acc_u)
        x += BK
        wg += BK
        wu += BK
    g = acc_g.to(out_ptr.dtype.element_ty).to(tl.float32)  # rounded where the shipped GEMM stores them
    u = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
    out = out_ptr + rm[:, None] * stride_out + rn[None, :]
    tl.store(out, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=row_ok)


def gate_up_silu(x: torch.Tensor, gate_up: torch.Tensor, out: torch.Tensor, shape: tuple[int, ...]) -> None:
    bm, bn, bk, warps, stages, tma = shape
    m, k = x.shape
    inter = out.shape[1]
    assert k % bk == 0 and inter % bn == 0 and x.stride(1) == 1 and gate_up.stride(1) == 1
    grid = (triton.cdiv(m, bm) * (inter // bn),)
    if tma:  # the shipped kernel (``gate_up.py``), at this launch shape
        gate_up_silu_tma(x, gate_up, out, shape[:5])
        return
    _gate_up_silu_kernel[grid](x, gate_up, out, m, k, inter, x.stride(0), gate_up.stride(0), out.stride(0),
                               BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)


def _shipped(x: torch.Tensor, gate_up: torch.Tensor, out: torch.Tensor) -> None:
    kernels.silu_mul(F.linear(x, gate_up), out)


def _graph_us(fn: Any) -> float:
    g = captured(fn)
    return device_ms_per_call(g.replay) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemm_silu: needs CUDA")
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up = (torch.randn(2 * INTER, HIDDEN, device="cuda", generator=gen) * HIDDEN ** -0.5).to(DT)
    xs = (torch.randn(max(MS), HIDDEN, device="cuda", generator=gen)).to(DT)
    rows: list[dict[str, Any]] = []
    alone: dict[tuple[int, ...], torch.Tensor] = {}
    for m in MS:
        x = xs[:m]
        ref32 = F.linear(x.float(), gate_up.float())
        ref = (F.silu(ref32[:, :INTER]) * ref32[:, INTER:])
        shipped = torch.empty(m, INTER, device="cuda", dtype=DT)
        _shipped(x, gate_up, shipped)
        scale = ref.abs().max().item()
        row: dict[str, Any] = {"m": m, "sessions": m // CHUNK,
                               "cublas_us": _graph_us(lambda x=x: F.linear(x, gate_up)),
                               "shipped_us": _graph_us(lambda x=x, s=shipped: _shipped(x, gate_up, s)),
                               "shipped_err": (shipped.float() - ref).abs().max().item() / scale, "fused": {}}
        for shape in SHAPES:
            key = "x".join(map(str, shape))
            out = torch.empty(m, INTER, device="cuda", dtype=DT)
            try:
                gate_up_silu(x, gate_up, out, shape)
                torch.cuda.synchronize()
                if m == CHUNK:
                    alone[shape] = out.clone()
                row["fused"][key] = {
                    "us": _graph_us(lambda x=x, o=out, s=shape: gate_up_silu(x, gate_up, o, s)),
                    "err": (out.float() - ref).abs().max().item() / scale,
                    "bits_as_shipped": (out == shipped).float().mean().item(),
                    # the first session's rows, and the last one's, equal to those rows read alone
                    "rows_equal_alone": bool(torch.equal(out[:CHUNK], alone[shape])),
                    "last_rows_equal_alone": bool(torch.equal(
                        out[m - CHUNK:], _alone_rows(xs[m - CHUNK:m], gate_up, shape))),
                }
            except Exception as err:  # a shape that does not compile here is reported, not fatal
                row["fused"][key] = {"error": f"{type(err).__name__}: {err}"[:300],
                                     "trace": traceback.format_exc()[-600:]}
        best = min((v["us"], k) for k, v in row["fused"].items() if "us" in v)
        row["best"], row["saved_us"] = best[1], row["shipped_us"] - best[0]
        rows.append(row)
        print(f"M={m}: cuBLAS {row['cublas_us']:.1f} us, shipped {row['shipped_us']:.1f}, fused best {best[0]:.1f} "
              f"({best[1]}), " + ", ".join(f"{k} {v.get('us', float('nan')):.1f}" for k, v in row["fused"].items()),
              flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"probe": "gemm_silu", **environment(), "triton": triton.__version__, "hidden": HIDDEN, "inter": INTER,
           "rows": rows}
    (out_dir / "gemm_silu.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out_dir / 'gemm_silu.json'}")


def _alone_rows(x: torch.Tensor, gate_up: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    out = torch.empty(x.shape[0], INTER, device=x.device, dtype=DT)
    gate_up_silu(x, gate_up, out, shape)
    return out


if __name__ == "__main__":
    main()
