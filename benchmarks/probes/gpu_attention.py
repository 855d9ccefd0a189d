"""The attention variants on the GPU, each in a fresh process: first-session (cold) and second-
session (warm) read rate, bit-exact turn-by-turn replay, and agreement between variants.

    python -m benchmarks.probes.gpu_attention --out results.json

"mask": SDPA with an explicit boolean mask. "lower-right": SDPA with a bottom-right causal bias
(flash / memory-efficient kernels, no mask tensor). 0.8B shape, random weights, bf16, grid 512.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import environment
from shadow.core.plan import ReadPlan

TOKENS = 33_280  # 65 chunks


def child(ckpt: str, variant: str, out: str) -> None:
    from shadow import ShadowSettings, build_shadow
    from shadow.adapters.replay import compare

    sh = build_shadow(ShadowSettings(_env_file=None, model=ckpt, device="cuda", dtype="bfloat16", disk="off"))
    model = sh.reader.model  # type: ignore[attr-defined]
    model.attention = variant
    rng = random.Random(1)
    res: dict = {"variant": variant}
    for label in ("cold", "warm"):
        sh.feed_prompt(label, [rng.randrange(248000) for _ in range(TOKENS)])
        t0 = time.perf_counter()
        reads = sh.read(ReadPlan(label))
        total = time.perf_counter() - t0
        ms = [r.cost_s * 1e3 for r in reads]
        res[label] = {"total_s": total, "ms_per_chunk_median": statistics.median(ms), "ms_first_chunk": ms[0],
                      "ms_per_1k_tokens": total * 1e6 / TOKENS}
    # Turn by turn with a rollback, against a fresh prefill.
    ids = [rng.randrange(248000) for _ in range(6000)]
    sh.feed_prompt("t", ids[:2500])
    sh.read(ReadPlan("t"))
    sh.feed_output("t", ids[2500:3100])
    sh.read(ReadPlan("t"))
    sh.feed_prompt("t", ids[:2600] + ids[2800:6000])  # drops part of the answer: a rollback
    sh.read(ReadPlan("t"))
    equal, worst, _ = compare(sh.export_state("t"), sh.fresh_state(list(sh.session_ids("t"))))
    res["replay_bit_equal"], res["replay_largest_difference"] = equal, worst
    res["rollbacks"] = sh.position("t").rollbacks
    # Last-row logits of a 4k prompt, for comparing variants.
    logits = model.forward(torch.tensor(ids[:4096]), model.new_state(), logits_at=[-1])
    torch.save(logits.cpu(), out + ".logits.pt")
    t0 = time.perf_counter()
    answer = sh.ask("warm", [1, 2, 3, 4, 5] * 60, ["A", "B", "C"])
    res["ask_300_ids_on_33k_ms"] = (time.perf_counter() - t0) * 1e3
    res["ask_label"] = answer.label
    Path(out).write_text(json.dumps(res))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_attention.json")
    args = ap.parse_args()
    from shadow.backends.qwen35.checkpoint import write_checkpoint
    from shadow.backends.qwen35.config import reference_shape

    result: dict = {"benchmark": "gpu_attention", **environment(), "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = str(write_checkpoint(Path(tmp) / "m", reference_shape("0.8B"), seed=0))
        for variant in ("mask", "lower-right"):
            out = os.path.join(tmp, variant + ".json")
            subprocess.run([sys.executable, "-m", "benchmarks.probes.gpu_attention", "--child", ckpt, variant, out],
                           check=True)
            result["variants"][variant] = json.loads(Path(out).read_text())
            print(json.dumps(result["variants"][variant], indent=1), flush=True)
        a = torch.load(os.path.join(tmp, "mask.json.logits.pt"))
        b = torch.load(os.path.join(tmp, "lower-right.json.logits.pt"))
        result["last_row_logits_rel_err"] = ((a - b).norm() / a.norm()).item()
        result["last_row_logits_equal"] = bool(torch.equal(a, b))
    print(json.dumps({k: result[k] for k in ("last_row_logits_rel_err", "last_row_logits_equal")}))
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
