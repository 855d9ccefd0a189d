"""Programmatic dependent launch for the fast path's Triton kernels (``kernels.PDL``): off, wait only,
and wait then release the next launch, alternating in one process, one ``FastForward`` a mode
(each captured with its mode, so each replays its own graphs).

0.8B shape, random weights, bf16; B sessions placed at 0-2k (or 32k), each mode reading its own
copies of them. Per pass the wall time (device synchronised before and after) and the host's time
to return from ``read_chunks`` (``read_pass_ab._case``); then the read's graph replayed alone,
back to back, timed by events (the device's time a pass with no host in it). At the end each mode's
sessions equal the others' (``torch.equal``): the launch mode must not change a bit.

    python -m benchmarks.probes.pdl_ab --out DIR     # DIR/pdl_ab.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.common import environment
from benchmarks.probes.read_pass_ab import GRID, _case, random_08b
from shadow.backends.qwen35 import kernels
from shadow.backends.qwen35.fast import FastForward

MODES = {"off": 0, "wait": 1, "release": 2}
CASES = ((1, "0-2k"), (8, "0-2k"), (16, "0-2k"), (8, "32k"))


def replay_ms(fast: FastForward, batch: int, times: int = 20) -> float:
    """The read's graph for ``batch`` sessions replayed ``times`` times back to back: ms a replay."""
    r = fast._rows_for(batch * GRID, GRID, read=True)
    assert r.whole is not None
    r.whole.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(times):
        r.whole.replay()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    model = random_08b()
    forms: dict[str, FastForward] = {}
    for name, mode in MODES.items():
        kernels.PDL = mode
        forms[name] = FastForward(model, GRID, batches=(1, 8, 16))
        forms[name].warm_up()
        print(name, "refused:", dict(forms[name].refused), flush=True)
    rows = []
    for batch, group in CASES:
        row = _case(model, forms, batch, group, args.rounds, args.passes,
                    switch=lambda name: setattr(kernels, "PDL", MODES[name]))
        for name, fast in forms.items():  # after _case: the sessions' tensors were compared already
            kernels.PDL = MODES[name]
            row[f"{name}_replay_ms"] = min(replay_ms(fast, batch) for _ in range(3))
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "depths"}),
              flush=True)
    out = {"probe": "pdl_ab", **environment(), "modes": MODES, "rounds": args.rounds, "passes": args.passes,
           "rows": rows, "all_equal": all(r["equal"] for r in rows)}
    path = Path(args.out) / "pdl_ab.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("all equal:", out["all_equal"], "->", path)


if __name__ == "__main__":
    main()
