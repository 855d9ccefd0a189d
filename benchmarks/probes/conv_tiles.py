"""The GDN conv as 2-D tiles (a candidate) against the shipped row walk (``kernels.conv_silu``).

The shipped kernel walks ``block_t`` rows of one head in order, one row a step (8 rows, 1 warp was
its best shape, ``results/pass_levers.json``); at 4,096 rows it takes about 47 us a layer against a
memory floor near 21. The candidate loads its rows as four ``[BLOCK_T, head]`` tiles, one a tap,
each shifted a row (the overlap comes from L1), and does the taps, SiLU and the per-head l2 norm on
whole tiles. Same state move as shipped (one program a session reads and writes the held columns).

Per shape (0.8B: 6,144 channels, heads of 128, kernel 4; one session's 512 rows and 8 sessions'
4,096), us per call in a CUDA graph, and its bits: the moved state ``torch.equal`` to shipped's; the
output against shipped's (equal, or the largest difference); each session of the 8-session call
``torch.equal`` to that session alone (what batching needs).

    python -m benchmarks.probes.conv_tiles --out DIR     # DIR/conv_tiles.json; CUDA only
"""

from __future__ import annotations

import argparse
import functools
import json
from typing import Any

import torch
import triton
import triton.language as tl

from benchmarks.common import captured, device_ms_per_call, environment, result_path
from shadow.backends.qwen35 import kernels

DT = torch.bfloat16
SEG, SESSIONS, CONV, KEY_DIM, HEAD = 512, 8, 6144, 2048, 128


@triton.jit
def _tap(proj_ptr, state_ptr, c, mc, r, seg_end, stride_proj, KERNEL: tl.constexpr):
    """Rows ``r`` ([BLOCK_T, 1]) over channels ``c`` ([1, HEAD]) of [held columns | new rows], fp32."""
    held = tl.load(state_ptr + c * KERNEL + (r + KERNEL), mask=mc & (r < 0), other=0.0)
    new = tl.load(proj_ptr + r * stride_proj + c, mask=mc & (r >= 0) & (r < seg_end), other=0.0)
    return held.to(tl.float32) + new.to(tl.float32)


@triton.jit
def _conv_tiles_kernel(proj_ptr, state_ptr, w_ptr, out_ptr, valid_ptr, n, SEG, C, KD, stride_proj, stride_state,
                       KERNEL: tl.constexpr, BLOCK_T: tl.constexpr, HEAD: tl.constexpr):
    tl.static_assert(KERNEL == 4)
    g0 = tl.program_id(0) * BLOCK_T
    sess = g0 // SEG
    t0 = g0 - sess * SEG
    proj_ptr += sess * SEG * stride_proj
    state_ptr += sess * stride_state
    c1 = tl.program_id(1) * HEAD + tl.arange(0, HEAD)
    c = c1[None, :]
    mc = c < C
    r = t0 + tl.arange(0, BLOCK_T)[:, None]
    seg_end = tl.minimum(SEG, n - sess * SEG)
    w0 = tl.load(w_ptr + c * KERNEL + 0, mask=mc, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + c * KERNEL + 1, mask=mc, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + c * KERNEL + 2, mask=mc, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + c * KERNEL + 3, mask=mc, other=0.0).to(tl.float32)
    xa = _tap(proj_ptr, state_ptr, c, mc, r - 3, seg_end, stride_proj, KERNEL)
    xb = _tap(proj_ptr, state_ptr, c, mc, r - 2, seg_end, stride_proj, KERNEL)
    xc = _tap(proj_ptr, state_ptr, c, mc, r - 1, seg_end, stride_proj, KERNEL)
    xd = _tap(proj_ptr, state_ptr, c, mc, r, seg_end, stride_proj, KERNEL)
    acc = xa * w0 + xb * w1 + xc * w2 + xd * w3
    y = acc * tl.sigmoid(acc)
    region = tl.program_id(1) * HEAD // KD
    if region < 2:
        y = y * tl.rsqrt(tl.sum(y * y, axis=1)[:, None] + 1e-6)
    width = tl.where(region >= 2, C - 2 * KD, KD)
    base = out_ptr + tl.minimum(region, 2) * n * KD + (c - tl.minimum(region, 2) * KD) + sess * SEG * width
    tl.store(base + r * width, y.to(out_ptr.dtype.element_ty), mask=mc & (r < seg_end))
    if t0 == 0:
        valid = tl.load(valid_ptr)
        cm = c1 < C
        n0 = _tap(proj_ptr, state_ptr, c1, cm, c1 * 0 + valid - 4, seg_end, stride_proj, KERNEL)
        n1 = _tap(proj_ptr, state_ptr, c1, cm, c1 * 0 + valid - 3, seg_end, stride_proj, KERNEL)
        n2 = _tap(proj_ptr, state_ptr, c1, cm, c1 * 0 + valid - 2, seg_end, stride_proj, KERNEL)
        n3 = _tap(proj_ptr, state_ptr, c1, cm, c1 * 0 + valid - 1, seg_end, stride_proj, KERNEL)
        tl.debug_barrier()
        dt = state_ptr.dtype.element_ty
        tl.store(state_ptr + c1 * KERNEL + 0, n0.to(dt), mask=cm)
        tl.store(state_ptr + c1 * KERNEL + 1, n1.to(dt), mask=cm)
        tl.store(state_ptr + c1 * KERNEL + 2, n2.to(dt), mask=cm)
        tl.store(state_ptr + c1 * KERNEL + 3, n3.to(dt), mask=cm)


