"""The warm start (issue 20): in a new process, ``warm_up``, then the first session read chunk by
chunk, with a question of every captured size, a question as text and a fork decode on the way;
each one's first time against its steady median (the same call repeated at the end).

    TRITON_CACHE_DIR=<empty or warm folder> python -m benchmarks.warm_start --model CKPT --out FILE.json

The GPU test (tests/backends/test_warm_start.py) runs it twice in new processes on one Triton cache,
empty then warm, and keeps both figures. ``--device cpu`` runs every step on a tiny model under
Triton's interpreter (tests/benchmarks/test_warm_start.py), timings meaningless there.

Figures: ``warm_up_s`` (the facade's ``warm_up``: graphs captured, the eager kernels launched, a
fresh chunk, the question's template), and per kind (``chunk``; ``question_<rows>`` for each
captured row count, the question given as that many ids at a grid line; ``question_text``;
``fork_decode``, 8 tokens): ``first_ms``, ``median_ms`` (of ``--repeat`` runs at the session's end,
for chunks all of them) and ``ratio``; ``worst`` names the largest ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from shadow.core.plan import ReadPlan

QUESTION = "Did the agent finish its task? A: yes, B: no. Answer with the letter."
CHOICES = ["A", "B"]


def _ms(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()  # every call here ends on the host (a softmax read back, tokens listed): the device is done
    return (time.perf_counter() - t0) * 1e3


def measure(model: str, device: str, dtype: str, grid: int, home: str, max_chunks: int, repeat: int,
            only: list[int] | None = None) -> dict[str, Any]:
    from shadow import ShadowSettings, build_shadow
    from shadow.adapters.transcripts import demo_transcript, render_turns

    sh = build_shadow(ShadowSettings(_env_file=None, model=model, device=device, dtype=dtype, grid=grid,
                                     disk="off", dir=home, fast="on"))
    t0 = time.perf_counter()
    sh.warm_up()
    warm_up_s = time.perf_counter() - t0
    fast = sh.reader.fast  # type: ignore[attr-defined]
    sizes: list[int] = [n for n in fast.sizes if only is None or n in only]

    last = render_turns(demo_transcript())[-1]  # the shipped real session, whole (6k ids)
    ids = (last.prompt_ids + last.output_ids)
    chunks = min(max_chunks, len(ids) // grid)
    sh.feed_prompt("s", ids[:chunks * grid])
    first: dict[str, float] = {}
    chunk_ms: list[float] = []
    pending = [f"question_{n}" for n in sizes] + ["question_text", "fork_decode"]

    def once(kind: str, at: int) -> float:
        if kind == "question_text":
            return _ms(lambda: sh.ask("s", QUESTION, CHOICES, at=at))
        if kind == "fork_decode":
            return _ms(lambda: sh.decode("s", ids[:16], max_new=8, at=at))
        n = int(kind.split("_")[1])
        return _ms(lambda: sh.ask("s", ids[at:at + n] if at + n <= len(ids) else ids[:n], CHOICES, at=at))

    for _ in range(chunks):  # the first session: each kind's first call comes at a later depth
        [c] = sh.read(ReadPlan("s", max_chunks=1))
        chunk_ms.append(c.cost_s * 1e3)
        if pending:
            kind = pending.pop(0)
            first[kind] = once(kind, c.first_row + c.rows)
    at = chunks * grid
    for kind in pending:  # a session too short to spread them: the rest at its end
        first[kind] = once(kind, at)
    figures: dict[str, dict[str, float]] = {
        "chunk": {"first_ms": chunk_ms[0], "median_ms": statistics.median(chunk_ms), "max_ms": max(chunk_ms),
                  "count": len(chunk_ms)}}
    for kind, ms in first.items():
        steady = [once(kind, at) for _ in range(repeat)]
        figures[kind] = {"first_ms": ms, "median_ms": statistics.median(steady)}
    figures["chunk"]["ratio"] = figures["chunk"]["max_ms"] / figures["chunk"]["median_ms"]
    for kind in first:
        figures[kind]["ratio"] = figures[kind]["first_ms"] / figures[kind]["median_ms"]
    worst = max(figures, key=lambda k: figures[k]["ratio"])
    return {"warm_up_s": warm_up_s, "grid": grid, "sizes": sizes, "chunks": chunks, "figures": figures,
            "worst": {"kind": worst, "ratio": figures[worst]["ratio"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint folder")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--home", default="", help="the service's DIR (default: a folder beside --out)")
    ap.add_argument("--max-chunks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default="", help="only these captured row counts' questions, comma-separated "
                                                "(the CPU test's; default: every one)")
    args = ap.parse_args(argv)
    from benchmarks.common import environment

    home = args.home or str(Path(args.out).with_suffix("").with_name(Path(args.out).stem + "-home"))
    result = {"environment": environment(), "model": args.model,
              **measure(args.model, args.device, args.dtype, args.grid, home, args.max_chunks, args.repeat,
                        [int(n) for n in args.sizes.split(",")] if args.sizes else None)}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    w = result["worst"]
    print(f"warm_up {result['warm_up_s']:.2f} s; worst first/median: {w['kind']} {w['ratio']:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
