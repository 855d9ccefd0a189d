"""A read's states into the static slots and back by one launch a kind (``StateSlots.move``, shipped)
against a strided ``copy_`` a session each way (``StateSlots.copy``, the form before), alternating in one
process on one ``FastForward``, so both forms replay the same graphs. At bb80fda (the result kept)
the one-launch copies were launches of the host's; since 87a827c they sit inside the read's graph,
and the other form stages no addresses, so the graph's copies leave its slots alone.

0.8B shape, random weights, bf16; B sessions placed at 0-2k (random KV rows below), each form
reading its own copies of them, ``passes`` chunks a round, rounds alternating. Per pass the wall time
(device synchronised before and after) and the host's time to return from ``read_chunks``. At the
end each form's sessions equal the other's (``torch.equal``).

    python -m benchmarks.probes.slots_ab --out DIR     # DIR/slots_ab.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from benchmarks.common import environment, result_path
from benchmarks.probes.read_pass_ab import GRID, _case, random_08b
from shadow.backends.qwen35.fast.forward import FastForward
from shadow.backends.qwen35.fast.slots import StateSlots

FORMS = ("one_launch", "copy_a_session")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    model = random_08b()
    fast = FastForward(model, GRID, batches=(1, 8))
    fast.warm_up()
    use = {"form": FORMS[0]}
    shipped = StateSlots.sources

    def sources(self: StateSlots, states: Any) -> list[int]:
        return shipped(self, states) if use["form"] == "one_launch" else []

    StateSlots.sources = sources  # type: ignore[method-assign]
    rows = []
    for batch in (1, 8):
        row = _case(model, dict.fromkeys(FORMS, fast), batch, "0-2k", args.rounds, args.passes,
                    switch=lambda name: use.update(form=name))
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    out = {"probe": "slots_ab", **environment(), "rounds": args.rounds, "passes": args.passes, "rows": rows,
           "all_equal": all(r["equal"] for r in rows)}
    path = result_path(args.out, "slots_ab.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("all equal:", out["all_equal"], "->", path)


if __name__ == "__main__":
    main()
