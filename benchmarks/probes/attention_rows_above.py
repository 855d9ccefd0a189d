"""Whether a chunk's attention depends on what a session's rows above the chunk hold, for each kernel
(each attention backend, the ``ATTENTION`` setting's values): the question the Gluon lead's GPU-test
failure at c974d7e left open.

Those failures (a real session re-read after a rollback against its fresh prefill; spans of 8 and
16 chunks against their chunks read one pass each) both read a chunk while the session's rows above
it held data (rows left by the rollback, or the span's later chunks), where the batches that passed
had none. For one session's K and V buffers (the 0.8B's attention shape, bf16) and chunks of 512
rows at several starts, each kernel is asked the same chunk four ways, and every pair compared with
``torch.equal`` (and its largest difference):

- ``attend`` (one call), the rows above the chunk zero, then random, then NaN;
- ``attend_table`` with that chunk as its one entry, the rows above random;
- ``attend_table`` with 8 consecutive chunks of the session as its entries (a span), all their rows
  written, each entry against its own one-entry table.

    python -m benchmarks.probes.attention_rows_above --out DIR   # DIR/attention_rows_above.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment
from shadow.backends.qwen35.attention import choose
from shadow.backends.qwen35.attention.backend import AttentionBackend

ROWS, HEADS, KV, DIM = 512, 8, 2, 256
STARTS = [0, 1024, 8192, 32768]
SPAN = 8
DEVICE = "cuda"  # the CPU smoke test (Triton's interpreter) sets "cpu" and small shapes


def _compare(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    return {"equal": torch.equal(a, b), "max_diff": (a.float() - b.float()).abs().nan_to_num(float("inf")).max().item()}


def _chunk(attention: AttentionBackend, start: int, gen: torch.Generator) -> dict[str, Any]:
    cap = -(-(start + SPAN * ROWS) // 8192) * 8192 + 8192
    k = torch.randn(cap, KV, DIM, device=DEVICE, generator=gen).bfloat16()
    v = torch.randn(cap, KV, DIM, device=DEVICE, generator=gen).bfloat16()
    q = torch.randn(SPAN * ROWS, HEADS, DIM, device=DEVICE, generator=gen).bfloat16()
    end = start + ROWS
    above_k, above_v = k[end:].clone(), v[end:].clone()
    outs: dict[str, torch.Tensor] = {}
    for fill in ("zero", "random", "nan"):
        if fill == "random":
            k[end:], v[end:] = above_k, above_v
        else:
            k[end:] = 0.0 if fill == "zero" else float("nan")
            v[end:] = 0.0 if fill == "zero" else float("nan")
        out = torch.empty(ROWS, HEADS, DIM, device=DEVICE, dtype=q.dtype)
        attention.attend(q[:ROWS], k, v, start, out)
        outs[f"call_{fill}"] = out
    k[end:], v[end:] = above_k, above_v
    like = k[:1]

    def table_of(starts: list[int]) -> torch.Tensor:
        return torch.tensor([attention.table_row(s, ROWS, HEADS, k, v) for s in starts], device=DEVICE)

    one = torch.empty(ROWS, HEADS, DIM, device=DEVICE, dtype=q.dtype)
    attention.attend_table(q[:ROWS], table_of([start]), like, one)
    outs["table_one"] = one
    span_starts = [start + i * ROWS for i in range(SPAN)]
    span = torch.empty_like(q)
    attention.attend_table(q, table_of(span_starts), like, span)
    entries = []
    for i, s in enumerate(span_starts):
        alone = torch.empty(ROWS, HEADS, DIM, device=DEVICE, dtype=q.dtype)
        attention.attend_table(q[i * ROWS:(i + 1) * ROWS], table_of([s]), like, alone)
        entries.append({"start": s, **_compare(span[i * ROWS:(i + 1) * ROWS], alone)})
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return {"kernel": attention.name, "start": start, "splits": int(table_of([start])[0, 2]),
            "call_zero_vs_random": _compare(outs["call_zero"], outs["call_random"]),
            "call_zero_vs_nan": _compare(outs["call_zero"], outs["call_nan"]),
            "table_one_vs_call": _compare(outs["table_one"], outs["call_random"]),
            "span_entries_vs_alone": entries}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kernels", nargs="+", default=["triton", "gluon-wg"],
                        choices=["triton", "gluon-wg", "gluon-ws"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for kernel in args.kernels:
        for start in STARTS:
            gen = torch.Generator(device=DEVICE).manual_seed(start + 1)
            try:  # the split rule follows the backend (``block_rows``)
                row = _chunk(choose(kernel, torch.device(DEVICE)), start, gen)
            except Exception as err:  # a kernel that fails to compile or run is reported, not fatal
                row = {"kernel": kernel, "start": start, "error": f"{type(err).__name__}: {err}"[:400]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            doc = {"probe": "attention_rows_above", **environment(), "rows": rows}
            (args.out / "attention_rows_above.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
