"""The GDN state pass and output in one kernel of ours (``gdn_fused``) against fla's two kernels, in
one process: first the layer's call alone, then whole read passes.

1. ``gdn_fla.chunk_rule_in_place`` at the 0.8B's heads (16 x 128), B sessions of 512 rows, bf16:
   whether the fused form gives fla's bits (o and the state, ``torch.equal``; else the largest
   difference), then us per call, each form replayed in a CUDA graph of 20 calls, forms
   alternating, for the fused kernel's launch shapes (value columns a program, warps, stages, and
   the state's chain moved before the chunk's output), each shape's bits against fla's.
2. Two ``FastForward`` instances over one random 0.8B checkpoint, captured with fla's kernels and
   with the fused one (``read_pass_ab._case``: sessions at their depths, rounds alternating): wall
   a pass and ms per 512 ids, and whether the two forms' sessions end equal. Each instance's
   warm-up check (every batch size against its sessions read alone) is reported as ``refused``.

    python -m benchmarks.probes.gdn_fused_ab --out DIR     # DIR/gdn_fused_ab.json; CUDA and fla only
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from typing import Any

import torch

from benchmarks.common import environment, result_path
from benchmarks.probes.read_pass_ab import GRID, _case, random_08b
from shadow.backends.qwen35 import gdn_fla, gdn_fused
from shadow.backends.qwen35.fast.forward import FastForward

# (BV, warps, stages, the state's chain before the chunk's output: ``update_first``)
# Two stages hold 115 KB of shared memory at 32 columns: one program an SM. One stage holds 45 KB
# and 233 registers a thread (ptxas for sm_90, Triton 3.6): two programs an SM, no cp.async.
ORIGINAL = gdn_fused.state_and_output
SHAPES = ((32, 4, 2, False), (32, 4, 3, False), (64, 4, 2, False), (32, 4, 1, False), (64, 4, 1, False),
          (16, 4, 1, False), (32, 8, 1, False), (32, 4, 2, True), (32, 4, 1, True))
CASES = ((1, "0-2k"), (8, "0-2k"), (16, "0-2k"), (8, "32k"))


def _inputs(batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    from fla.ops.utils import chunk_local_cumsum

    gen = torch.Generator(device="cuda").manual_seed(seed)
    n = batch * GRID

    def unit(*shape: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(*shape, device="cuda", generator=gen), dim=-1).bfloat16()

    q, k = unit(n, 16, 128), unit(n, 16, 128)
    v = torch.randn(n, 16, 128, device="cuda", generator=gen).bfloat16()
    g = -torch.rand(batch, GRID, 16, device="cuda", generator=gen) * 0.5
    sums = chunk_local_cumsum(g, chunk_size=64, scale=1.4426950408889634).reshape(n, 16)
    beta = torch.rand(n, 16, device="cuda", generator=gen).bfloat16()
    state = torch.randn(batch, 16, 128, 128, device="cuda", generator=gen) * 0.05
    solve = torch.zeros(1, n, 16, 64, dtype=torch.bfloat16, device="cuda")
    return q, k, v, sums, beta, state, solve


def _graph_us(call: Any, calls: int = 20, rounds: int = 5) -> list[float]:
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    out = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / calls)
    return out


def _layer(batch: int) -> dict[str, Any]:
    q, k, v, sums, beta, state, solve = _inputs(batch, seed=batch)
    s_fla, s_fused = state.clone(), state.clone()
    o_fla = gdn_fla.chunk_rule_in_place(q, k, v, sums, beta, s_fla, solve, fused=False)
    o_fused = gdn_fla.chunk_rule_in_place(q, k, v, sums, beta, s_fused, solve, fused=True)
    row: dict[str, Any] = {"batch": batch, "o_equal": torch.equal(o_fla, o_fused),
                           "state_equal": torch.equal(s_fla, s_fused),
                           "o_max_diff": (o_fla.float() - o_fused.float()).abs().max().item(),
                           "o_rel": ((o_fla.float() - o_fused.float()).norm() / o_fla.float().norm()).item(),
                           "state_max_diff": (s_fla - s_fused).abs().max().item()}
    if batch > 1:  # the fused form's session 1 alone against its bits in the batch
        one = slice(GRID, 2 * GRID)
        s_one = state[1:2].clone()
        o_one = gdn_fla.chunk_rule_in_place(q[one], k[one], v[one], sums[one], beta[one], s_one, solve[:, :GRID],
                                            fused=True)
        row["fused_alone_equal_batched"] = torch.equal(o_one, o_fused[one]) and torch.equal(s_one[0], s_fused[1])
    forms: dict[str, Any] = {"fla": functools.partial(gdn_fla.chunk_rule_in_place, fused=False)}
    original = ORIGINAL
    for bv, warps, stages, first in SHAPES:
        name = _name(bv, warps, stages, first)
        shaped = _shaped(name)
        forms[name] = (shaped, )
        s_form = state.clone()
        gdn_fused.state_and_output = shaped
        try:  # each launch shape's bits against fla's
            o_form = gdn_fla.chunk_rule_in_place(q, k, v, sums, beta, s_form, solve, fused=True)
            row.setdefault("equal_to_fla", {})[name] = torch.equal(o_form, o_fla) and torch.equal(s_form, s_fla)
        except Exception as err:
            row[f"{name}_error"] = repr(err)[:300]
        finally:
            gdn_fused.state_and_output = original  # type: ignore[assignment]
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(3):  # forms alternating
        for name, form in forms.items():
            work = state.clone()
            if isinstance(form, tuple):
                gdn_fused.state_and_output = form[0]  # type: ignore[assignment]
                call = functools.partial(gdn_fla.chunk_rule_in_place, q, k, v, sums, beta, work, solve, fused=True)
            else:
                call = functools.partial(form, q, k, v, sums, beta, work, solve)
            try:
                times[name] += _graph_us(call)
            except Exception as err:  # a shape that does not compile or fit is reported
                times[name] = []
                row[f"{name}_error"] = repr(err)[:300]
            finally:
                gdn_fused.state_and_output = original  # type: ignore[assignment]
    row["us_per_call"] = {name: statistics.median(t) for name, t in times.items() if t}
    return row


def _name(bv: int, warps: int, stages: int, first: bool) -> str:
    return f"fused_{bv}x{warps}x{stages}" + ("_update_first" if first else "")


def _shaped(name: str) -> Any:
    """``fused_BVxWARPSxSTAGES[_update_first]``: the fused kernel at that launch shape."""
    shape, _, first = name.removeprefix("fused_").partition("_")
    bv, warps, stages = (int(x) for x in shape.split("x"))
    return functools.partial(ORIGINAL, bv=bv, warps=warps, stages=stages, update_first=first == "update_first")


SHIPPED = _name(gdn_fused.BV, gdn_fused.WARPS, gdn_fused.STAGES, False)


def _form(name: str) -> None:
    """What a pass runs, in its graph or outside it, takes its form's kernel: fla's, or the fused
    one at its launch shape (gdn_fla calls ``gdn_fused.state_and_output`` through the module)."""
    gdn_fla.FUSED_FROM = 10**9 if name == "fla" else 1
    gdn_fused.state_and_output = ORIGINAL if name == "fla" else _shaped(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 8, 16], help="the layer's call at these B")
    ap.add_argument("--layer-only", action="store_true", help="skip the whole passes")
    ap.add_argument("--pass-cases", nargs="*", default=[f"{b}:{g}" for b, g in CASES],
                    help="whole passes as B:GROUP, GROUP one of read_pass_ab's (0-2k, 32k)")
    ap.add_argument("--pass-forms", nargs=2, default=["fla", SHIPPED],
                    help="the two forms the passes compare: fla, or fused_BVxWARPSxSTAGES[_update_first]")
    args = ap.parse_args()
    assert gdn_fla.available()
    out: dict[str, Any] = {"probe": "gdn_fused_ab", **environment(), "layer": [], "passes": []}
    path = result_path(args.out, "gdn_fused_ab.json")
    for batch in args.batches:
        row = _layer(batch)
        out["layer"].append(row)
        print(json.dumps(row), flush=True)
        path.write_text(json.dumps(out, indent=1) + "\n")
    if args.layer_only:
        return
    model = random_08b()
    forms: dict[str, FastForward] = {}
    for name in args.pass_forms:
        _form(name)  # read when each graph is captured
        forms[name] = FastForward(model, GRID)
        forms[name].warm_up()
    out["refused"] = {name: dict(fast.refused) for name, fast in forms.items()}
    for batch, group in (tuple(case.split(":")) for case in args.pass_cases):
        batch = int(batch)
        try:
            row = _case(model, forms, batch, group, args.rounds, args.passes, switch=_form)
        finally:
            _form("fla")
        out["passes"].append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "depths"}),
              flush=True)
        path.write_text(json.dumps(out, indent=1) + "\n")
    print("->", path)


if __name__ == "__main__":
    main()
