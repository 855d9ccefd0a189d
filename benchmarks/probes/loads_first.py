"""Loads issued before stores, a lead: the row-wise kernels of ``kernels.py`` at 2dd9584 (the lead,
``--lead-kernels``) against the shipped ones, alone and in whole read passes, with their bits.

A store may alias any later load as far as the compiler knows, so it keeps each load after every
store above it. The shipped conv's row walk stores each row before loading the next: one memory
round trip a row, eight a program (PTX for sm_90, Triton 3.6 and 3.9: ``ld``/``st`` alternating).
The lead loads its rows first; its ``rms_norm`` loads the weight before the stream's store, its
``qk_norm_rope`` the rotated columns and positions before its first store. The arithmetic is the
same (compiled for sm_90 with Triton 3.6 and 3.9: the same count of every float instruction), so
the bits should be too. It landed at 2dd9584, was taken back at 00bbf42 (no GPU lent), and came
back after this probe's first run (H100, ``results/loads_first.json``): equal bits in every row and
pass, the conv 13 % faster at 8 and 16 sessions, B = 8 passes 1 to 3 % faster. Since then the shipped
kernels are the lead's; to time them again against the walk, pass 00bbf42's file as the lead.

1. Each kernel alone in a CUDA graph (us a call, rounds alternating shipped and lead): the conv at
   one session's 512 rows, 8 and 16 sessions', and 16 single-row sessions (a batched decode's shape);
   ``rms_norm`` with the residual add and ``qk_norm_rope`` at 512 and 4,096 rows; outputs and moved
   states ``torch.equal`` across the two.
2. Whole read passes: two ``FastForward`` over one random 0.8B checkpoint, one captured with the
   lead's kernels, rounds alternating (``read_pass_ab``'s cases); every session's tensors equal.

    git show 2dd9584:shadow/backends/qwen35/kernels.py > .gpudata/kernels_lead.py   # here, carried
    python -m benchmarks.probes.loads_first --out DIR --lead-kernels .gpudata/kernels_lead.py
    # DIR/loads_first.json; CUDA only
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

from benchmarks.common import captured, device_ms_per_call, environment, result_path
from benchmarks.probes import read_pass_ab
from shadow.backends.qwen35 import kernels
from shadow.backends.qwen35.fast.forward import FastForward

DT = torch.bfloat16
SEG = 512
CONV, KEY_DIM, HEAD, HIDDEN = 6144, 2048, 128, 1024  # the 0.8B
HEADS, KVH, HD, RD = 8, 2, 256, 64
Made = tuple[Callable[[], object], Callable[[], list[torch.Tensor]]]  # a call, and what it writes
PATCHED = ("conv_silu", "rms_norm", "qk_norm_rope")
ROUNDS = 3


def _randn(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(DT)


def _ab(make: Callable[[ModuleType], Made], lead: ModuleType) -> dict[str, Any]:
    """``make(mod)`` gives a call on fresh buffers and what it wrote; shipped and lead each run once for
    their bits, then are timed in graphs, rounds alternating."""
    forms = {"shipped": make(kernels), "lead": make(lead)}
    got = {}
    for name, (call, outputs) in forms.items():
        call()
        got[name] = [t.clone() for t in outputs()]
    graphs = {name: captured(call) for name, (call, _) in forms.items()}
    us: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(ROUNDS):
        for name, graph in graphs.items():
            us[name].append(device_ms_per_call(graph.replay) * 1000)
    return {"shipped_us": statistics.median(us["shipped"]), "lead_us": statistics.median(us["lead"]),
            "equal": all(torch.equal(a, b) for a, b in zip(got["shipped"], got["lead"], strict=True))}


def conv_rows(lead: ModuleType) -> list[dict[str, Any]]:
    weight = _randn(CONV, 4, seed=3)
    out = []
    for sessions, seg in ((1, SEG), (8, SEG), (16, SEG), (16, 1)):
        n = sessions * seg
        proj = _randn(n, CONV + 2048 + 32, seed=4)
        state0 = _randn(sessions, CONV, 4, seed=5)
        valid = torch.tensor([seg], device="cuda")

        def make(mod: ModuleType, n: int = n, proj: torch.Tensor = proj, state0: torch.Tensor = state0,
                 valid: torch.Tensor = valid, seg: int = seg) -> Made:
            state, dst = state0.clone(), torch.empty(n * CONV, device="cuda", dtype=DT)
            block_t = 8 if seg % 8 == 0 else 1

            def call() -> None:
                state.copy_(state0)  # every call moves the same state on
                mod.conv_silu(proj, state, weight, KEY_DIM, HEAD, valid, dst, block_t=block_t)

            return call, lambda: [dst, state]

        row = {"kernel": "conv_silu", "sessions": sessions, "rows": n, **_ab(make, lead)}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def rms_rows(lead: ModuleType) -> list[dict[str, Any]]:
    out = []
    w = (1.0 + _randn(HIDDEN, seed=6).float() * 0.1)
    for n in (SEG, 8 * SEG):
        x0, delta = _randn(n, HIDDEN, seed=7), _randn(n, HIDDEN, seed=8)

        def make(mod: ModuleType, x0: torch.Tensor = x0,
                 delta: torch.Tensor = delta) -> Made:
            x, dst = x0.clone(), torch.empty_like(x0)

            def call() -> None:
                x.copy_(x0)  # the add is in place: each call from the same stream
                mod.rms_norm(x, w, 1e-6, dst, add=delta)

            return call, lambda: [x, dst]

        row = {"kernel": "rms_norm (add, with the stream's copy)", "rows": n, **_ab(make, lead)}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def rope_rows(lead: ModuleType) -> list[dict[str, Any]]:
    out = []
    inv_freq = (1.0 / (10_000_000 ** (torch.arange(0, RD, 2, dtype=torch.float32) / RD))).cuda()
    qw, kw = 1.0 + _randn(HD, seed=1).float() * 0.1, 1.0 + _randn(HD, seed=2).float() * 0.1
    for n in (SEG, 8 * SEG):
        proj = _randn(n, HEADS * 2 * HD + 2 * KVH * HD, seed=n)
        starts = torch.arange(n // SEG, device="cuda") * 4096 + 1000

        def make(mod: ModuleType, n: int = n, proj: torch.Tensor = proj,
                 starts: torch.Tensor = starts) -> Made:
            q = torch.empty(n, HEADS, HD, device="cuda", dtype=DT)
            k, v = (torch.empty(n, KVH, HD, device="cuda", dtype=DT) for _ in range(2))
            call = functools.partial(mod.qk_norm_rope, proj, qw, kw, inv_freq, starts, 1e-6, q, k, v, seg=SEG)
            return call, lambda: [q, k, v]

        row = {"kernel": "qk_norm_rope", "rows": n, **_ab(make, lead)}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


@contextmanager
def _kernels_of(mod: ModuleType) -> Iterator[None]:
    saved = {name: getattr(kernels, name) for name in PATCHED}
    for name in PATCHED:
        setattr(kernels, name, getattr(mod, name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(kernels, name, fn)


def passes(lead: ModuleType) -> dict[str, Any]:
    model = read_pass_ab.random_08b()
    forms = {"shipped": FastForward(model, SEG), "lead": FastForward(model, SEG)}
    warm = {}
    for name, fast in forms.items():
        with _kernels_of(lead if name == "lead" else kernels):
            warm[name] = fast.warm_up()
    shipped = {name: getattr(kernels, name) for name in PATCHED}

    def switch(name: str) -> None:  # anything a pass runs outside its graph takes its form's kernels
        for fn_name in PATCHED:
            setattr(kernels, fn_name, getattr(lead, fn_name) if name == "lead" else shipped[fn_name])

    rows = []
    try:
        for batch, group in read_pass_ab.CASES:
            row = read_pass_ab._case(model, forms, batch, group, rounds=4, passes=5, switch=switch)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                              if k != "depths"}), flush=True)
            rows.append(row)
    finally:
        switch("shipped")
    return {"warm_up_s": warm, "rows": rows, "all_equal": all(r["equal"] for r in rows),
            "refused": {name: dict(fast.refused) for name, fast in forms.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--lead-kernels", required=True, help="kernels.py at 2dd9584 (git show 2dd9584:PATH)")
    ap.add_argument("--no-passes", action="store_true", help="the kernels alone only")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("lead_kernels", args.lead_kernels)
    assert spec is not None and spec.loader is not None
    lead = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lead)
    result: dict[str, Any] = {"probe": "loads_first", **environment(), "lead_kernels": args.lead_kernels,
                              "rounds": ROUNDS}
    path = result_path(args.out, "loads_first.json")
    result["kernels"] = conv_rows(lead) + rms_rows(lead) + rope_rows(lead)
    path.write_text(json.dumps(result, indent=1) + "\n")
    if not args.no_passes:
        result["passes"] = passes(lead)
        path.write_text(json.dumps(result, indent=1) + "\n")
    print("->", path)


if __name__ == "__main__":
    main()
