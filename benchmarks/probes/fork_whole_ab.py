"""A fork's pass captured whole (attention from a one-entry table inside the graph, the logits a
second graph) against the piecewise pass (eager attention between captured pieces), in one process
on the same model, alternating.

Two ``FastForward`` instances over one 0.8B-shape checkpoint of random weights (bf16), one with
``fork_tables`` off. At each depth a session placed there (random KV rows below it) is asked, in
each form in turn: a 300-id question (a pass of 320 rows: the wall time from ``fork`` to its
logits, device synchronised), and a decode from an 8-id prompt, ``n1`` and ``n2`` tokens, whose
medians' difference gives the ms a token (``read_rate``'s rule). Checked in the same run: the
question's logits and scratch K rows of the two forms ``torch.equal`` (from 16 rows both run our
kernel); a decode step's row, which the piecewise form gives torch's flash kernel, is compared by
its first logits (relative error) and the greedy tokens; each form's decode repeats its own tokens
and logits bit for bit.

    python -m benchmarks.probes.fork_whole_ab --out DIR     # DIR/fork_whole_ab.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from benchmarks.common import environment, result_path
from benchmarks.probes.read_pass_ab import GRID, _placed, random_08b
from shadow.backends.qwen35.fast.forward import FastForward
from shadow.backends.qwen35.state import ModelState

DEPTHS = (1024, 32768, 100352)
QUESTION = 300


def _question(fast: FastForward, state: ModelState, ids: list[int]) -> tuple[float, torch.Tensor, torch.Tensor]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fork = fast.fork(ids, state)
    assert fork.logits is not None
    logits = fork.logits.clone()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    at = fork.committed
    rows = state.k[-1][at:at + len(ids)].clone()
    fork.close()
    return ms, logits, rows


def _decode(fast: FastForward, state: ModelState, prompt: list[int], n: int) -> tuple[float, list[int], torch.Tensor]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fork = fast.fork(prompt, state)
    assert fork.logits is not None
    first = fork.logits.clone()
    tokens = fork.decode(n, stop=set())
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    fork.close()
    return ms, tokens, first


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _depth(forms: dict[str, FastForward], state: ModelState, depth: int, repeats: int,
           n1: int, n2: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(depth)
    question = torch.randint(0, 248000, (QUESTION,), generator=gen).tolist()
    prompt = question[:8]
    q_ms: dict[str, list[float]] = {name: [] for name in forms}
    d_ms: dict[str, dict[int, list[float]]] = {name: {n1: [], n2: []} for name in forms}
    seen: dict[str, Any] = {}
    repeatable = {name: True for name in forms}
    for fast in forms.values():  # a warm call of each kind
        _question(fast, state, question)
        _decode(fast, state, prompt, n1)
    for _ in range(repeats):
        for name, fast in forms.items():
            ms, logits, rows = _question(fast, state, question)
            q_ms[name].append(ms)
            for n in (n1, n2):
                dms, tokens, first = _decode(fast, state, prompt, n)
                d_ms[name][n].append(dms)
                if n == n2:
                    if name in seen:
                        was = seen[name]
                        repeatable[name] &= bool(torch.equal(was[0], logits) and torch.equal(was[1], rows)
                                                 and was[2] == tokens and torch.equal(was[3], first))
                    else:
                        seen[name] = (logits, rows, tokens, first)
    (wq, wr, wt, wf), (pq, pr, pt, pf) = seen["whole"], seen["piecewise"]
    agree = next((i for i, (a, b) in enumerate(zip(wt, pt, strict=True)) if a != b), len(wt))
    out: dict[str, Any] = {
        "depth": depth, "question_ids": QUESTION,
        "question_equal": bool(torch.equal(wq, pq) and torch.equal(wr, pr)),
        "decode_first_logits_rel_err": _rel(wf, pf),
        "decode_first_argmax_same": int(wf.argmax()) == int(pf.argmax()),
        "decode_tokens_same_until": agree, "decode_tokens": n2,
        "repeatable": repeatable,
    }
    for name in forms:
        out[f"{name}_question_ms"] = statistics.median(q_ms[name])
        m1, m2 = statistics.median(d_ms[name][n1]), statistics.median(d_ms[name][n2])
        out[f"{name}_decode_ms_per_token"] = (m2 - m1) / (n2 - n1)
    out["question_speedup"] = out["piecewise_question_ms"] / out["whole_question_ms"]
    out["decode_speedup"] = out["piecewise_decode_ms_per_token"] / out["whole_decode_ms_per_token"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode", type=int, nargs=2, default=(8, 40), metavar=("N1", "N2"))
    ap.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    args = ap.parse_args()
    model = random_08b()
    # forks only: one batch size is enough, and keeps the warm-up short
    forms = {"whole": FastForward(model, GRID, batches=(1,)), "piecewise": FastForward(model, GRID, batches=(1,))}
    forms["piecewise"].fork_tables = False
    warm = {name: fast.warm_up() for name, fast in forms.items()}
    rows = []
    n1, n2 = args.decode
    for depth in args.depths:
        state = _placed(model, depth, GRID, seed=depth)  # forks write scratch rows only: one state serves both
        row = _depth(forms, state, depth, args.repeats, n1, n2)
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        del state
        torch.cuda.empty_cache()
    out = {"probe": "fork_whole_ab", **environment(), "warm_up_s": warm, "repeats": args.repeats,
           "decode_tokens": [n1, n2], "rows": rows,
           "questions_equal": all(r["question_equal"] for r in rows),
           "repeatable": all(all(r["repeatable"].values()) for r in rows),
           "graphs": {name: fast.report()["capture_reserved_bytes"] for name, fast in forms.items()}}
    path = result_path(args.out, "fork_whole_ab.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("questions equal:", out["questions_equal"], "repeatable:", out["repeatable"], "->", path)


if __name__ == "__main__":
    main()
