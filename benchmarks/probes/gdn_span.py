"""Whether several consecutive chunks of one session can go through fla's GDN kernels in one call
and give the bits of one call per chunk (a lead for issue 18: a session whose turn brought 2k ids
could then read them in one pass, not four).

One call over ``chunks`` x 512 rows from a state, against ``chunks`` calls of 512 rows with the
state carried between them (``gdn_fla.chunk_rule_in_place``, the fast path's call, pinned configs),
at the 0.8B's heads: ``torch.equal`` on every output row and on the final state, and the time of
each form (device events around 20 calls, median of 5). Also the same rows as ``chunks`` separate
sessions on fla's batch axis, the form a batch of sessions takes today, for the time.

    python -m benchmarks.probes.gdn_span --out DIR     # DIR/gdn_span.json; CUDA and fla-core only
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import device_ms_per_call, environment

HEADS, DIM, GRID, BT = 16, 128, 512, 64


def _inputs(rows: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def unit(*shape: int) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.randn(*shape, device="cuda", generator=gen), dim=-1).bfloat16()

    gate = -torch.rand(rows // BT, BT, HEADS, device="cuda", generator=gen) * 0.5
    return {"q": unit(rows, HEADS, DIM), "k": unit(rows, HEADS, DIM),
            "v": torch.randn(rows, HEADS, DIM, device="cuda", generator=gen).bfloat16(),
            # the gate summed within 64-row chunks, log2 units, as kernels.gates(chunk_sums=True) gives it
            "g": (gate.cumsum(1) / math.log(2)).reshape(rows, HEADS).contiguous(),
            "beta": torch.rand(rows, HEADS, device="cuda", generator=gen).bfloat16(),
            "state": torch.randn(HEADS, DIM, DIM, device="cuda", generator=gen) * 0.1}


def _work(rows: int) -> torch.Tensor:
    return torch.zeros(1, rows, HEADS, BT, device="cuda", dtype=torch.bfloat16)  # as the fast path makes it


def _one_call(x: dict[str, torch.Tensor], work: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from shadow.backends.qwen35 import gdn_fla

    state = x["state"].clone()
    o = gdn_fla.chunk_rule_in_place(x["q"], x["k"], x["v"], x["g"], x["beta"], state, work)
    return o, state


def _per_chunk(x: dict[str, torch.Tensor], work: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from shadow.backends.qwen35 import gdn_fla

    state = x["state"].clone()
    outs = []
    for at in range(0, x["q"].shape[0], GRID):
        part = slice(at, at + GRID)
        outs.append(gdn_fla.chunk_rule_in_place(x["q"][part], x["k"][part], x["v"][part], x["g"][part],
                                                x["beta"][part], state, work).clone())
    return torch.cat(outs), state


def _as_sessions(x: dict[str, torch.Tensor], work: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    from shadow.backends.qwen35 import gdn_fla

    return gdn_fla.chunk_rule_in_place(x["q"], x["k"], x["v"], x["g"], x["beta"], states, work)


def measure(chunks: int, seed: int) -> dict[str, Any]:
    rows = chunks * GRID
    x = _inputs(rows, seed)
    whole, small = _work(rows), _work(GRID)
    o1, s1 = _one_call(x, whole)
    o2, s2 = _per_chunk(x, small)
    states = x["state"][None].repeat(chunks, 1, 1, 1)
    return {"chunks": chunks, "rows": rows, "seed": seed,
            "equal_output": torch.equal(o1, o2), "equal_state": torch.equal(s1, s2),
            "rows_differing": int((o1 != o2).any(-1).any(-1).sum()),
            "one_call_ms": device_ms_per_call(lambda: _one_call(x, whole)),
            "per_chunk_ms": device_ms_per_call(lambda: _per_chunk(x, small)),
            "as_sessions_ms": device_ms_per_call(lambda: _as_sessions(x, whole, states))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from shadow.backends.qwen35 import gdn_fla

    if not gdn_fla.available():
        raise SystemExit("gdn_span needs CUDA and fla-core")
    rows = [measure(c, seed) for c in (2, 4, 8, 16) for seed in (0, 1)]
    result = {**environment(), "benchmark": "gdn_span", "heads": HEADS, "dim": DIM, "grid": GRID, "rows": rows,
              "equal": all(r["equal_output"] and r["equal_state"] for r in rows)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gdn_span.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
