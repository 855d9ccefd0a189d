"""Which of fla's autotune configurations to pin for the GDN call of a 512-row chunk.

fla's own autotuner times every configuration once, here, at the 0.8B's heads, for one session's
chunk (batch 1) and for the batch path's 8 sessions' chunks (batch 8); the batch-1 winners are
what ``shadow/data/kernels/fla_configs.json`` records (the shadow itself never autotunes: see
``gdn_fla.py``). One configuration serves every batch size (a session's bits must not depend on
what it is batched with), so each set of winners, the pinned file's and each kernel's first
configuration are timed at both batch sizes: one call replayed in a CUDA graph.

    python -m benchmarks.probes.fla_tune --out DIR      # writes DIR/fla_tune.json; CUDA and fla-core only
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment


def _tuners() -> dict[str, Any]:
    from triton.runtime.autotuner import Autotuner

    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for attr, obj in list(vars(module).items()):
            seen = 0
            while obj is not None and seen < 8:  # heuristics over autotuner over jit, linked by .fn
                if isinstance(obj, Autotuner):
                    out[attr] = obj
                obj = getattr(obj, "fn", None)
                seen += 1
    return out


def _config(c: Any) -> dict[str, Any]:
    return {"kwargs": dict(c.kwargs), "num_warps": c.num_warps, "num_stages": c.num_stages}


def _inputs(rows: int, heads: int, value_heads: int, dim: int = 128, batch: int = 1) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(0)

    def unit(*shape: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(*shape, device="cuda", generator=gen), dim=-1)

    group = value_heads // heads
    q = unit(batch, rows, heads, dim).repeat_interleave(group, 2).bfloat16()
    k = unit(batch, rows, heads, dim).repeat_interleave(group, 2).bfloat16()
    v = torch.randn(batch, rows, value_heads, dim, device="cuda", generator=gen).bfloat16()
    g = -torch.rand(batch, rows, value_heads, device="cuda", generator=gen) * 0.5
    beta = torch.rand(batch, rows, value_heads, device="cuda", generator=gen).bfloat16()
    state = torch.randn(batch, value_heads, dim, dim, device="cuda", generator=gen)
    return q, k, v, g, beta, state


def _call(x: tuple[torch.Tensor, ...]) -> object:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    q, k, v, g, beta, state = x
    return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                  use_qk_l2norm_in_kernel=False)


def _graph_us(x: tuple[torch.Tensor, ...], n: int = 50) -> float:
    for _ in range(3):
        _call(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _call(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="1,8", help="batch sizes to tune at and time at")
    parser.add_argument("--search", action="store_true", help="then each kernel's every configuration, in turn")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # fla's import warnings
    batches = [int(b) for b in args.batches.split(",")]
    inputs = {b: _inputs(512, 16, 16, batch=b) for b in batches}
    _call(inputs[batches[0]])  # imports fla's kernels, so their tuners can be found
    tuners = _tuners()
    every = {name: list(t.configs) for name, t in tuners.items()}
    sets: dict[str, dict[str, Any]] = {}
    for b in batches:
        for name, t in tuners.items():
            t.configs, t.cache = every[name], {}
        _call(inputs[b])  # fla autotunes every kernel of the call at this shape
        torch.cuda.synchronize()
        sets[f"tuned_at_batch_{b}"] = {name: t.best_config for name, t in tuners.items()
                                       if getattr(t, "best_config", None) is not None}
    pinned = json.loads((Path(__file__).resolve().parents[2] / "shadow/data/kernels/fla_configs.json").read_text())
    sets["pinned"] = {name: next((c for c in every[name] if _config(c) == want), None)
                      for name, want in pinned["kernels"].items() if name in every}
    sets["first"] = {name: every[name][0] for name in sets[f"tuned_at_batch_{batches[0]}"]}
    result: dict[str, Any] = {**environment(), "rows": 512, "heads": 16, "batches": batches, "sets": {}}
    for label, chosen in sets.items():
        for name, t in tuners.items():
            config = chosen.get(name)
            t.configs, t.cache = ([config] if config is not None else every[name][:1]), {}
        result["sets"][label] = {"kernels": {name: _config(c) for name, c in sorted(chosen.items()) if c is not None},
                                 "us": {str(b): _graph_us(inputs[b]) for b in batches}}
        print(label, result["sets"][label]["us"], flush=True)
    if args.search:
        used = {n for chosen in sets.values() for n in chosen}  # the call's kernels, not every fla tuner
        result["search"] = _search(tuners, {n: every[n] for n in used}, sets["pinned"], inputs, batches, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fla_tune.json").write_text(json.dumps(result, indent=1))


def _search(tuners: dict[str, Any], every: dict[str, list[Any]], start: dict[str, Any],
            inputs: dict[int, tuple[torch.Tensor, ...]], batches: list[int], out: Path) -> dict[str, Any]:
    """One round of coordinate descent from ``start``: each kernel in turn tries each of its
    configurations, the others held, and keeps the one that makes the largest batch's call fastest
    without making the smallest batch's slower than at the start by more than 1 % (timing noise).
    Each trial also says, per batch size, whether the call's output and final state are bit for bit
    the start's (``same_bits``): a configuration that keeps them could serve some batch sizes and
    not others without a session's bits depending on its batch."""
    small, large = min(batches), max(batches)
    chosen = dict(start)

    def same_bits(reference: dict[int, Any]) -> dict[str, bool]:
        got: dict[int, Any] = {b: _call(inputs[b]) for b in batches}  # (output, final state)
        return {str(b): all(torch.equal(x, y) for x, y in zip(got[b], reference[b], strict=True)) for b in batches}

    def timed() -> dict[str, float]:
        for name in every:
            config = chosen.get(name)
            tuners[name].configs, tuners[name].cache = ([config] if config is not None else every[name][:1]), {}
        return {str(b): _graph_us(inputs[b]) for b in batches}

    base = timed()
    reference = {b: _call(inputs[b]) for b in batches}
    trials: list[dict[str, Any]] = []
    best = base
    for name in sorted(every, key=lambda n: -len(every[n])):
        if len(every[name]) < 2:
            continue
        keep = chosen.get(name)
        for config in every[name]:
            chosen[name] = config
            us = timed()
            trials.append({"kernel": name, "config": _config(config), "us": us, "same_bits": same_bits(reference)})
            if us[str(small)] <= base[str(small)] * 1.01 and us[str(large)] < best[str(large)]:
                best, keep = us, config
        chosen[name] = keep
        print(name, _config(keep), best, flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "fla_search_trials.json").write_text(json.dumps(trials, indent=1))
    final = timed()  # measured again, all of the choices together
    return {"start_us": base, "best_us": final,
            "kernels": {n: _config(c) for n, c in sorted(chosen.items()) if c is not None}, "trials": trials}


if __name__ == "__main__":
    main()
