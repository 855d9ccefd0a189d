"""Whether attention from a table (``attention.attend_table``: every chunk's start, split rule and
KV addresses read on the device, one launch and one merge for a whole batch) gives each chunk the
bits of its own ``attend`` call, and what it costs against one call a chunk.

At the 0.8B's attention shape (512 rows, 8 query heads, 2 KV heads, head dim 256, bf16), B chunks
of B sessions at one depth group (0-2k mixed, 32k, 100k), each session's KV rows in its own
allocation: ``torch.equal`` between the table's output and the calls', each repeated, and the
device time of each form (CUDA events around 20 calls, median of 5; a graph of each form too,
since that is how the fast path runs it), with the K and V rows' write in both forms; and the table's
kernel with pointer loads instead of descriptors made on the device (``table_pointers_ms``).

    python -m benchmarks.probes.attention_table --out DIR     # DIR/attention_table.json; CUDA only
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from benchmarks.common import captured, device_ms_per_call, environment, result_path

ROWS, HEADS, KV, DIM = 512, 8, 2, 256
GROUPS = {"0-2k": [1024, 0, 2048, 512, 1536, 0, 1024, 2048], "32k": [32768], "100k": [100352]}


def _sessions(depths: list[int], gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for depth in depths:
        cap = -(-(depth + ROWS) // 8192) * 8192
        out.append(tuple(torch.randn(cap, KV, DIM, device="cuda", generator=gen).bfloat16() for _ in range(2)))
    return out  # type: ignore[return-value]


def _case(batch: int, depths: list[int], seed: int) -> dict[str, Any]:
    from shadow.backends.qwen35.attention import table as attention_table
    from shadow.backends.qwen35.attention import triton as attention

    triton_kernel = attention.TritonAttention()  # the Triton kernel's table and calls, with and without TMA

    gen = torch.Generator(device="cuda").manual_seed(seed)
    starts = [depths[b % len(depths)] for b in range(batch)]
    kv = _sessions(starts, gen)
    q = torch.randn(batch * ROWS, HEADS, DIM, device="cuda", generator=gen).bfloat16()
    k_new = torch.randn(batch * ROWS, KV, DIM, device="cuda", generator=gen).bfloat16()
    v_new = torch.randn(batch * ROWS, KV, DIM, device="cuda", generator=gen).bfloat16()
    table = torch.tensor([triton_kernel.table_row(s, ROWS, HEADS, k, v)
                          for s, (k, v) in zip(starts, kv, strict=True)], device="cuda")
    like = kv[0][0][:1]
    out_table, out_calls = torch.empty_like(q), torch.empty_like(q)

    def by_table() -> None:
        attention_table.write_rows(k_new, v_new, table)
        attention.attend_table(q, table, like, out_table)

    def by_calls() -> None:
        torch._foreach_copy_([t for s, (k, v) in zip(starts, kv, strict=True) for t in (k[s:s + ROWS], v[s:s + ROWS])],
                             [t for b in range(batch) for t in (k_new[b * ROWS:(b + 1) * ROWS],
                                                                  v_new[b * ROWS:(b + 1) * ROWS])])
        for b, (s, (k, v)) in enumerate(zip(starts, kv, strict=True)):
            attention.attend(q[b * ROWS:(b + 1) * ROWS], k, v, s, out_calls[b * ROWS:(b + 1) * ROWS])

    by_calls()
    first = out_calls.clone()
    by_table()
    equal = torch.equal(out_table, first)
    by_table()
    repeat_equal = torch.equal(out_table, first)
    row: dict[str, Any] = {"batch": batch, "starts": starts, "equal_to_calls": equal,
                           "table_repeat_equal": repeat_equal, "splits": [int(x) for x in table[:, 2].tolist()],
                           "table_ms": device_ms_per_call(by_table), "calls_ms": device_ms_per_call(by_calls)}
    graphs = {}
    for name, fn in (("table", by_table), ("calls", by_calls)):
        graphs[name] = captured(fn)
    out_pointers = torch.empty_like(q)
    attention.attend_table(q, table, like, out_pointers, tma=False)
    row["table_pointers_equal"] = torch.equal(out_pointers, first)
    row["table_pointers_ms"] = device_ms_per_call(lambda: attention.attend_table(q, table, like, out_pointers,
                                                                                 tma=False))
    row["table_graph_ms"] = device_ms_per_call(graphs["table"].replay)
    row["calls_graph_ms"] = device_ms_per_call(graphs["calls"].replay)  # one session's KV at fixed depths only
    graphs["table"].replay()
    torch.cuda.synchronize()
    row["table_graph_equal"] = torch.equal(out_table, first)
    flops = sum(4 * ROWS * HEADS * DIM * (s + (ROWS + 1) / 2) for s in starts)
    row["table_tflops"] = flops / row["table_ms"] / 1e9
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rows = []
    for group, depths in GROUPS.items():
        for batch in (1, 8, 16):
            row = _case(batch, depths, seed=batch)
            row["group"] = group
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "starts"}), flush=True)
    out = {"probe": "attention_table", **environment(), "rows": rows,
           "all_equal": all(r["equal_to_calls"] and r["table_repeat_equal"] and r["table_graph_equal"] for r in rows)}
    path = result_path(args.out, "attention_table.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("all equal:", out["all_equal"], "->", path)


if __name__ == "__main__":
    main()
