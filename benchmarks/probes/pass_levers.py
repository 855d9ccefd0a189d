"""Smaller levers on a batched read's pass, each timed alone at one session's rows (512) and at
8 sessions' (4,096), the 0.8B's shapes, bf16, in a CUDA graph (median of 5 samples of 20 replays):

- ``qk_norm_rope``: the cosine and sine on the rotated columns only, against the kernel of
  ``--old-kernels`` (a copy of ``kernels.py`` from before), outputs ``torch.equal``;
- ``conv_silu``: rows per program (``block_t``) and warps; every shape against ``block_t`` 8 with 1
  warp, outputs and moved states ``torch.equal``;
- attention from a table at 0-2k (B = 1, 8) and 32k (B = 8) under split rules of ``min_split``
  1,024 (shipped), 2,048 and 4,096 keys, each against one ``attend`` call a chunk under the same rule;
- ``rms_norm``: rows per program and warps, against the shipped launch;
- the conv and recurrent states of 8 sessions into their static slots and back: per-session
  ``copy_`` (shipped), ``torch._foreach_copy_``, one Triton launch from a table of addresses.

    python -m benchmarks.probes.pass_levers --out DIR [--old-kernels PATH]   # DIR/pass_levers.json; CUDA only
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import traceback
from collections.abc import Callable
from typing import Any

import torch
import triton

from benchmarks.common import captured, device_ms_per_call, environment, result_path

DT = torch.bfloat16
ROWS_ALONE, SESSIONS = 512, 8
# the 0.8B: hidden 1024; GDN conv channels 6144 (key dim 2048, heads of 128); attention 8 heads, 2 KV, dim 256,
# rotary 64; 18 GDN layers with 16 value heads of 128 x 128
HIDDEN, CONV, KEY_DIM, HEAD = 1024, 6144, 2048, 128
HEADS, KVH, HD, RD = 8, 2, 256, 64
GDN_LAYERS, HV, DK, DV = 18, 16, 128, 128


def _graph_ms(fn: Callable[[], object]) -> float:
    return device_ms_per_call(captured(fn).replay) * 1000  # us


def _randn(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=gen).to(DT)


def qk_norm_rope(old: Any) -> list[dict[str, Any]]:
    from shadow.backends.qwen35 import kernels

    rows_out = []
    inv_freq = (1.0 / (10_000_000 ** (torch.arange(0, RD, 2, dtype=torch.float32) / RD))).cuda()
    for n in (ROWS_ALONE, SESSIONS * ROWS_ALONE):
        proj = _randn(n, HEADS * 2 * HD + 2 * KVH * HD, seed=n)
        qw, kw = 1.0 + _randn(HD, seed=1).float() * 0.1, 1.0 + _randn(HD, seed=2).float() * 0.1
        starts = torch.arange(n // ROWS_ALONE, device="cuda") * 4096 + 1000
        outs = {}
        for name, mod in (("new", kernels), ("old", old)):
            if mod is None:
                continue
            q = torch.empty(n, HEADS, HD, device="cuda", dtype=DT)
            k, v = (torch.empty(n, KVH, HD, device="cuda", dtype=DT) for _ in range(2))

            call = functools.partial(mod.qk_norm_rope, proj, qw, kw, inv_freq, starts, 1e-6, q, k, v, seg=ROWS_ALONE)

            call()
            outs[name] = ((q.clone(), k.clone(), v.clone()), _graph_ms(call))
        row: dict[str, Any] = {"rows": n, "new_us": outs["new"][1]}
        if "old" in outs:
            row["old_us"] = outs["old"][1]
            row["equal"] = all(torch.equal(a, b) for a, b in zip(outs["new"][0], outs["old"][0], strict=True))
        rows_out.append(row)
    return rows_out


def conv_silu() -> list[dict[str, Any]]:
    from shadow.backends.qwen35 import kernels

    rows_out = []
    weight = _randn(CONV, 4, seed=3)
    for sessions in (1, SESSIONS):
        n = sessions * ROWS_ALONE
        proj = _randn(n, CONV + 2048 + 32, seed=4)
        state0 = _randn(sessions, CONV, 4, seed=5)
        valid = torch.tensor([ROWS_ALONE], device="cuda")
        ref = None
        for block_t, warps in ((8, 1), (4, 1), (16, 1), (32, 1), (64, 1), (8, 2), (16, 2), (32, 2), (32, 4)):
            state = state0.clone()
            out = torch.empty(n * CONV, device="cuda", dtype=DT)

            call = functools.partial(kernels.conv_silu, proj, state, weight, KEY_DIM, HEAD, valid, out,
                                     block_t=block_t, warps=warps)

            call()
            got = (out.clone(), state.clone())
            us = _graph_ms(call)
            if ref is None:
                ref = got
            rows_out.append({"sessions": sessions, "block_t": block_t, "warps": warps, "us": us,
                             "equal": torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])})
    return rows_out


def attention_rules() -> list[dict[str, Any]]:
    from shadow.backends.qwen35.attention import triton as attention

    rows_out = []
    spread = [1024, 0, 2048, 512, 1536, 0, 1024, 2048]
    for batch, depths in ((1, [1024]), (1, [2048]), (SESSIONS, spread), (SESSIONS, [32768] * SESSIONS)):
        gen = torch.Generator(device="cuda").manual_seed(batch)
        kv = []
        for d in depths:
            cap = -(-(d + ROWS_ALONE) // 8192) * 8192
            kv.append(tuple(torch.randn(cap, KVH, HD, device="cuda", generator=gen).to(DT) for _ in range(2)))
        q = torch.randn(batch * ROWS_ALONE, HEADS, HD, device="cuda", generator=gen).to(DT)
        like = kv[0][0][:1]
        for min_split in (1024, 2048, 4096):
            table_rows = []
            for s, (k, v) in zip(depths, kv, strict=True):
                step = attention.split_len(ROWS_ALONE * HEADS // KVH, KVH, s + ROWS_ALONE, min_split=min_split)
                table_rows.append([s, step, triton.cdiv(s + ROWS_ALONE, step), k.data_ptr(), v.data_ptr()])
            table = torch.tensor(table_rows, device="cuda")
            out_t, out_c = torch.empty_like(q), torch.empty_like(q)
            attention.attend_table(q, table, like, out_t)
            for b, (s, (k, v)) in enumerate(zip(depths, kv, strict=True)):
                part = slice(b * ROWS_ALONE, (b + 1) * ROWS_ALONE)
                attention.attend(q[part], k, v, s, out_c[part], min_split=min_split)
            us = _graph_ms(functools.partial(attention.attend_table, q, table, like, out_t))
            flops = sum(4 * ROWS_ALONE * HEADS * HD * (s + (ROWS_ALONE + 1) / 2) for s in depths)
            rows_out.append({"batch": batch, "depths": depths, "min_split": min_split,
                             "splits": [r[2] for r in table_rows], "us": us, "tflops": flops / us / 1e6,
                             "table_equal_calls": torch.equal(out_t, out_c)})
    return rows_out


def rms_norm() -> list[dict[str, Any]]:
    from shadow.backends.qwen35 import kernels

    rows_out = []
    n = SESSIONS * ROWS_ALONE
    x0, delta = _randn(n, HIDDEN, seed=6), _randn(n, HIDDEN, seed=7)
    w = 1.0 + _randn(HIDDEN, seed=8).float() * 0.1
    ref = None
    for rows, warps in ((1, 4), (1, 2), (1, 8), (2, 4), (4, 4), (4, 8), (8, 8)):
        x, out = x0.clone(), torch.empty_like(x0)

        def call(x: torch.Tensor = x, out: torch.Tensor = out, rows: int = rows, warps: int = warps) -> None:
            kernels._rms_norm_kernel[(triton.cdiv(n, rows),)](x, delta, w, out, n, HIDDEN, x.stride(0), delta.stride(0),
                                                             out.stride(0), 1e-6, ADD=True, ROWS=rows, BLOCK=HIDDEN,
                                                             num_warps=warps)

        x.copy_(x0)
        call()
        got = out.clone()
        x.copy_(x0)
        us = _graph_ms(lambda x=x: (x.copy_(x0), call()))
        us_copy = _graph_ms(lambda x=x: x.copy_(x0))
        if ref is None:
            ref = got
        rows_out.append({"rows_per_program": rows, "warps": warps, "us": us - us_copy, "equal": torch.equal(got, ref)})
    return rows_out


def slots() -> list[dict[str, Any]]:
    conv_all = torch.zeros(GDN_LAYERS, 16, CONV, 4, device="cuda", dtype=DT)
    rec_all = torch.zeros(GDN_LAYERS, 16, HV, DK, DV, device="cuda", dtype=torch.float32)
    convs = [_randn(GDN_LAYERS, CONV, 4, seed=10 + b) for b in range(SESSIONS)]
    recs = [_randn(GDN_LAYERS, HV, DK, DV, seed=20 + b).float() for b in range(SESSIONS)]
    pairs = [(conv_all[:, b], convs[b]) for b in range(SESSIONS)] + [(rec_all[:, b], recs[b]) for b in range(SESSIONS)]

    def per_session(into: bool) -> None:
        for static, own in pairs:
            (static if into else own).copy_(own if into else static)

    def foreach(into: bool) -> None:
        statics, owns = [p[0] for p in pairs], [p[1] for p in pairs]
        torch._foreach_copy_(statics if into else owns, owns if into else statics)

    tables = [torch.tensor([t.data_ptr() for t in ts], device="cuda") for ts in (convs, recs)]

    def triton_table(into: bool) -> None:  # the launch slots.py keeps (kernels.copy_slots)
        from shadow.backends.qwen35 import kernels

        for static, table in ((conv_all, tables[0]), (rec_all, tables[1])):
            kernels.copy_slots(static, table, into)

    rows_out = []
    moved = sum(t.numel() * t.element_size() for _, t in pairs)
    for name, fn in (("per_session_copy", per_session), ("foreach_copy", foreach), ("triton_table", triton_table)):
        for into in (True, False):
            conv_all.zero_()
            rec_all.zero_()
            if into:
                fn(True)
                ok = all(torch.equal(s, o) for s, o in pairs)
            else:
                per_session(True)
                saved = [o.clone() for _, o in pairs]
                for _, o in pairs:
                    o.zero_()
                fn(False)
                ok = all(torch.equal(o, s) for (_, o), s in zip(pairs, saved, strict=True))
            us = device_ms_per_call(lambda fn=fn, into=into: fn(into)) * 1000
            rows_out.append({"form": name, "into_slots": into, "us_eager": us, "equal": ok,
                             "gb_per_s": 2 * moved / us / 1e3})
    return rows_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--old-kernels", default="", help="a copy of kernels.py from before, for qk_norm_rope's bits")
    args = ap.parse_args()
    old = None
    if args.old_kernels:
        spec = importlib.util.spec_from_file_location("old_kernels", args.old_kernels)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    result: dict[str, Any] = {"probe": "pass_levers", **environment(), "old_kernels": args.old_kernels or None}
    path = result_path(args.out, "pass_levers.json")
    for name, fn in (("qk_norm_rope", lambda: qk_norm_rope(old)), ("conv_silu", conv_silu),
                     ("attention", attention_rules), ("rms_norm", rms_norm), ("slots", slots)):
        try:
            result[name] = fn()
        except Exception:
            result[name] = {"error": traceback.format_exc()}
        print(name, json.dumps(result[name]), flush=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
    print("->", path)


if __name__ == "__main__":
    main()
