"""Where a small pass's time goes: the passes of 1 to 6 sessions that hold most of the 64-agent
replay's device time (``results/concurrency-h100.json``, ``cost_by_pass_pct``), at 0-2k and 32k.

0.8B shape, random weights, bf16, the reader's fast path (``TorchReader``, as ``read_rate``). Per
(B, depth): the pass's wall (median of ``--repeats`` passes, the reader's own timing), then one pass
under torch's profiler: the kernels' summed time, their count, the GPU timeline's span from the
first kernel's start to the last one's end, the gaps inside that span (no kernel running), and the
kernel time by kind (cuBLAS GEMMs, fla's GDN kernels, the fused GDN state kernel, attention and its
merge, row-wise kernels, the slots' copies). The wall less the span is the host's part before the
graph's first kernel and after its last (with the profiler's own cost in it).

    python -m benchmarks.probes.pass_busy --out DIR     # DIR/pass_busy.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment
from benchmarks.read_rate.batch import _group, _placed
from benchmarks.read_rate.run import MODELS, _write_model
from shadow.backends.qwen35 import Qwen35
from shadow.backends.reader import TorchReader

KINDS = (  # first match wins
    ("gemm", ("nvjet", "gemm", "cutlass", "sm90_xmma")),
    ("gdn_state", ("_state_out_kernel",)),
    ("fla", ("chunk_", "recompute_w_u", "kkt", "solve")),
    ("attention", ("_attn", "_merge")),
    ("copies", ("_copy_slots", "copy", "Memcpy", "memcpy")),
    ("row_wise", ("_rms_norm", "_silu_mul", "_conv_silu", "_gates", "_gated_norm", "_qk_norm_rope", "_gate_kernel")),
)


def _kind(name: str) -> str:
    return next((k for k, keys in KINDS if any(s in name for s in keys)), "other")


def _profiled(reader: TorchReader, sessions: list[Any]) -> dict[str, Any]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = reader.read_chunks(sessions)
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start)
    by_kind: dict[str, float] = {}
    busy, gaps, reach = 0.0, 0.0, kernels[0][0]
    for start, end, name in kernels:
        by_kind[_kind(name)] = by_kind.get(_kind(name), 0.0) + (end - start) / 1000
        if start > reach:
            gaps += start - reach
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    span = (reach - kernels[0][0]) / 1000
    return {"profiled_wall_ms": wall * 1000, "kernel_ms": sum(by_kind.values()), "kernels": len(kernels),
            "span_ms": span, "gaps_ms": gaps / 1000, "busy_ms": busy / 1000,
            "by_kind_ms": {k: round(v, 4) for k, v in sorted(by_kind.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for pass_busy.json")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 32768], help="0: the 0-2k group")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("pass_busy: needs CUDA")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pass_busy-") as tmp:
        folder = Path(tmp) / "0.8b"
        _write_model(folder, MODELS["0.8b"](), torch.device("cuda"), torch.bfloat16)
        reader = TorchReader(Qwen35.from_pretrained(folder, device="cuda", dtype="bfloat16"), 512, fast=True)
        warm_s = reader.warm_up()
        rng = random.Random(3)
        for depth in args.depths:
            for b in args.sizes:
                sessions = [_placed(reader, d, args.repeats + 2, rng) for d in _group(depth, b)]
                walls = [reader.read_chunks(sessions) * 1000 for _ in range(args.repeats + 1)][1:]
                row = {"batch": b, "depth": depth or 1024, "depths": _group(depth, b),
                       "wall_ms": statistics.median(walls), "walls_ms": walls, **_profiled(reader, sessions)}
                row["ms_per_512"] = row["wall_ms"] / b
                rows.append(row)
                print(f"B={b} depth={depth or '0-2k'}: wall {row['wall_ms']:.2f} ms, kernels {row['kernel_ms']:.2f} "
                      f"({row['kernels']}), span {row['span_ms']:.2f}, gaps {row['gaps_ms']:.2f}, "
                      f"{row['by_kind_ms']}", flush=True)
                del sessions
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"probe": "pass_busy", **environment(), "warm_up_s": warm_s, "rows": rows}
    (out / "pass_busy.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out / 'pass_busy.json'}")


if __name__ == "__main__":
    main()
