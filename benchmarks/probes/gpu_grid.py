"""Real sessions followed turn by turn on the GPU at the 0.8B shape: bit-equality with a fresh
prefill on the same grid, and how far another grid (2,048 rows) lands.

    python -m benchmarks.probes.gpu_grid --turns .gpu/*.json --out results.json

``--turns`` are rendered sessions saved by ``shadow.adapters.transcripts.save_turns`` (the raw
transcripts do not travel to the GPU machine; the ids do). Random weights, bf16, fla kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import environment
from shadow import ShadowSettings, build_shadow
from shadow.adapters.replay import compare, replay
from shadow.adapters.transcripts import load_turns
from shadow.backends.qwen35.checkpoint import write_checkpoint
from shadow.backends.qwen35.config import reference_shape
from shadow.core.plan import ReadPlan

PROBES = [
    "Which kind of task is this session? A: debugging, B: new feature, C: refactor, D: docs, E: tests, "
    "F: chat, G: review, H: ops, I: other.",
    "Did the last tool call succeed? A: yes, B: no, C: no tool call.",
    "Is the agent done? A: yes, B: no.",
    "Which language is the project mostly in? A: Python, B: Rust, C: C, D: TypeScript, E: other.",
    "Has the user asked a new question since the last answer? A: yes, B: no.",
    "How long is this session so far? A: short, B: medium, C: long.",
    "Should a human look at this now? A: yes, B: no.",
    "Which file matters most right now? A: a test, B: source, C: config, D: docs.",
]
LETTERS = "ABCDEFGHI"


def _kind(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", nargs="+", required=True)
    ap.add_argument("--out", default="gpu_grid.json")
    args = ap.parse_args()
    result: dict = {"benchmark": "gpu_grid", **environment(), "sessions": []}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(Path(tmp) / "qwen35-0.8b-random", reference_shape("0.8B"), seed=0)

        def make(grid: int):
            return build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device="cuda",
                                               dtype="bfloat16", grid=grid))

        sh512, sh2048 = make(512), make(2048)
        for path in args.turns:
            name = Path(path).stem
            turns = load_turns(path)
            t0 = time.perf_counter()
            chunks = replay(sh512, name, turns)
            replay_s = time.perf_counter() - t0
            book = sh512.position(name)
            ids_held = list(sh512.session_ids(name))
            # The same ids read in one go, as a session's first long prompt is.
            sh512.feed_prompt(name + "/one-go", ids_held)
            t1 = time.perf_counter()
            reads = sh512.read(ReadPlan(name + "/one-go"))
            one_go_s = time.perf_counter() - t1
            costs = [r.cost_s * 1e3 for r in reads]
            t2 = time.perf_counter()
            fresh = sh512.fresh_state(ids_held)
            fresh_s = time.perf_counter() - t2
            equal, worst, where = compare(sh512.export_state(name), fresh)
            row = {
                "session": name, "tokens": book.length, "turns": len(turns), "rollbacks": book.rollbacks,
                "ids_reread": book.reread, "chunks_read_turn_by_turn": chunks, "replay_s": replay_s,
                "tensors_compared": len(fresh), "bit_equal": equal, "largest_difference": worst,
                "worst_tensor": where, "one_go_read_s": one_go_s, "fresh_prefill_s": fresh_s,
                "ms_per_chunk_median": statistics.median(costs),
                "one_go_ms_per_1k_tokens": 1e6 * one_go_s / book.length,
            }

            # Another grid: both states at the same committed length (a multiple of 2,048).
            ids = ids_held[: book.length // 2048 * 2048]
            a, b = sh512.fresh_state(ids), sh2048.fresh_state(ids)
            per_kind: dict[str, float] = {}
            for key in a:
                d = float((a[key].float() - b[key].float()).abs().max())
                per_kind[_kind(key)] = max(per_kind.get(_kind(key), 0.0), d)
            row["grid_2048_vs_512"] = {"tokens": len(ids), "largest_difference_by_kind": per_kind}
            sh512.feed_prompt(name + "/g512", ids)
            sh2048.feed_prompt(name + "/g2048", ids)
            sh512.read(ReadPlan(name + "/g512"))
            sh2048.read(ReadPlan(name + "/g2048"))
            probes = []
            for q in PROBES:
                n = q.count(": ")
                choices = list(LETTERS[:n])
                p = sh512.ask(name + "/g512", q, choices)
                r = sh2048.ask(name + "/g2048", q, choices)
                kl = sum(pv * math.log(pv / max(r.probs[c], 1e-30)) for c, pv in p.probs.items() if pv > 0)
                probes.append({"choices": n, "top_512": p.label, "top_2048": r.label, "kl": max(kl, 0.0),
                               "ask_ms": p.latency_ms})
            row["grid_2048_vs_512"]["probes"] = probes
            row["grid_2048_vs_512"]["same_top"] = sum(x["top_512"] == x["top_2048"] for x in probes)
            row["grid_2048_vs_512"]["max_kl"] = max(x["kl"] for x in probes)
            result["sessions"].append(row)
            print(json.dumps(row, indent=1), flush=True)
            for s in (sh512, sh2048):
                s.close()
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
