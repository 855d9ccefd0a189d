"""The batch part of ``read_rate``: ms per 512 ids when B sessions read their next chunk in one
``read_chunks`` pass (``figure: "batch_chunk"``), at B = 1 to 8, 10, 12, 14 and 16 (the reader
captures every size up to 16; a size it does not take is read as it plans it: ``passes``) and at
three depth groups:
0-2k (session b at 1024, 0, 2048, 512, 1536, ... ids: mixed depths in one batch), 32k and 100k;
the attention kernel's rate at 32k and 100k (512 rows): one ``attend`` call (``attention_layer``), and
the form a read's pass holds, a table on the device in a CUDA graph, for 1 and 8 sessions
(``attention_read``, each session's rows equal to its own call); and, on the same path in the same run, the
exactness of batched reads: 16 sessions at mixed depths read in one batch equal each session read
alone and a fresh prefill of its ids (``torch.equal`` on every tensor). Spans: one session reads
its next k = 2, 4, 8, 16 chunks in one pass (``figure: "span_chunk"``, ``read_span``) from depth 0
and 32k; the warm-up checks each span size against its chunks read one pass each (``fast_report``'s
``spans``).

Timing sessions are put at their depth without reading up to it: their KV rows below the depth are
random values (what attention reads costs the same whatever the values), their conv and recurrent
state zero. Each pass then reads real chunks of random ids above that depth. A size's figure is the
median of ``repeats`` passes after one warm pass, device synchronised (``read_chunks``' own cost),
divided by B. The reader's warm-up (captures, and the check of every batch size) comes first.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import captured, device_ms_per_call
from benchmarks.read_rate import floor as floor_mod
from shadow.backends.qwen35 import Qwen35
from shadow.backends.qwen35.attention import choose
from shadow.backends.qwen35.attention import triton as attention
from shadow.backends.qwen35.attention.backend import AttentionBackend
from shadow.backends.qwen35.fast.graphs import clone_state, same_state
from shadow.backends.reader import SessionTensors, TorchReader
from shadow.core.costs import pass_plan
from shadow.core.session import SessionBook

SPREAD = (1024, 0, 2048, 512, 1536)  # the 0-2k group: session b at SPREAD[b % 5]


@dataclass(frozen=True)
class BatchPlan:
    # ``concurrency.py`` prices the sizes between these between them. Every size to 8 is measured,
    # as a pass's cost is not a line in B: its GDN kernels took 1.23 ms at B = 4 and 2.28 at 6 on an
    # H100 (``results/pass_busy-h100.json``), about 0.16 a session from 2 to 4 and 0.52 from 4 to 6.
    sizes: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
    depths: tuple[int, ...] = (0, 32768, 100352)  # 0 is the 0-2k group
    repeats: int = 5
    exact_sessions: int = 16
    exact_chunks: int = 6  # session b of the exactness check starts at depth (b % this) chunks
    attention_depths: tuple[int, ...] = (32768, 100352)
    spans: tuple[int, ...] = (2, 4, 8, 16)  # one session's chunks a pass (``span_chunk`` rows)
    span_depths: tuple[int, ...] = (0, 32768)
    grid: int = 512


# A smoke run on the CPU (the tiny model under Triton's interpreter): a 64-id grid, two sessions.
CPU_PLAN = BatchPlan(sizes=(1, 2), depths=(0,), repeats=1, exact_sessions=2, exact_chunks=2, attention_depths=(),
                     spans=(2,), span_depths=(0,), grid=64)


def _group(depth: int, b: int) -> list[int]:
    return [SPREAD[i % len(SPREAD)] for i in range(b)] if depth == 0 else [depth] * b


def _placed(reader: TorchReader, depth: int, chunks: int, rng: random.Random) -> tuple[SessionBook, SessionTensors]:
    """A session at ``depth`` (random KV rows below it) with ``chunks`` chunks of random ids pending."""
    grid = reader.grid
    book = SessionBook(grid=grid, ids=[rng.randrange(248000) for _ in range(depth + chunks * grid)])
    book.committed = depth
    tensors = reader.new_session()
    state = tensors.state
    state.reserve(depth + chunks * grid)
    gen = torch.Generator(device=state.device).manual_seed(depth + chunks)
    for t in state.k + state.v:
        t[:depth].normal_(generator=gen)
    state.length = depth
    return book, tensors


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timings(reader: TorchReader, plan: BatchPlan, rates: tuple[float, float], elem: int) -> list[dict[str, Any]]:
    cfg = reader.model.config
    rng = random.Random(18)
    rows = []
    weights_bytes = (floor_mod.projection_flops(cfg, 1) / 2) * elem
    for depth in plan.depths:
        for b in plan.sizes:
            depths = _group(depth, b)
            sessions = [_placed(reader, d, plan.repeats + 1, rng) for d in depths]
            costs = [reader.read_chunks(sessions) for _ in range(plan.repeats + 1)][1:]
            ms = sorted(costs)[len(costs) // 2] * 1000 / b * 512 / reader.grid
            floors = [floor_mod.cost(cfg, reader.grid, d, False, elem) for d in depths]
            flops = sum(c.flops for c in floors)
            nbytes = sum(c.bytes for c in floors) - (b - 1) * weights_bytes  # the weights are read once a pass
            floor = max(flops / rates[0], nbytes / rates[1]) * 1000 / b * 512 / reader.grid
            rows.append({"figure": "batch_chunk", "batch": b, "depth": depth or 1024,
                         "depth_range": "0-2k" if depth == 0 else None, "depths": depths, "ours_ms": ms,
                         "floor_ms": floor, "passes_ms": [c * 1000 for c in costs],
                         # a size above the largest the warm-up check let through is read in several passes
                         "one_pass": b <= reader.max_batch,
                         # the passes the reader ran: (batch size, sessions in it), ``pass_plan``
                         "passes": pass_plan(b, reader.fast.usable if reader.fast else (1,))})
            del sessions
            _sync(reader.model.device)
            if reader.model.device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _span_timings(reader: TorchReader, plan: BatchPlan) -> list[dict[str, Any]]:
    """One session at ``depth`` reading its next ``k`` chunks in one pass (``read_span``), ms per 512
    ids: the median of ``repeats`` passes after one warm pass, each on a session placed anew, so that
    every pass starts at the depth. A span size the warm-up check refused has no row."""
    rng = random.Random(19)
    rows = []
    for depth in plan.span_depths:
        for k in reader.spans:
            costs = []
            for _ in range(plan.repeats + 1):
                book, tensors = _placed(reader, depth, k, rng)
                costs.append(reader.read_span(book, tensors, k))
                del book, tensors
            costs = costs[1:]
            ms = sorted(costs)[len(costs) // 2] * 1000 / k * 512 / reader.grid
            rows.append({"figure": "span_chunk", "span": k, "depth": depth, "ours_ms": ms,
                         "passes_ms": [c * 1000 for c in costs]})
            _sync(reader.model.device)
    return rows


# (BM, BN, warps, stages): the shipped tiles, then leads
TILES = ((attention.BM, attention.BN, attention.WARPS, attention.STAGES), (128, 64, 8, 2), (128, 32, 8, 3),
         (64, 64, 4, 2), (64, 32, 4, 4))


def _attention_rates(reader: TorchReader, plan: BatchPlan) -> list[dict[str, Any]]:
    """Our attention kernel (and its merge) alone, 512 rows above each depth (``common.device_ms_per_call``):
    the reader's backend (``attention_layer``), then the Triton kernel's other tiles as leads."""
    assert reader.fast is not None
    backend = reader.fast.attention
    rows = 512
    cfg = reader.model.config
    dev = reader.model.device
    out = []
    for depth in plan.attention_depths:
        gen = torch.Generator(device=dev).manual_seed(depth)
        q = torch.randn(rows, cfg.num_attention_heads, cfg.head_dim, device=dev, generator=gen).bfloat16()
        k, v = (torch.randn(depth + rows, cfg.num_key_value_heads, cfg.head_dim, device=dev,
                            generator=gen).bfloat16() for _ in range(2))
        o = torch.empty_like(q)
        flops = 4 * cfg.num_attention_heads * cfg.head_dim * (rows * depth + rows * (rows + 1) / 2)
        # the shipped tiles first, then other tiles as leads (not used by the reader)
        for tiles in TILES if depth == plan.attention_depths[0] else TILES[:1]:
            call = functools.partial(attention.attend, q, k, v, depth, o, bm=tiles[0], bn=tiles[1], warps=tiles[2],
                                     stages=tiles[3]) if tiles != TILES[0] else functools.partial(
                backend.attend, q, k, v, depth, o)
            try:
                ms = device_ms_per_call(call)
            except Exception as err:  # a tile that does not compile is reported
                out.append({"figure": "attention_tiles", "depth": depth, "tiles": tiles, "error": str(err)[:200]})
                continue
            out.append({"figure": "attention_layer" if tiles == TILES[0] else "attention_tiles", "depth": depth,
                        "rows": rows, "tiles": tiles, "ours_ms": ms, "tflops": flops / ms / 1e9})
        if dev.type == "cuda":
            # ``o`` holds the last lead's output (other tiles, another split rule): compare with the shipped call
            backend.attend(q, k, v, depth, o)
            out += [_attention_read(backend, q, k, v, depth, o, flops, b) for b in (1, 8)]
    return out


def _attention_read(backend: AttentionBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, depth: int,
                    alone: torch.Tensor, flops: float, b: int) -> dict[str, Any]:
    """The attention a read's pass runs (``figure: "attention_read"``): ``attend_table`` from a table
    on the device, captured in a CUDA graph and replayed, for ``b`` sessions' 512-row chunks at
    ``depth``, each over KV rows of its own (session 0's are ``k``, ``v``). On a Hopper this is
    ``gluon-ws``'s kernel, where one ``attend`` call (``attention_layer``: questions, eager chunks)
    takes ``gluon-wg``'s launch. ``equal``: every session's rows ``torch.equal`` to its
    own ``attend`` call (session 0's is ``alone``)."""
    n, heads = q.shape[0], q.shape[1]
    gen = torch.Generator(device=q.device).manual_seed(depth + b)
    kvs = [(k, v)] + [tuple(torch.randn(k.shape, device=k.device, generator=gen).to(k.dtype) for _ in range(2))
                      for _ in range(b - 1)]
    table = torch.tensor([backend.table_row(depth, n, heads, ke, ve) for ke, ve in kvs], dtype=torch.int64,
                         device=q.device)
    qs = q.repeat(b, 1, 1).contiguous()
    out = torch.zeros_like(qs)
    graph = captured(lambda: backend.attend_table(qs, table, k, out))
    ms = device_ms_per_call(graph.replay)
    equal = torch.equal(out[:n], alone)
    for e in range(1, b):
        mine = torch.empty_like(q)
        backend.attend(q, kvs[e][0], kvs[e][1], depth, mine)
        equal = equal and torch.equal(out[e * n: (e + 1) * n], mine)
    return {"figure": "attention_read", "batch": b, "depth": depth, "rows": n, "ours_ms": ms / b,
            "pass_ms": ms, "tflops": b * flops / ms / 1e9, "equal": equal}


def _busy(reader: TorchReader, b: int, depth: int) -> dict[str, Any]:
    """One pass under torch's profiler: the summed kernel time against the pass's wall time (how
    much of a pass the GPU is busy; the rest is the host's launches and the eager steps)."""
    from torch.profiler import ProfilerActivity, profile

    rng = random.Random(b)
    sessions = [_placed(reader, d, 2, rng) for d in _group(depth, b)]
    reader.read_chunks(sessions)
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            wall = reader.read_chunks(sessions)
        events = prof.key_averages()
        kernel_us = sum(e.self_device_time_total for e in events)
        count = sum(e.count for e in events if e.self_device_time_total > 0)
    except Exception as err:  # the profiler is a lead, not a figure: its failure is reported
        return {"figure": "batch_busy", "batch": b, "depth": depth or 1024, "error": f"{type(err).__name__}: {err}"}
    # where the kernel time goes: the kernels that take most of it, summed over their launches
    top = sorted((e for e in events if e.self_device_time_total > 0), key=lambda e: -e.self_device_time_total)[:14]
    return {"figure": "batch_busy", "batch": b, "depth": depth or 1024, "wall_ms": wall * 1000,
            "kernel_ms": kernel_us / 1000, "kernels": count,
            "top": [{"name": e.key[:80], "ms": e.self_device_time_total / 1000, "calls": e.count} for e in top]}


def _exact(reader: TorchReader, plan: BatchPlan) -> dict[str, Any]:
    """Sessions read by real chunks to mixed depths (in batches), then one batch of all of them:
    each equal to itself read alone and to a fresh prefill of its ids."""
    rng = random.Random(8)
    n, grid = plan.exact_sessions, reader.grid
    books = [SessionBook(grid=grid, ids=[rng.randrange(248000) for _ in range((i % plan.exact_chunks + 1) * grid)])
             for i in range(n)]
    sessions = [(book, reader.new_session()) for book in books]
    while True:
        ready = [s for s in sessions if s[0].pending > grid]  # all but each session's last chunk
        if not ready:
            break
        reader.read_chunks(ready[:reader.max_batch])
    depths = [book.committed for book in books]
    alone = []
    for book, tensors in sessions:
        copy = SessionBook(grid=grid, ids=list(book.ids), committed=book.committed)
        own = SessionTensors(clone_state(tensors.state))
        reader.read_chunk(copy, own)
        alone.append(own)
    reader.read_chunks(sessions)
    equal_alone = [same_state(t.state, a.state) for (_, t), a in zip(sessions, alone, strict=True)]
    equal_fresh = []
    for book, tensors in sessions:
        got, want = reader.export(tensors), reader.fresh(book.ids)
        equal_fresh.append(all(torch.equal(got[k], want[k]) for k in want))
    return {"equal": all(equal_alone) and all(equal_fresh), "sessions": n, "depths_before": depths,
            "equal_alone": equal_alone, "equal_fresh": equal_fresh,
            "how": "sessions read by real chunks to mixed depths in batches of up to max_batch, then all in one "
                   "read_chunks call; each against a copy read alone (read_chunk) and a fresh prefill (fresh)"}


def measure(ckpt: Path, device: str, dtype: str, plan: BatchPlan, rates: tuple[float, float],
            attention: str = "auto") -> dict[str, Any]:
    t0 = time.perf_counter()
    model = Qwen35.from_pretrained(ckpt, device=device, dtype=dtype)
    reader = TorchReader(model, plan.grid, fast=True, spans=plan.spans,
                         attention=choose(attention, model.device))  # the ATTENTION setting, as the container does
    warm = reader.warm_up()
    report = reader.fast_report()
    elem = 2 if dtype == "bfloat16" else 4
    exact = _exact(reader, plan)
    rows = _timings(reader, plan, rates, elem) + _span_timings(reader, plan)
    if device == "cuda":
        rows += _attention_rates(reader, plan)
        rows += [_busy(reader, b, d) for b, d in ((1, 0), (8, 0), (16, 0), (8, 32768))]
    return {"rows": rows, "exact": exact, "warm_up_s": warm, "fast_report": report,
            "wall_s": time.perf_counter() - t0}
