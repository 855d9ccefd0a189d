"""Which of fla's autotune configurations to pin for the GDN call of a 512-row chunk.

fla's own autotuner times every configuration once, here, at the 0.8B's heads; the winners are
what ``shadow/data/kernels/fla_configs.json`` records (the shadow itself never autotunes: see
``gdn_fla.py``). Also times one call, replayed in a CUDA graph, with the winners and with each
kernel's first configuration.

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


def _inputs(rows: int, heads: int, value_heads: int, dim: int = 128) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(0)

    def unit(*shape: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(*shape, device="cuda", generator=gen), dim=-1)

    group = value_heads // heads
    q = unit(1, rows, heads, dim).repeat_interleave(group, 2).bfloat16()
    k = unit(1, rows, heads, dim).repeat_interleave(group, 2).bfloat16()
    v = torch.randn(1, rows, value_heads, dim, device="cuda", generator=gen).bfloat16()
    g = -torch.rand(1, rows, value_heads, device="cuda", generator=gen) * 0.5
    beta = torch.rand(1, rows, value_heads, device="cuda", generator=gen).bfloat16()
    state = torch.randn(1, value_heads, dim, dim, device="cuda", generator=gen)
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
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # fla's import warnings
    x = _inputs(512, 16, 16)
    _call(x)  # fla autotunes every kernel of the call at this shape
    torch.cuda.synchronize()
    tuners = _tuners()
    firsts = {name: list(t.configs)[:1] for name, t in tuners.items()}
    chosen = {name: t.best_config for name, t in tuners.items() if getattr(t, "best_config", None) is not None}
    result: dict[str, Any] = {**environment(), "rows": 512, "heads": 16,
                              "kernels": {name: _config(c) for name, c in sorted(chosen.items())}}
    for name, config in chosen.items():
        tuners[name].configs, tuners[name].cache = [config], {}
    result["chosen_us"] = _graph_us(x)
    for name in chosen:
        tuners[name].configs, tuners[name].cache = firsts[name], {}
    result["first_us"] = _graph_us(x)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fla_tune.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
