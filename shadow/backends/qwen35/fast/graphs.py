"""The fast path's CUDA graphs: capture of every row count's pieces into one shared pool, the
warm-up check that each captured batch size reads every session as it reads alone, and the report
of what all of it holds.

Why a check and not a proof: every piece of a batched pass computes one session's numbers from that
session's alone (the package's docstring says how), except that cuBLAS picks its GEMM kernel by the
row count, and a kernel that splits the reduction differently would round differently. So each
captured batch size reads random sessions at mixed depths and compares every tensor with the same
session's chunk read alone (``torch.equal``). A size that differs is refused: the reader splits
batches over the sizes left, and the log and the report say which size failed and why.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from ..attention.backend import AttentionBackend
from ..config import Qwen35Config
from ..model import Qwen35
from ..state import ModelState
from .staging import Rows, stacked

log = logging.getLogger(__name__)

CHECK_SEED = 18
CHECK_DEPTHS = 4  # session b of a check batch starts at depth (b % CHECK_DEPTHS) chunks


class Passes(Protocol):
    """What ``Graphs`` captures and checks: the forward's row counts and passes (``FastForward``)."""

    model: Qwen35
    cfg: Qwen35Config
    grid: int
    device: torch.device
    attention: AttentionBackend
    n_attn: int
    read_stops_early: bool
    batches: tuple[int, ...]
    spans: tuple[int, ...]

    @property
    def shapes(self) -> tuple[tuple[int, int, bool], ...]: ...

    @property
    def whole_forks(self) -> bool: ...

    @property
    def usable(self) -> tuple[int, ...]: ...

    def rows_for(self, n: int, seg: int | None = None, read: bool = False) -> Rows: ...

    def run_piece(self, r: Rows, j: int) -> None: ...

    def table_pass(self, r: Rows, read: bool = True) -> None: ...

    def logits(self, r: Rows) -> None: ...

    def read_chunk(self, ids: torch.Tensor, state: ModelState) -> None: ...

    def read_chunks(self, chunks: Sequence[tuple[torch.Tensor, ModelState]], size: int | None = None) -> None: ...


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's collector must not run during a capture: freeing another instance's graphs or
    events is a CUDA call that a capture forbids (it invalidates the capture). Collect first."""
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class Graphs:
    """The forward's CUDA graphs (``enabled``: on CUDA by default): their capture into one pool, the
    warm-up check of each batch and span size, what it refused, and the report of what it holds."""

    def __init__(self, passes: Passes, enabled: bool) -> None:
        self.passes = passes
        self.enabled = enabled
        self.pool: Any = None
        self.capture_s = 0.0
        self.capture_bytes = 0
        self.check_s = 0.0
        # Per batch size (per span size): why it is not used (its warm-up check failed); absent if usable.
        self.refused: dict[int, str] = {}
        self.refused_spans: dict[int, str] = {}

    @property
    def captured(self) -> bool:
        return self.pool is not None

    def batch_sizes(self) -> dict[int, str]:
        """Per batch size: "ok" once checked (1 needs no check), "unchecked" before, else why refused."""
        return {b: self.refused.get(b, "ok" if self.check_s or b == 1 else "unchecked") for b in self.passes.batches}

    def capture(self) -> None:
        """Capture every row count's pieces, largest first, into one pool (CUDA only)."""
        t0 = time.perf_counter()
        fast = self.passes
        dev = fast.device
        with collector_paused():
            # Capture empties the allocator's cache on entry: empty it first, so that the difference
            # below is what the capture added, not what it freed.
            torch.cuda.empty_cache()
            reserved_before = torch.cuda.memory_reserved(dev)
            self.pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream(dev)  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream(dev))
            # largest first, so the smaller ones fit in what it leaves (the pool is shared)
            for n, seg, read in sorted(fast.shapes, reverse=True):
                r = fast.rows_for(n, seg, read)
                r.valid.fill_(1)  # the capture's runs write scratch rows only
                if read or fast.whole_forks:
                    self._capture_whole(r, stream, fork=not read)
                    continue
                pieces = self._pieces(n)
                with torch.cuda.stream(stream):  # compile every kernel and settle the allocator first
                    for j in range(pieces):
                        fast.run_piece(r, j)
                torch.cuda.current_stream(dev).wait_stream(stream)
                captured = []
                for j in range(pieces):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=self.pool, stream=stream):
                        fast.run_piece(r, j)
                    captured.append(g)
                r.graphs = captured
        torch.cuda.synchronize(dev)
        self.capture_s = time.perf_counter() - t0
        self.capture_bytes = torch.cuda.memory_reserved(dev) - reserved_before

    def _pieces(self, n: int) -> int:
        """How many graphs a piecewise row count runs: a batched read's (more than ``grid`` rows) needs
        no logits, and no last piece when the read stops early."""
        fast = self.passes
        if n <= fast.grid:
            return fast.n_attn + 2
        return fast.n_attn + (0 if fast.read_stops_early else 1)

    def _capture_whole(self, r: Rows, stream: Any, fork: bool = False) -> None:
        """A read's or a fork's pass as one graph (a fork's logits as a second one, replayed when
        asked). Its first run (which compiles the kernels and settles the allocator) needs a table that
        points somewhere: each entry gets its rows of one scratch buffer, dropped after the capture (a
        replay reads the table staged for it). What the graph computes in passing (the stream, q, k, v)
        is dropped after it too, so that the next (smaller) capture reuses that memory of the pool: the
        graphs never run at once and none reads another's work, which is what sharing a pool asks
        (pytorch/pytorch#166975; vLLM captures its batch sizes so). A fork's last hidden rows stay: its
        logits graph reads them."""
        fast = self.passes
        dev, cfg, entries = fast.device, fast.cfg, r.table_shape[1]
        each = r.n // entries
        scratch = torch.zeros(2, r.n, cfg.num_key_value_heads, cfg.head_dim, device=dev, dtype=fast.model.dtype)
        rows = []
        for e in range(entries):
            k, v = (t[e * each:(e + 1) * each] for t in scratch)
            rows += fast.attention.table_row(0, each, cfg.num_attention_heads, k, v)
        r.table.copy_(torch.tensor(rows * fast.n_attn, device=dev).view(r.table_shape))
        with torch.cuda.stream(stream):
            fast.table_pass(r, read=not fork)
            if fork:
                fast.logits(r)
        torch.cuda.current_stream(dev).wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=stream):
            fast.table_pass(r, read=not fork)
        r.whole = g
        if fork:
            logits = torch.cuda.CUDAGraph()
            with torch.cuda.graph(logits, pool=self.pool, stream=stream):
                fast.logits(r)
            r.graphs = [logits]
        torch.cuda.synchronize(dev)
        if not fork:
            r.h = r.delta = None
        r.proj = None
        r.qkv.clear()

    def check(self, seed: int = CHECK_SEED) -> dict[int, str]:
        """Read random sessions at mixed depths in each batch size above 1 and alone; refuse (in
        ``self.refused``) each size where some session's tensors differ, and likewise each span size
        (``check_spans``). Returns the batch sizes' refusals."""
        t0 = time.perf_counter()
        fast = self.passes
        self.check_spans(seed)
        sizes = [b for b in fast.batches if b > 1]
        if not sizes:
            self.check_s = time.perf_counter() - t0
            return {}
        gen = torch.Generator().manual_seed(seed)
        vocab = fast.cfg.vocab_size

        def chunk() -> torch.Tensor:
            return torch.randint(0, vocab, (fast.grid,), generator=gen)

        def new_state() -> ModelState:
            # KV rows for the deepest session and its next chunk only (not a whole KV_STEP): the check
            # holds three copies of every session at once
            state = fast.model.new_state()
            rows = CHECK_DEPTHS * fast.grid
            state.k = [t.new_zeros(rows, *t.shape[1:]) for t in state.k]
            state.v = [t.new_zeros(rows, *t.shape[1:]) for t in state.v]
            return state

        bases: list[ModelState] = []
        for b in range(max(sizes)):
            state = new_state()
            for _ in range(b % CHECK_DEPTHS):
                fast.read_chunk(chunk(), state)
            bases.append(state)
        nexts = [chunk() for _ in bases]
        alone = []
        for base, ids in zip(bases, nexts, strict=True):
            state = clone_state(base)
            fast.read_chunk(ids, state)
            alone.append(state)
        for size in sizes:
            batch = [clone_state(base) for base in bases[:size]]
            fast.read_chunks(list(zip(nexts[:size], batch, strict=True)))
            differ = [b for b in range(size) if not same_state(batch[b], alone[b])]
            if differ:
                self.refused[size] = (f"session {differ[0]} of {size} (depth {(differ[0] % CHECK_DEPTHS) * fast.grid}) "
                                      f"differs from its chunk read alone; {len(differ)} of {size} differ")
                log.warning("fast path: batch size %d not used: %s", size, self.refused[size])
        del bases, alone, batch
        if fast.device.type == "cuda":
            torch.cuda.synchronize(fast.device)
            # give the check's sessions back to the device (the main model may share it), not to the cache
            torch.cuda.empty_cache()
        self.check_s = time.perf_counter() - t0
        return {b: why for b, why in self.refused.items() if b in sizes}

    def check_spans(self, seed: int = CHECK_SEED) -> dict[int, str]:
        """Each span size: a session one chunk deep reads its next k chunks in one pass and one pass a
        chunk; a size whose tensors differ is refused (``refused_spans``) and logged."""
        fast = self.passes
        gen = torch.Generator().manual_seed(seed + 1)
        for k in fast.spans:
            ids = torch.randint(0, fast.cfg.vocab_size, ((k + 1) * fast.grid,), generator=gen)
            base = fast.model.new_state()
            fast.read_chunk(ids[:fast.grid], base)
            alone, spanned = clone_state(base), clone_state(base)
            for j in range(1, k + 1):
                fast.read_chunk(ids[j * fast.grid:(j + 1) * fast.grid], alone)
            fast.read_chunks([(ids[fast.grid:], spanned)])
            if not same_state(alone, spanned):
                self.refused_spans[k] = f"a span of {k} chunks differs from its chunks read one pass each"
                log.warning("fast path: span of %d chunks not used: %s", k, self.refused_spans[k])
        return dict(self.refused_spans)

    def report(self) -> dict[str, Any]:
        """The graphs' part of the fast path's report: whether captured, how long it took, what the
        check let through, and (captured) what the capture added to the allocator."""
        fast = self.passes
        out: dict[str, Any] = {
            "graphs": self.enabled, "capture_s": self.capture_s,
            # per batch size: "ok" once checked, "unchecked" before (or without graphs), else why not used
            "batches": {str(b): why for b, why in self.batch_sizes().items()},
            "spans": {str(k): self.refused_spans.get(k, "ok" if self.check_s else "unchecked") for k in fast.spans},
            "max_batch": fast.usable[-1], "check_s": self.check_s,
        }
        if self.enabled and self.pool is not None:
            # what the capture added to the allocator's reservation: the graphs' pool and work buffers
            out["capture_reserved_bytes"] = self.capture_bytes
            # everything the allocator holds after capture (the weights included)
            out["allocator_reserved_bytes"] = torch.cuda.memory_reserved(fast.device)
        return out


def clone_state(s: ModelState) -> ModelState:
    """A deep copy whose conv and recurrent tensors are stacked again (so the fast path moves them in
    one copy each)."""
    def kind(views: list[torch.Tensor]) -> list[torch.Tensor]:
        base = stacked(views)
        return list(base.clone().unbind(0)) if base is not None else [t.clone() for t in views]

    return ModelState(s.cfg, s.device, s.dtype, s.length, [t.clone() for t in s.k], [t.clone() for t in s.v],
                      kind(s.conv), kind(s.recurrent))


def same_state(a: ModelState, b: ModelState) -> bool:
    """Bit for bit: the committed KV rows, the conv and the recurrent state."""
    if a.length != b.length:
        return False
    n = a.length
    rows = [(x[:n], y[:n]) for x, y in zip(a.k + a.v, b.k + b.v, strict=True)]
    return all(torch.equal(x, y) for x, y in rows + list(zip(a.conv + a.recurrent, b.conv + b.recurrent,
                                                              strict=True)))
