"""Where the host's time goes in a read's pass: ``read_chunks`` under cProfile, the device
synchronised between passes with the profiler off (so only the host's own work is counted).

0.8B shape, random weights, bf16; B sessions at 0-2k (``read_pass_ab._case``'s placing), ``passes``
passes each. Per B: the host's ms a pass (timed without the profiler) and the functions with the
most own time under it.

    python -m benchmarks.probes.pass_host --out DIR     # DIR/pass_host.json; CUDA only
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment, result_path
from benchmarks.probes.read_pass_ab import GRID, SPREAD, _placed, random_08b
from shadow.backends.qwen35.fast.forward import FastForward


def _top(stats: pstats.Stats, passes: int, count: int = 25) -> list[dict[str, Any]]:
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(path).name}:{line}:{name}", "calls_a_pass": calls / passes,
                     "own_us_a_pass": own / passes * 1e6, "cumulative_us_a_pass": cumulative / passes * 1e6})
    return sorted(rows, key=lambda r: -r["own_us_a_pass"])[:count]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--passes", type=int, default=20)
    args = ap.parse_args()
    model = random_08b()
    fast = FastForward(model, GRID, batches=(1, 8, 16))
    fast.warm_up()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in (1, 8, 16):
        states = [_placed(model, SPREAD[b % len(SPREAD)], (2 * args.passes + 2) * GRID, seed=b) for b in range(batch)]
        ids = [torch.randint(0, 248000, (GRID,), generator=gen) for _ in range(2 * args.passes + 1)]
        fast.read_chunks([(ids[0], s) for s in states])
        host = []
        for p in range(args.passes):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fast.read_chunks([(ids[1 + p], s) for s in states])
            host.append((time.perf_counter() - t0) * 1e3)
        prof = cProfile.Profile()
        for p in range(args.passes):
            torch.cuda.synchronize()
            prof.enable()
            fast.read_chunks([(ids[1 + args.passes + p], s) for s in states])
            prof.disable()
        torch.cuda.synchronize()
        row = {"batch": batch, "host_ms": statistics.median(host), "top": _top(pstats.Stats(prof), args.passes)}
        rows.append(row)
        print(json.dumps({"batch": batch, "host_ms": round(row["host_ms"], 3)}), flush=True)
        for r in row["top"][:15]:
            print(f"   {r['own_us_a_pass']:8.1f} us own {r['cumulative_us_a_pass']:8.1f} cum "
                  f"{r['calls_a_pass']:6.1f} calls  {r['function']}", flush=True)
    out = {"probe": "pass_host", **environment(), "passes": args.passes, "rows": rows}
    path = result_path(args.out, "pass_host.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("->", path)


if __name__ == "__main__":
    main()
