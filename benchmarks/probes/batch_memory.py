"""What the batch path holds beside the sessions, per model size (issue 18's memory point), with its
exactness on the same reader.

For each model (0.8B, 2B, 4B at their real shapes, random bf16 weights) read as ``read_rate_batch``
reads: ``warm_up`` (captures of every batch and span size, the warm-up check of each), then
``fast_report`` (state slots, static buffers, what capture added to the allocator, the allocator's
whole reservation, the sizes the check let through); 8 sessions read by real chunks to mixed depths
in batches, then all 8 in one pass, each ``torch.equal`` to itself read alone and to a fresh
prefill of its ids (``read_rate_batch._exact``); and ms per 512 ids at B = 1 and 8, 0-2k.

    python -m benchmarks.probes.batch_memory --out DIR [--models 0.8b,2b,4b]   # DIR/batch_memory.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import read_rate_batch as batch_mod
from benchmarks import read_rate_floor as floor_mod
from benchmarks.common import environment, result_path
from benchmarks.read_rate import FULL, MODELS, _free, _write_model
from shadow.backends.qwen35 import Qwen35
from shadow.backends.reader import TorchReader

PLAN = batch_mod.BatchPlan(sizes=(1, 8), depths=(0,), repeats=5, exact_sessions=8, exact_chunks=4,
                           attention_depths=())


def measure(folder: Path, rates: tuple[float, float]) -> dict[str, Any]:
    t0 = time.perf_counter()
    model = Qwen35.from_pretrained(folder, device="cuda", dtype="bfloat16")
    loaded = torch.cuda.memory_allocated()  # the weights (main refuses to run without CUDA)
    reader = TorchReader(model, PLAN.grid, fast=True, spans=PLAN.spans)
    warm = reader.warm_up()
    report = reader.fast_report()
    exact = batch_mod._exact(reader, PLAN)
    rows = batch_mod._timings(reader, PLAN, rates, 2)
    out = {"warm_up_s": warm, "fast_report": report, "exact": exact,
           "ms_per_512": {str(r["batch"]): r["ours_ms"] for r in rows},
           "allocated_after_load_bytes": loaded,
           "wall_s": time.perf_counter() - t0}
    del reader, model
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", default="0.8b,2b,4b")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("batch_memory needs CUDA")
    device = torch.device("cuda")
    rates = (floor_mod.matmul_rate(device, torch.bfloat16, FULL.matmul_n), floor_mod.copy_rate(device, FULL.copy_bytes))
    out: dict[str, Any] = {"probe": "batch_memory", **environment(), "plan": PLAN.__dict__, "models": {}}
    path = result_path(args.out, "batch_memory.json")
    with tempfile.TemporaryDirectory(prefix="batch_memory-") as tmp:
        for name in args.models.split(","):
            folder = Path(tmp) / name
            _write_model(folder, MODELS[name](), device, torch.bfloat16)
            _free("cuda")
            got = measure(folder, rates)
            _free("cuda")
            out["models"][name] = got
            rep = got["fast_report"]
            print(name, json.dumps({k: rep.get(k) for k in ("state_slots", "state_slot_bytes", "static_bytes",
                                                            "capture_reserved_bytes", "allocator_reserved_bytes",
                                                            "batches", "spans")}),
                  "exact:", got["exact"]["equal"], "ms/512:", got["ms_per_512"], flush=True)
            out["all_equal"] = all(m["exact"]["equal"] for m in out["models"].values())
            path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print("all equal:", out["all_equal"], "->", path)


if __name__ == "__main__":
    main()
