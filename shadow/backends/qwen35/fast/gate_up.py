"""The MLP's gate and up projections with ``silu(gate) * up`` in one Triton GEMM, taken by a read's
pass where it gives the bits of cuBLAS's GEMM then ``kernels.silu_mul`` and costs less.

Why: the row-wise kernels of a batched pass run at about the memory's rate
(``benchmarks/probes/pass_busy.py``), and the MLP's are the largest: cuBLAS writes ``[rows, 2 I]``
bf16 that ``silu_mul`` only reads back to write ``[rows, I]``. Here a program holds a tile of the
gate's accumulator and the same tile of the up's, rounds each to bf16 where cuBLAS stores them and
writes ``silu(g) * u``: the intermediate never reaches memory (11 MB a session a layer at 0.8B).

Bits: the reduction runs over K in ``BK`` steps in order, fp32 accumulation, no split of K, so on
the H100 its outputs equal cuBLAS's then ``silu_mul``'s bit for bit at 512 to 8,192 rows
(``benchmarks/results/gemm_silu-h100.json``). That equality is a property of cuBLAS's kernel choice
on a device, not a law, so ``choose`` checks it at warm-up for every row count a read takes and the
fast path uses the fused form only where it holds: a session's bits are then the same whichever
form a pass ran, and the warm-up's batch check (``Graphs.check``) compares batched against alone
on top.

Batch invariance of the kernel itself: a program's output rows come from those rows of ``x`` and
the weight only, with one tile shape for every row count, so a session's rows are the same inside
any larger call.

Speed: the fused form is slower than cuBLAS at some row counts (2,048 rows on the H100), so
``choose`` times both forms at each row count, in CUDA graphs as a pass runs them (timed eagerly,
the host's launch of the fused kernel showed in its time), and keeps the faster; the choice never
moves bits. Where the kernel does not build (a GPU without the copy engine's descriptors, another
Triton), every row count keeps cuBLAS and ``report()["mlp"]`` says why.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import kernels
from ..config import Qwen35Config
from ..merged import FullW, GdnW
from .graphs import collector_paused

log = logging.getLogger(__name__)

UPCAST = os.environ.get("TRITON_INTERPRET") == "1"  # the interpreter multiplies bf16 tiles wrongly
# (BM, BN, BK, warps, stages): two BM x BN fp32 accumulators a program, tiles through the copy
# engine (TMA); the fastest of eleven launch shapes at every row count on the H100
# (``results/gemm_silu-h100.json``).
SHAPE = (128, 128, 64, 8, 3)
GROUP = 8  # tiles in grouped order for L2 reuse (``tile``)
TIMING_CALLS = 10  # calls a timing graph holds


@triton.jit
def tile(M, I, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    """This program's output tile, in grouped order (for L2): which program takes which tile never
    changes a tile's bits."""
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(I, BN)
    per_group = GROUP * n_n
    first_m = (pid // per_group) * GROUP
    size_m = tl.minimum(n_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _gate_up_silu_kernel(x_desc, w_desc, out_ptr, M, K, I, stride_out, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, GROUP: tl.constexpr, FP32_DOT: tl.constexpr):
    pid_m, pid_n = tile(M, I, BM, BN, GROUP)
    m0, n0 = pid_m * BM, pid_n * BN
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = x_desc.load([m0, k])
        wg = w_desc.load([n0, k])
        wu = w_desc.load([I + n0, k])
        if FP32_DOT:
            a, wg, wu = a.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
        acc_g = tl.dot(a, wg.T, acc_g)
        acc_u = tl.dot(a, wu.T, acc_u)
    g = acc_g.to(out_ptr.dtype.element_ty).to(tl.float32)  # rounded where cuBLAS stores them
    u = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
    rm = m0 + tl.arange(0, BM)
    rn = n0 + tl.arange(0, BN)
    tl.store(out_ptr + rm[:, None] * stride_out + rn[None, :], (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty),
             mask=rm[:, None] < M)


def fits(hidden: int, inter: int, shape: tuple[int, ...] = SHAPE) -> bool:
    """Whether the tile shape divides the model's widths (the kernel masks rows, not columns)."""
    _, bn, bk, _, _ = shape
    return hidden % bk == 0 and inter % bn == 0


def gate_up_silu(x: torch.Tensor, gate_up: torch.Tensor, out: torch.Tensor,
                 shape: tuple[int, ...] = SHAPE) -> None:
    """``out = silu(x @ gate_up[:I].T) * (x @ gate_up[I:].T)``, each product rounded to ``out``'s
    dtype first, with ``I = out.shape[1]`` (``gate_up`` is the merged ``[2 I, hidden]`` weight)."""
    bm, bn, bk, warps, stages = shape
    m, k = x.shape
    inter = out.shape[1]
    if gate_up.shape != (2 * inter, k) or not fits(k, inter, shape):
        raise ValueError(f"gate_up_silu: weight {tuple(gate_up.shape)} for {k} inputs and {inter} outputs "
                         f"does not fit tiles {shape}")
    if x.stride(1) != 1 or gate_up.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("gate_up_silu: rows must be contiguous")
    x_desc = TensorDescriptor(x, list(x.shape), [x.stride(0), 1], [bm, bk])
    w_desc = TensorDescriptor(gate_up, list(gate_up.shape), [gate_up.stride(0), 1], [bn, bk])
    grid = (triton.cdiv(m, bm) * (inter // bn),)
    _gate_up_silu_kernel[grid](x_desc, w_desc, out, m, k, inter, out.stride(0), BM=bm, BN=bn, BK=bk, GROUP=GROUP,
                               FP32_DOT=UPCAST, num_warps=warps, num_stages=stages)


def unfused(x: torch.Tensor, gate_up: torch.Tensor, out: torch.Tensor) -> None:
    """What the fast path runs otherwise: cuBLAS's GEMM into ``[rows, 2 I]``, then ``silu_mul``."""
    kernels.silu_mul(F.linear(x, gate_up), out)


def _graph_ms(forms: tuple[object, object], calls: int, rounds: int = 5) -> tuple[float, float]:
    """Each form's median device time a call, ``calls`` calls captured in one CUDA graph (as a read's
    pass runs them: a launch's host time, the descriptors' included, hidden), forms alternating."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    captured = []
    for fn in forms:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # type: ignore[operator]  # compile and settle the allocator outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()  # type: ignore[operator]
        captured.append(graph)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for graph, kept in zip(captured, times, strict=True):
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            kept.append(start.elapsed_time(end) / calls)
    return statistics.median(times[0]), statistics.median(times[1])


def choose(layers: Sequence[GdnW | FullW], cfg: Qwen35Config, dtype: torch.dtype,
           counts: Sequence[int]) -> tuple[dict[int, str], float]:
    """Per row count in ``counts`` (a read's passes): "fused" where the fused form gives cuBLAS's bits
    (every layer's weight, random rows) and is faster, else why not (CUDA only; off it, nothing);
    and the seconds the choice took."""
    t0 = time.perf_counter()
    dev = layers[0].gate_up.device
    if dev.type != "cuda" or not fits(cfg.hidden_size, cfg.intermediate_size):
        return {}, 0.0
    gen = torch.Generator(device=dev).manual_seed(35)
    xs = torch.randn(max(counts), cfg.hidden_size, device=dev, generator=gen).to(dtype)
    with collector_paused():  # the timing captures graphs
        chosen = {n: choose_at(layers, xs[:n]) for n in sorted(counts)}
    taken = [n for n, why in chosen.items() if why == "fused"]
    log.info("fused gate/up + SiLU at %s rows; not at %s", taken,
             {n: why for n, why in chosen.items() if why != "fused"})
    return chosen, time.perf_counter() - t0


def choose_at(layers: Sequence[GdnW | FullW], x: torch.Tensor) -> str:
    """"fused" if the fused form gives cuBLAS's bits for ``x`` with every layer's weight and is the
    faster at its row count, else why not."""
    ours = torch.empty(x.shape[0], layers[0].gate_up.shape[0] // 2, device=x.device, dtype=x.dtype)
    theirs = torch.empty_like(ours)
    try:
        gate_up_silu(x, layers[0].gate_up, ours)
    except Exception as e:  # a GPU or Triton this kernel does not compile for: warm-up goes on with cuBLAS
        return f"kernel failed: {type(e).__name__}: {str(e)[:200]}"
    for i, lw in enumerate(layers):
        gate_up_silu(x, lw.gate_up, ours)
        unfused(x, lw.gate_up, theirs)
        if not torch.equal(ours, theirs):
            return f"bits differ from cuBLAS + silu_mul (layer {i})"
    w = layers[0].gate_up
    fused_ms, cublas_ms = _graph_ms((partial(gate_up_silu, x, w, ours), partial(unfused, x, w, theirs)), TIMING_CALLS)
    return "fused" if fused_ms < cublas_ms else f"slower ({fused_ms * 1e3:.1f} us vs {cublas_ms * 1e3:.1f})"
