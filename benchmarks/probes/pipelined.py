"""What the device gains when the host stages a read's next pass while the last one runs: passes
synchronised one by one (the reader today: ``read_chunks`` waits for its pass) against the same
passes queued back to back (the host stages pass i+1 while the device runs pass i).

0.8B shape, random weights, bf16; B sessions at 0-2k (``read_pass_ab``'s placing) or at 32k. Each
round reads ``passes`` passes from the same positions (the states cut back to where they were
placed) in each form, forms alternating. Per form: ms a pass, the wall of the round over its
passes; for the queued form also each pass's device time (CUDA events between one pass's end and
the next's). Exact: one round from the same states in each form, every tensor ``torch.equal``.

    python -m benchmarks.probes.pipelined --out DIR     # DIR/pipelined.json; CUDA only
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from typing import Any

import torch

from benchmarks.common import environment, result_path
from benchmarks.probes.read_pass_ab import GRID, SPREAD, _placed, random_08b
from shadow.backends.qwen35.fast.forward import FastForward
from shadow.backends.qwen35.fast.graphs import clone_state, same_state
from shadow.backends.qwen35.state import ModelState

CASES = ((1, "0-2k"), (2, "0-2k"), (4, "0-2k"), (8, "0-2k"), (4, "32k"), (8, "32k"))


def _round(fast: FastForward, states: list[ModelState], chunks: list[torch.Tensor], queued: bool) -> list[float]:
    """ms of each pass: synchronised, each pass's own wall; queued, the round's wall split evenly
    (per-pass device times come from ``_events``)."""
    torch.cuda.synchronize()
    walls = []
    t0 = time.perf_counter()
    for ids in chunks:
        fast.read_chunks([(ids, s) for s in states])
        if not queued:
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            walls.append((t1 - t0) * 1e3)
            t0 = t1
    if queued:
        torch.cuda.synchronize()
        walls = [(time.perf_counter() - t0) * 1e3 / len(chunks)] * len(chunks)
    return walls


def _events(fast: FastForward, states: list[ModelState], chunks: list[torch.Tensor]) -> list[float]:
    """Queued passes, each pass's device time: from the end of the one before (the first: from an
    event recorded before its staging) to its own end."""
    torch.cuda.synchronize()
    ends = [torch.cuda.Event(enable_timing=True)]
    ends[0].record()
    for ids in chunks:
        fast.read_chunks([(ids, s) for s in states])
        ends.append(torch.cuda.Event(enable_timing=True))
        ends[-1].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in itertools.pairwise(ends)]


def _case(model: Any, fast: FastForward, batch: int, group: str, rounds: int, passes: int) -> dict[str, Any]:
    depths = [SPREAD[b % len(SPREAD)] if group == "0-2k" else 32768 for b in range(batch)]
    states = [_placed(model, d, (passes + 1) * GRID, seed=b) for b, d in enumerate(depths)]
    gen = torch.Generator().manual_seed(batch)
    chunks = [torch.randint(0, 248000, (GRID,), generator=gen) for _ in range(passes)]

    def back() -> None:
        for s, d in zip(states, depths, strict=True):
            s.truncate(d)

    # exact: the same round from the same states, synchronised and queued
    apart = [clone_state(s) for s in states]
    together = [clone_state(s) for s in states]
    _round(fast, apart, chunks, queued=False)
    _round(fast, together, chunks, queued=True)
    equal = all(same_state(a, b) for a, b in zip(apart, together, strict=True))
    del apart, together
    forms: dict[str, list[float]] = {"synchronised": [], "queued": [], "queued_device": []}
    for _ in range(rounds):
        for name in ("synchronised", "queued"):
            back()
            forms[name] += _round(fast, states, chunks, queued=name == "queued")
        back()
        forms["queued_device"] += _events(fast, states, chunks)
    row = {"batch": batch, "depth": group, "equal": equal, "passes": rounds * passes}
    for name, ms in forms.items():
        row[f"{name}_ms"] = statistics.median(ms)
    row["gain"] = 1 - row["queued_ms"] / row["synchronised_ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=12)
    args = ap.parse_args()
    model = random_08b()
    fast = FastForward(model, GRID, batches=tuple(sorted({b for b, _ in CASES})))
    fast.warm_up()
    rows = []
    for batch, group in CASES:
        row = _case(model, fast, batch, group, args.rounds, args.passes)
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    out = {"probe": "pipelined", **environment(), "rounds": args.rounds, "passes_a_round": args.passes, "rows": rows}
    path = result_path(args.out, "pipelined.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("->", path)


if __name__ == "__main__":
    main()
