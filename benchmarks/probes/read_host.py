"""The host's own work in a read's pass (``FastForward.read_chunks`` up to the graph's replay), on
this machine's CPU: the batch's checks, the states' slot addresses, the attention table, the
staging of the inputs. The device's part is left out: the read's graph is replaced by one that does
nothing, so what is timed is Python and torch's host calls (off CUDA the inputs are staged by
synchronous copies, not through pinned memory: the figure is the host code's, not the GPU host's).

0.8B shape (random weights, bf16, CPU, kernels under Triton's interpreter, never run here); B
sessions at 1k with stacked states; each pass's sessions put back to 1k after it, so no KV buffer
grows. Median of ``--passes`` passes per B.

    python -m benchmarks.probes.read_host --out DIR     # DIR/read_host.json; no GPU needed
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # the fast path off CUDA (its kernels are not run)

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import environment, result_path
from benchmarks.read_rate.run import MODELS, _write_model
from shadow.backends.qwen35 import Qwen35
from shadow.backends.qwen35.fast.forward import FastForward

GRID, DEPTH = 512, 1024


class _NoReplay:
    def replay(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--passes", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="read_host-") as tmp:
        _write_model(Path(tmp), MODELS["0.8b"](), torch.device("cpu"), torch.bfloat16)
        model = Qwen35.from_pretrained(Path(tmp), device="cpu", dtype="bfloat16")
    fast = FastForward(model, GRID, graphs=False, batches=(1, 8, 16))
    assert fast.table_reads
    rows = []
    for batch in (1, 8, 16):
        fast.rows_for(batch * GRID, GRID, read=True).whole = _NoReplay()
        states = [model.new_state() for _ in range(batch)]
        for s in states:
            s.reserve(DEPTH + GRID)
            s.length = DEPTH
        chunks = [(torch.randint(0, 248000, (GRID,)), s) for s in states]
        took = []
        for _ in range(args.passes + 10):
            t0 = time.perf_counter()
            fast.read_chunks(chunks)
            took.append((time.perf_counter() - t0) * 1e3)
            for s in states:
                s.length = DEPTH
        row = {"batch": batch, "host_ms": statistics.median(took[10:]), "min_ms": min(took[10:])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"probe": "read_host", **environment(), "device": "cpu (host code only)", "passes": args.passes,
           "rows": rows}
    path = result_path(args.out, "read_host.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("->", path)


if __name__ == "__main__":
    main()
