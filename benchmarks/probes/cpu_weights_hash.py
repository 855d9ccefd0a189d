"""Seconds to hash and to load a 0.8B-shape checkpoint on this CPU (random weights, bf16).

    python -m benchmarks.probes.cpu_weights_hash --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import environment
from shadow.backends.qwen35 import Qwen35, Qwen35Config
from shadow.backends.qwen35.checkpoint import write_checkpoint
from shadow.backends.qwen35.config import reference_shape
from shadow.backends.qwen35.weights import weights_hash


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="cpu_weights_hash.json")
    args = ap.parse_args()
    out: dict = {"benchmark": "cpu_weights_hash", **environment(), "device": "cpu", "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_checkpoint(Path(tmp) / "0.8b", reference_shape("0.8B"), seed=0, shards=2)
        out["bytes"] = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        cfg = Qwen35Config.from_folder(folder)
        for run in ("first", "second"):
            t0 = time.perf_counter()
            digest = weights_hash(folder, cfg)
            out[f"hash_s_{run}"] = time.perf_counter() - t0
        out["hash"] = digest
        t0 = time.perf_counter()
        Qwen35.from_pretrained(folder, device="cpu", dtype="bfloat16")
        out["load_bf16_mapped_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
