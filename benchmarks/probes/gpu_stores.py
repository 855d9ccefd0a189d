"""Park and restore of 0.8B sessions on the GPU machine's disk: seconds, GB/s each way, bit-equality.

    python -m benchmarks.probes.gpu_stores --out results.json [--disk DIR]

Sessions of 32k and 100k random ids are read on the 512 grid (bf16, fla), parked through the
disk store (safetensors, fsync, rename) and restored to the GPU. Restore is timed twice: from the
page cache right after parking, and after asking the kernel to drop its caches (when allowed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import environment
from shadow import ShadowSettings, build_shadow
from shadow.adapters.replay import compare
from shadow.backends.qwen35.checkpoint import write_checkpoint
from shadow.backends.qwen35.config import reference_shape
from shadow.core.plan import ReadPlan


def _drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_stores.json")
    ap.add_argument("--disk", default="")
    args = ap.parse_args()
    result: dict = {"benchmark": "gpu_stores", **environment(), "sessions": []}
    with tempfile.TemporaryDirectory() as tmp:
        disk = Path(args.disk or tmp) / "parked"
        ckpt = write_checkpoint(Path(tmp) / "qwen35-0.8b-random", reference_shape("0.8B"), seed=0)
        sh = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device="cuda", dtype="bfloat16",
                                         gb=64, disk=str(disk), disk_gb=64))
        result["disk_folder_fs"] = subprocess.run(["df", "-h", str(disk.parent)], capture_output=True,
                                                  text=True).stdout.splitlines()[-1]
        rng = random.Random(0)
        for n in (32_768, 100_000):
            name = f"s{n}"
            sh.feed_prompt(name, [rng.randrange(248000) for _ in range(n)])
            t0 = time.perf_counter()
            sh.read(ReadPlan(name))
            read_s = time.perf_counter() - t0
            before = sh.export_state(name)
            book = sh.position(name)
            resident = sh.resident_bytes()
            row: dict = {"ids": n, "committed": book.committed, "read_s": read_s, "resident_bytes": resident}
            for attempt in ("page_cache", "cold"):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                sh.park(name)
                park_s = time.perf_counter() - t0
                size = sh.disk.info(name).bytes
                dropped = _drop_caches() if attempt == "cold" else False
                t0 = time.perf_counter()
                sh.restore(name)
                torch.cuda.synchronize()
                restore_s = time.perf_counter() - t0
                assert sh.status().sessions[name].where == "resident" and not sh.disk.refused
                equal, worst, _ = compare(sh.export_state(name), before)
                row[attempt] = {"file_bytes": size, "park_s": park_s, "park_GBps": size / park_s / 1e9,
                                "restore_s": restore_s, "restore_GBps": size / restore_s / 1e9,
                                "caches_dropped": dropped, "bit_equal": equal, "largest_difference": worst}
            result["sessions"].append(row)
            print(json.dumps(row, indent=1), flush=True)
            sh.close()
            for f in disk.rglob("*.safetensors"):
                os.unlink(f)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
