"""The MLP's gate/up GEMM with SiLU in one kernel (``gate_up.py``, chosen per row count at warm-up)
against cuBLAS's GEMM then ``silu_mul`` everywhere, in whole read passes, one process, alternating.

Two ``FastForward`` instances over one random 0.8B checkpoint (bf16), one with ``fused_mlp=False``;
``read_pass_ab._case`` places sessions at their depths and reads ``passes`` chunks a round in each
form, rounds alternating: wall a pass, ms per 512 ids, and whether the two forms' sessions end
equal (``torch.equal``: the fused form is taken only where it gives cuBLAS's bits). Also what
warm-up chose at each row count, and each instance's batch check.

    python -m benchmarks.probes.mlp_fused_ab --out DIR     # DIR/mlp_fused_ab.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from benchmarks.common import environment, result_path
from benchmarks.probes.read_pass_ab import GRID, _case, random_08b
from shadow.backends.qwen35.fast.forward import FastForward

CASES = ((1, "0-2k"), (2, "0-2k"), (3, "0-2k"), (4, "0-2k"), (6, "0-2k"), (8, "0-2k"), (16, "0-2k"),
         (8, "32k"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    model = random_08b()
    forms = {"fused": FastForward(model, GRID), "cublas": FastForward(model, GRID, fused_mlp=False)}
    warm = {name: fast.warm_up() for name, fast in forms.items()}
    out: dict[str, Any] = {"probe": "mlp_fused_ab", **environment(), "warm_up_s": warm,
                           "chosen": {str(n): why for n, why in forms["fused"].mlp_forms.items()},
                           "refused": {name: dict(fast.refused) for name, fast in forms.items()},
                           "rounds": args.rounds, "passes": args.passes, "rows": []}
    print(json.dumps(out["chosen"]), flush=True)
    path = result_path(args.out, "mlp_fused_ab.json")
    for batch, group in CASES:
        row = _case(model, forms, batch, group, args.rounds, args.passes)
        row["saved_ms_per_512"] = row["cublas_ms_per_512"] - row["fused_ms_per_512"]
        out["rows"].append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "depths"}),
              flush=True)
        out["all_equal"] = all(r["equal"] for r in out["rows"])
        path.write_text(json.dumps(out, indent=1) + "\n")
    print("all equal:", out["all_equal"], "->", path)


if __name__ == "__main__":
    main()
