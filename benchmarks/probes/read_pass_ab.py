"""A read's pass captured whole (attention from a table inside the graph) against the piecewise
pass (eager attention between captured pieces), in one process on the same model, alternating.

Two ``FastForward`` instances over one 0.8B-shape checkpoint of random weights (bf16), one with
``table_reads`` off. For each batch size and depth group, sessions placed at their depth (random KV
rows below it) read ``passes`` chunks a round in each form, rounds alternating; per pass the wall
time (device synchronised before and after) and the host's time to return from ``read_chunks``
(the device synchronised before it only: what the host spends queueing the pass). At the end every
session's tensors in one form equal the other's (``torch.equal``).

    python -m benchmarks.probes.read_pass_ab --out DIR     # DIR/read_pass_ab.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment, result_path
from benchmarks.read_rate.run import MODELS, _write_model
from shadow.backends.qwen35 import Qwen35
from shadow.backends.qwen35.fast.forward import FastForward
from shadow.backends.qwen35.fast.graphs import clone_state, same_state
from shadow.backends.qwen35.state import ModelState

GRID = 512
CASES = ((1, "0-2k"), (8, "0-2k"), (16, "0-2k"), (1, "32k"), (8, "32k"))
SPREAD = (1024, 0, 2048, 512, 1536)


def random_08b() -> Qwen35:
    """The 0.8B shape with random weights, bf16, on CUDA (written as a checkpoint, loaded, deleted)."""
    with tempfile.TemporaryDirectory(prefix="random_08b-") as tmp:
        _write_model(Path(tmp), MODELS["0.8b"](), torch.device("cuda"), torch.bfloat16)
        return Qwen35.from_pretrained(Path(tmp), device="cuda", dtype="bfloat16")


def _placed(model: Qwen35, depth: int, room: int, seed: int) -> ModelState:
    state = model.new_state()
    state.reserve(depth + room)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for t in state.k + state.v:
        t[:depth].normal_(generator=gen)
    state.length = depth
    return state


def _case(model: Qwen35, forms: dict[str, FastForward], batch: int, group: str, rounds: int,
          passes: int, switch: Callable[[str], object] = lambda name: None) -> dict[str, Any]:
    """``switch(name)`` runs before each form's passes (forms that share one FastForward)."""
    depths = [SPREAD[b % len(SPREAD)] if group == "0-2k" else 32768 for b in range(batch)]
    room = (rounds * passes + 1) * GRID
    base = [_placed(model, d, room, seed=b) for b, d in enumerate(depths)]
    states = {name: [clone_state(s) for s in base] for name in forms}
    gen = torch.Generator().manual_seed(batch)
    chunks = [torch.randint(0, 248000, (GRID,), generator=gen) for _ in range(rounds * passes + 1)]
    wall: dict[str, list[float]] = {name: [] for name in forms}
    host: dict[str, list[float]] = {name: [] for name in forms}
    for name, fast in forms.items():  # a warm pass each
        switch(name)
        fast.read_chunks([(chunks[0], s) for s in states[name]])
    at = 1
    for _ in range(rounds):
        for name, fast in forms.items():
            switch(name)
            for p in range(passes):
                ids = chunks[at + p]
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fast.read_chunks([(ids, s) for s in states[name]])
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                host[name].append((t1 - t0) * 1e3)
                wall[name].append((t2 - t0) * 1e3)
        at += passes
    equal = all(same_state(each[0], other) for each in zip(*states.values(), strict=True) for other in each[1:])
    return {"batch": batch, "group": group, "depths": depths, "equal": equal,
            **{f"{name}_wall_ms": statistics.median(wall[name]) for name in forms},
            **{f"{name}_host_ms": statistics.median(host[name]) for name in forms},
            **{f"{name}_ms_per_512": statistics.median(wall[name]) / batch for name in forms}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    model = random_08b()
    forms = {"whole": FastForward(model, GRID), "piecewise": FastForward(model, GRID)}
    forms["piecewise"].table_reads = False
    warm = {name: fast.warm_up() for name, fast in forms.items()}
    rows = []
    for batch, group in CASES:
        row = _case(model, forms, batch, group, args.rounds, args.passes)
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "depths"}),
              flush=True)
    out = {"probe": "read_pass_ab", **environment(), "warm_up_s": warm, "rounds": args.rounds,
           "passes": args.passes, "rows": rows, "all_equal": all(r["equal"] for r in rows),
           "refused": {name: dict(fast.refused) for name, fast in forms.items()}}
    path = result_path(args.out, "read_pass_ab.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("all equal:", out["all_equal"], "->", path)


if __name__ == "__main__":
    main()
