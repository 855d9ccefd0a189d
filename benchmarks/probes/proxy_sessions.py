"""How long the proxy takes to find a request's session without a header: ``Sessions.find`` on the
CPU with 1,000 known sessions of 20k ids that share a 16k-id prefix (a system prompt and tools),
for a prompt that continues one of them and for a new conversation with the same prefix. The
prompt's hash chain is part of each call (what a request pays). The index is the proxy's own in
memory, or with ``--store redis://...`` a Redis's (``QWEN38_SHADOW_STORE``).

    python -m benchmarks.probes.proxy_sessions [--out DIR] [--store URL]   # with --out: DIR/proxy_sessions.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from benchmarks.common import environment
from shadow.adapters.tokens import IM_START
from shadow.proxy.index import LocalIndex, SessionIndex
from shadow.proxy.sessions import Sessions

GRID = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--shared", type=int, default=16 * 1024)
    parser.add_argument("--length", type=int, default=20 * 1024)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--store", default="", help="redis://host:port/db: the index in that Redis (flushed "
                                                    "of the proxy's keys first); empty: in memory")
    args = parser.parse_args()
    rng = random.Random(0)
    gen = [IM_START, 77, 78]
    shared = [rng.randrange(1000, 200_000) for _ in range(args.shared)]
    index: SessionIndex = LocalIndex(GRID, args.sessions)
    if args.store:
        from shadow.proxy.redis_index import RedisIndex

        index = RedisIndex.from_url(args.store, GRID, args.sessions)
        for key in index.r.scan_iter(match=index.p + "*"):
            index.r.delete(key)
    table = Sessions(GRID, index=index)
    known = []
    for _ in range(args.sessions):
        rest = [rng.randrange(1000, 200_000) for _ in range(args.length - args.shared - 400 - len(gen))]
        prompt = shared + rest + gen
        found = table.find(prompt, None)
        name = table.record(found.name or table.new_name(prompt), found, prompt)
        output = [rng.randrange(1000, 200_000) for _ in range(400)]
        table.extend(name, output)
        known.append((name, prompt + output))
    results = {}
    for case in ("continued", "new"):
        times = []
        for k in range(args.lookups):
            name, ids = known[rng.randrange(len(known))]
            tail = [IM_START, *[rng.randrange(1000, 200_000) for _ in range(50)], *gen]
            prompt = ids + tail if case == "continued" else shared + tail
            t0 = time.perf_counter()
            found = table.find(prompt, None)
            times.append((time.perf_counter() - t0) * 1e3)
            want = name if case == "continued" else None
            assert found.name == want and found.how == case, (k, found.how)
        times.sort()
        results[case] = {"median_ms": statistics.median(times), "p95_ms": times[int(0.95 * len(times))],
                         "max_ms": times[-1], "prompt_ids": len(prompt)}
        print(f"{case:10s} median {results[case]['median_ms']:.3f} ms  p95 {results[case]['p95_ms']:.3f} ms  "
              f"max {results[case]['max_ms']:.3f} ms  ({len(prompt)} ids)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        out = {**environment(), "index": index.status()["index"], "sessions": args.sessions, "shared": args.shared,
               "length": args.length, "grid": GRID, "results": results}
        (args.out / "proxy_sessions.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
