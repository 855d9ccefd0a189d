"""A read's states into the static slots and back by one launch a kind (``slots.move``, shipped)
against a strided ``copy_`` a session each way (``slots.copy``, the form before), alternating in one
process on one ``FastForward`` (the captured graphs do not hold the copies, so both forms replay
the same ones).

0.8B shape, random weights, bf16; B sessions placed at 0-2k (random KV rows below), each form
reading its own copies of them, ``passes`` chunks a round, rounds alternating. Per pass the wall time
(device synchronised before and after) and the host's time to return from ``read_chunks``. At the
end each form's sessions equal the other's (``torch.equal``).

    python -m benchmarks.probes.slots_ab --out DIR     # DIR/slots_ab.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment
from benchmarks.probes.read_pass_ab import GRID, SPREAD, _placed
from benchmarks.read_rate import MODELS, _write_model
from shadow.backends.qwen35 import Qwen35, slots
from shadow.backends.qwen35.fast import FastForward
from shadow.backends.qwen35.graphs import clone_state, same_state

FORMS = ("one_launch", "copy_a_session")


def _case(model: Qwen35, fast: FastForward, batch: int, rounds: int, passes: int,
          use: dict[str, str]) -> dict[str, Any]:
    depths = [SPREAD[b % len(SPREAD)] for b in range(batch)]
    room = (rounds * passes + 1) * GRID
    base = [_placed(model, d, room, seed=b) for b, d in enumerate(depths)]
    states = {name: [clone_state(s) for s in base] for name in FORMS}
    gen = torch.Generator().manual_seed(batch)
    chunks = [torch.randint(0, 248000, (GRID,), generator=gen) for _ in range(rounds * passes + 1)]
    wall: dict[str, list[float]] = {name: [] for name in FORMS}
    host: dict[str, list[float]] = {name: [] for name in FORMS}
    for name in FORMS:
        use["form"] = name
        fast.read_chunks([(chunks[0], s) for s in states[name]])
    at = 1
    for _ in range(rounds):
        for name in FORMS:
            use["form"] = name
            for p in range(passes):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fast.read_chunks([(chunks[at + p], s) for s in states[name]])
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                host[name].append((t1 - t0) * 1e3)
                wall[name].append((t2 - t0) * 1e3)
        at += passes
    equal = all(same_state(a, b) for a, b in zip(*(states[n] for n in FORMS), strict=True))
    return {"batch": batch, "depths": depths, "equal": equal,
            **{f"{name}_wall_ms": statistics.median(wall[name]) for name in FORMS},
            **{f"{name}_host_ms": statistics.median(host[name]) for name in FORMS}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="slots_ab-") as tmp:
        _write_model(Path(tmp), MODELS["0.8b"](), torch.device("cuda"), torch.bfloat16)
        model = Qwen35.from_pretrained(Path(tmp), device="cuda", dtype="bfloat16")
    fast = FastForward(model, GRID, batches=(1, 8))
    fast.warm_up()
    use = {"form": FORMS[0]}
    shipped = slots.sources

    def sources(f: FastForward, states: Any) -> list[int]:
        return shipped(f, states) if use["form"] == "one_launch" else []

    slots.sources = sources  # type: ignore[assignment]
    rows = []
    for batch in (1, 8):
        row = _case(model, fast, batch, args.rounds, args.passes, use)
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    out = {"probe": "slots_ab", **environment(), "rounds": args.rounds, "passes": args.passes, "rows": rows,
           "all_equal": all(r["equal"] for r in rows)}
    path = Path(args.out) / "slots_ab.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("all equal:", out["all_equal"], "->", path)


if __name__ == "__main__":
    main()