def conv_tiles(proj: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, valid: torch.Tensor,
               out: torch.Tensor, block_t: int, warps: int) -> None:
    sessions, c, kernel = state.shape
    n = proj.shape[0]
    seg = n // sessions
    _conv_tiles_kernel[(sessions * triton.cdiv(seg, block_t), c // HEAD)](
        proj, state, weight, out, valid, n, seg, c, KEY_DIM, proj.stride(0), state.stride(0), KERNEL=kernel,
        BLOCK_T=block_t, HEAD=HEAD, num_warps=warps)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(DT)


def _us(fn: Any) -> float:
    return device_ms_per_call(captured(fn).replay) * 1000


def _run(fn: Any, proj: torch.Tensor, state0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``fn(proj, state, out)`` on a copy of ``state0``: its output, its moved state, and us a call."""
    state, out = state0.clone(), torch.empty(proj.shape[0] * CONV, device="cuda", dtype=DT)
    call = functools.partial(fn, proj, state, out)
    call()
    got = (out.clone(), state.clone())
    return got[0], got[1], _us(call)


def _session_out(out: torch.Tensor, n: int, b: int) -> torch.Tensor:
    """Session b's rows of an output laid out [q (n*KD) | k (n*KD) | v (n*VD)]."""
    vd = CONV - 2 * KEY_DIM
    q, k, v = out[:n * KEY_DIM].view(n, KEY_DIM), out[n * KEY_DIM:2 * n * KEY_DIM].view(n, KEY_DIM), \
        out[2 * n * KEY_DIM:].view(n, vd)
    rows = slice(b * SEG, (b + 1) * SEG)
    return torch.cat([q[rows].flatten(), k[rows].flatten(), v[rows].flatten()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    weight = _randn(CONV, 4, seed=3)
    valid = torch.tensor([SEG], device="cuda")
    rows: list[dict[str, Any]] = []
    for sessions in (1, SESSIONS):
        n = sessions * SEG
        proj = _randn(n, CONV + 2048 + 32, seed=4)
        state0 = _randn(sessions, CONV, 4, seed=5)

        run = functools.partial(_run, proj=proj, state0=state0)
        ship_out, ship_state, ship_us = run(lambda p, s, o: kernels.conv_silu(p, s, weight, KEY_DIM, HEAD, valid, o))
        rows.append({"sessions": sessions, "form": "shipped", "us": ship_us})
        for block_t in (16, 32, 64):
            for warps in (2, 4, 8):
                out, state, us = run(lambda p, s, o, bt=block_t, w=warps: conv_tiles(p, s, weight, valid, o, bt, w))
                row = {"sessions": sessions, "form": "tiles", "block_t": block_t, "warps": warps, "us": us,
                       "state_equal": torch.equal(state, ship_state), "out_equal": torch.equal(out, ship_out),
                       "out_max_diff": float((out.float() - ship_out.float()).abs().max())}
                if sessions > 1:  # each session as it reads alone
                    alone = []
                    for b in range(sessions):
                        s1, o1 = state0[b:b + 1].clone(), torch.empty(SEG * CONV, device="cuda", dtype=DT)
                        conv_tiles(proj[b * SEG:(b + 1) * SEG], s1, weight, valid, o1, block_t, warps)
                        alone.append(torch.equal(_session_out(out, n, b), _session_out(o1, SEG, 0))
                                     and torch.equal(state[b], s1[0]))
                    row["batched_equal_alone"] = all(alone)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(json.dumps(rows[0]), json.dumps([r for r in rows if r["form"] == "shipped"]))
    out_doc = {"probe": "conv_tiles", **environment(), "rows": rows}
    path = result_path(args.out, "conv_tiles.json")
    path.write_text(json.dumps(out_doc, indent=1) + "\n")
    print("->", path)


if __name__ == "__main__":
    main()
