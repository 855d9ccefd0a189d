"""Whether the heap grows with the number of distinct shapes the model runs: ``ask`` on one thread,
each after the session's pending tail was cut to a new random length (0-499 ids past its 2,048 read
ones), so each question's forward has its own row count. glibc's bytes in use every 100 asks,
beside what Python's allocator holds (tracemalloc, started after the first ask). One run a
setting of ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` (oneDNN's cache of kernels built per shape; 1024
when unset), each in a fresh process, since oneDNN reads it once.

    python -m benchmarks.probes.shape_caches --out DIR     # DIR/shape_caches.json; Linux with glibc
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import environment

REPO = Path(__file__).resolve().parents[2]

ONE_RUN = """
import json, random, sys, tempfile, tracemalloc
import torch
from shadow import ShadowSettings, build_shadow
from shadow.adapters import allocator
from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from benchmarks.probes.server_memory import mallinfo
allocator.limit_arenas(); allocator.fix_mmap_threshold()
ckpt = write_checkpoint(tempfile.mkdtemp() + "/m", demo_text_config(), dtype=torch.float32, seed=0)
sh = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device="cpu", dtype="float32", grid=512,
                                 disk="off"))
rng = random.Random(0)
ids = [rng.randrange(1000) for _ in range(2048)]
sh.feed_prompt("s", ids)
sh.read()
sh.ask("s", "Is it done?", ["A", "B"])  # the tokenizer and the template load here
tracemalloc.start()
rows = []
for i in range(int(sys.argv[1]) + 1):
    if i % 100 == 0:
        rows.append({"asks": i, "heap_in_use": mallinfo()["uordblks"], "python": tracemalloc.get_traced_memory()[0]})
    sh.feed_prompt("s", ids + [rng.randrange(1000) for _ in range(rng.randrange(0, 500))])
    sh.ask("s", "Is it done?", ["A", "B"])
print(json.dumps(rows))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--asks", type=int, default=800)
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    for capacity in (None, "8"):
        env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
        if capacity is not None:
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = capacity
        out = subprocess.run([sys.executable, "-c", ONE_RUN, str(args.asks)], env=env, capture_output=True, text=True,
                             check=True, timeout=3600, cwd=REPO)
        rows = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append({"onednn_primitive_cache_capacity": capacity or "unset (1024)", "rows": rows,
                     "heap_grew_mib": (rows[-1]["heap_in_use"] - rows[0]["heap_in_use"]) / 2**20,
                     "python_grew_mib": (rows[-1]["python"] - rows[0]["python"]) / 2**20})
        print({k: v for k, v in runs[-1].items() if k != "rows"}, flush=True)
    result = {**environment(), "benchmark": "shape_caches", "asks": args.asks, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shape_caches.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
