"""The fast forward: merged projections, fused kernels and CUDA graphs, reading one session's chunk
or a batch of sessions' chunks in one forward.

A read's pass (``grid`` rows a session, or a span's ``k * grid``) is one captured graph for every
depth and every set of sessions: its attention reads each chunk's start, split rule and KV
addresses from a table staged with its ids (``attention.attend_table``, ``write_rows``), so each
session's KV rows stay in its own buffers, growing in 8,192-row steps: no reservation of a maximum
length, no paging. A fork's pass (questions, decode) is one graph too, with a one-entry table
(``fork.py``); where our kernel does not serve the grid, both run piecewise graphs around attention,
which runs eagerly between them (``piecewise.py``). Neither sizes anything from a buffer's capacity,
which would change bits as the buffer grew.

Per-session state that the graphs touch lives in static buffers: the conv and recurrent state of
``max_batch`` slots, copied in before a forward and, for a chunk that commits, copied out after it
(about 19 MB each way a session at 0.8B; a read's sessions in one launch a kind inside its graph,
``slots.py``). KV rows are written straight into each session's own buffers, inside a pass's graph
or eagerly between a piecewise pass's pieces (``piecewise.py``). A fork (question, decode; ``fork.py``) uses
slot 0 and copies in, never out, so the committed state is untouched by construction. A pass's
inputs cross in one copy from pinned host memory (``staging.py``).

A batch: B sessions, each at its own depth, read their next chunk in one pass of ``B * grid`` rows,
session b's rows at ``[b * grid, (b + 1) * grid)``. Each session's tensors equal its chunk read
alone, bit for bit, whatever it is batched with, because every piece computes a session's numbers
from that session's alone, in the same order:
- row-wise kernels (embedding, norms, SiLU, gates, q/k norm and RoPE, output gate, gated norm):
  one row's result is a function of that row (and its session's start) only;
- the conv: a program holds rows of one session and reads that session's held columns
  (``kernels.conv_silu`` with a state per session);
- GDN: fla's kernels with the sessions as their batch axis; a program's sequence comes from its
  program id, so one session's programs run the same code on the same numbers (``gdn_fla``);
- attention: each chunk's programs read that chunk's row of the table only, and run ``attend``'s
  code on it, its split rule a function of that chunk's depth alone;
- GEMMs over the concatenated rows: cuBLAS computes a row from that row and the weight, in an
  order fixed by the kernel it picks; the kernel may change with the row count (split K, say), so
  this is checked rather than assumed. At warm-up every captured batch size reads random sessions
  at mixed depths and compares each with the same session read alone (``graphs.check``); a size
  that differs is not used, and the log and ``report()`` say so. The MLP's gate/up GEMM and SiLU
  run as one kernel where that gives cuBLAS's bits and is faster (``gate_up.py``). Without CUDA the
  GEMMs run per session, which keeps the eager path invariant by construction: on the dev CPU
  concatenated rows did give a session's bits (the 0.8B's shapes and the tiny model's, fp32 and
  bf16), but nothing documents that the CPU library's blocking ignores the row count, and the eager
  path has no warm-up check to catch it.

A span: one pass reads k consecutive chunks of each of its sessions (``k * grid`` rows a session),
each session's chunks in the bits of reading them one pass each: the rows are the same and so is
everything row-wise; the conv takes a chunk's held columns from the rows before it, the very values
a chunk's state would hold; fla's state kernel carries the recurrent state across the chunks in
fp32, as the slots carry it between passes (``benchmarks/probes/gdn_span.py``: bit-equal on the
H200); attention takes each chunk as an entry of its own, at that chunk's own start. Spans are
captured and checked only for the sizes ``FastForward(spans=...)`` names (the service's ``SPANS``
setting: 2 to 16 chunks on CUDA, none elsewhere).

Row counts: a read uses ``B * grid`` rows for each batch size B; a fork runs whole ``grid`` passes
and then one padded pass of the smallest captured size that holds the rest. Padding rows come after
the real ones: attention is causal, and the gate kernel gives them no decay and no write
(``valid``), so they change neither the real rows' outputs nor the state the next step continues.

Exactness: a chunk at any depth runs the same captured kernels with the same fixed configurations,
so reading a session over many turns gives the bits of a fresh prefill on the same grid, on this
path, in any process. Against the torch forward the fast path agrees within bf16 rounding (its
kernels round once where the torch forward rounds at every op).

Without CUDA (the tests) the same pieces run eagerly, the Triton kernels under Triton's
interpreter, and the GDN's conv and rule through their torch forms, one session at a time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from . import attention, gate_up, graphs, kernels, piecewise, slots
from .fork import Fork
from .gdn import gated_delta_rule_chunked
from .merged import FullW, GdnW, merge, one_plus
from .model import Qwen35
from .staging import Rows, read_table
from .state import ModelState

# Fork pass sizes below the grid (the grid itself is one too): above 64 rows a question pads by at
# most a quarter.
FORK_SIZES = (1, 8, 32, 64, 128, 192, 256, 320, 384, 448)
# Sessions one read pass may take, each size captured on CUDA: every size, so that no pass reads an
# empty slot (on an H100, 3 sessions in a pass of 4 with a placeholder cost 19 % more than in a pass
# of 3 at 0-2k and 8 % more at 100k: ``benchmarks/results/history/read_rate-h100_cb3f014.json`` against
# ``history/read_rate-h100_6101664.json``). Off CUDA (eager) three sizes.
BATCHES = tuple(range(1, 17))
EAGER_BATCHES = (1, 2, 4)


class FastForward:
    """The fast forward of one model. One instance serves every session, one forward at a time."""

    def __init__(self, model: Qwen35, grid: int, graphs: bool | None = None,
                 batches: Sequence[int] | None = None, spans: Sequence[int] = (), fused_mlp: bool = True) -> None:
        if model.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("the fast path off CUDA runs its Triton kernels under Triton's interpreter: "
                             "set TRITON_INTERPRET=1 before start (slow; meant for tests)")
        cfg = model.config
        self.model = model
        self.cfg = cfg
        self.grid = grid
        self.device = model.device
        self.use_graphs = model.device.type == "cuda" if graphs is None else graphs
        self.eps = cfg.rms_norm_eps
        self.layers: list[GdnW | FullW] = merge(model)
        self.final_norm = one_plus(model.final_norm)
        # pieces: layers up to and including the pre-attention part of full layer j
        self.segments: list[list[GdnW | FullW]] = [[]]
        for lw in self.layers:
            self.segments[-1].append(lw)
            if isinstance(lw, FullW):
                self.segments.append([])
        self.n_attn = len(self.segments) - 1
        # A chunk that commits needs no output: when the last layer is full attention, its KV rows
        # are all the state it leaves, so the read stops before its attention and MLP.
        self.read_stops_early = isinstance(self.layers[-1], FullW)
        if batches is None:
            batches = BATCHES if self.device.type == "cuda" else EAGER_BATCHES
        if 1 not in batches or any(b < 1 for b in batches):
            raise ValueError(f"batch sizes must be positive and include 1, got {list(batches)}")
        self.batches = tuple(sorted(set(batches)))
        if any(k < 2 for k in spans):
            raise ValueError(f"a span is 2 chunks or more, got {list(spans)}")
        self.spans = tuple(sorted(set(spans)))  # chunks one session reads in one pass (captured, checked)
        # Per batch size (per span size): why it is not used (its warm-up check failed); absent if usable.
        self.refused: dict[int, str] = {}
        self.refused_spans: dict[int, str] = {}
        # Per read row count: "fused" where the MLP's GEMM and SiLU run as one kernel, else why not
        # (``gate_up.choose`` at warm-up; bits as cuBLAS's either way).
        self.fused_mlp = fused_mlp
        self.mlp_forms: dict[int, str] = {}
        self.mlp_choose_s = 0.0
        # Without CUDA, GEMMs run per session (module docstring).
        self.gemm_per_session = self.device.type != "cuda"
        n_slots, layers = self.batches[-1], len(cfg.linear_layers)
        # [layer, slot, ...]: a layer's slots are contiguous, fla's batch axis.
        self.conv_all = torch.zeros(layers, n_slots, cfg.conv_dim, cfg.linear_conv_kernel_dim, device=self.device,
                                    dtype=model.dtype)
        self.rec_all = torch.zeros(layers, n_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                   cfg.linear_value_head_dim, device=self.device, dtype=torch.float32)
        self.rows: dict[tuple[int, int, bool], Rows] = {}  # by (rows, rows a session, a read's)
        # A read's pass is captured whole: its attention reads each chunk's start and KV addresses
        # from a table on the device (``attention.attend_table``), where our kernel serves the grid.
        self.table_reads = attention.fits(grid, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.fork_tables = True  # and a fork's pass likewise (``whole_forks``; off: piecewise, for the probes)
        self._kv_like = torch.empty(1, cfg.num_key_value_heads, cfg.head_dim, device=self.device, dtype=model.dtype)
        self.pool: Any = None
        self.capture_s = 0.0
        self.capture_bytes = 0
        self.check_s = 0.0
        self.placeholders: list[ModelState] = []  # a batch's empty slots (``slots.placeholders``)
        self.scratch: dict[str, torch.Tensor] = {}  # buffers every row count shares (``_shared``)
        self._fla: Any = None
        if self.device.type == "cuda":
            from . import gdn_fla

            if gdn_fla.available():
                self._fla = gdn_fla

    # ---- sizes ---------------------------------------------------------------------------------

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every row count a pass may take: the fork sizes, the grid, and each batch's rows."""
        return tuple(s for s in FORK_SIZES if s < self.grid) + tuple(b * self.grid for b in self.batches)

    @property
    def shapes(self) -> tuple[tuple[int, int, bool], ...]:
        """Every (rows, rows a session, a read's) a pass may take: a fork's sizes up to the grid, each
        batch's and each span's reads (with the piecewise path, a read of one grid shares a fork's)."""
        forks = tuple((n, n, False) for n in self.sizes if n <= self.grid)
        reads = tuple((b * self.grid, self.grid, self.table_reads) for b in self.batches)
        reads += tuple((k * self.grid, k * self.grid, self.table_reads) for k in self.spans)
        return tuple(dict.fromkeys(forks + reads))

    @property
    def usable(self) -> tuple[int, ...]:
        """Batch sizes a read may take (those whose warm-up check passed, or not yet checked)."""
        return tuple(b for b in self.batches if b not in self.refused)

    @property
    def max_batch(self) -> int:
        return self.usable[-1]

    def batch_sizes(self) -> dict[int, str]:
        """Per batch size: "ok" once checked (1 needs no check), "unchecked" before, else why refused."""
        return {b: self.refused.get(b, "ok" if self.check_s or b == 1 else "unchecked") for b in self.batches}

    @property
    def whole_forks(self) -> bool:
        """Whether a fork's pass takes its attention from a table, its layers one graph (``fork.py``)."""
        return self.table_reads and self.fork_tables

    def _size_for(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def _chunked(self, n: int) -> bool:
        """Whether ``n`` rows take fla's chunked kernels (else its recurrent step, or without fla
        the torch form): a decode step's few rows cost more in the chunked form's launches."""
        return self._fla is not None and n >= 16

    def _rows_for(self, n: int, seg: int | None = None, read: bool = False) -> Rows:
        seg = min(n, self.grid) if seg is None else seg
        rows = self.rows.get((n, seg, read))
        if rows is None:
            cfg = self.cfg
            entries = n // self.grid if read else 1 if self.whole_forks else 0
            table = (self.n_attn, entries, attention.TABLE_FIELDS) if entries else ()
            attn = self._shared("attn", n * cfg.num_attention_heads * cfg.head_dim).view(n, -1, cfg.head_dim)
            rows = Rows.make(n, seg, attn, self.device, table)
            if self._chunked(n):  # the solve writes the same blocks of a row at any row count
                rows.solve = self._shared("solve", n * cfg.linear_num_value_heads * kernels.FLA_CHUNK).view(
                    1, n, -1, kernels.FLA_CHUNK)
            self.rows[(n, seg, read)] = rows
        return rows

    def _shared(self, kind: str, numel: int) -> torch.Tensor:
        """The first ``numel`` elements of one zeroed buffer of ``kind`` every row count shares (one
        pass runs at a time), made anew when a row count needs more. Apart, the 0.8B's 20 read shapes
        would hold 0.5 GB of them (4 KB of attention output and 2 KB of solve a row)."""
        held = self.scratch.get(kind)
        if held is None or held.numel() < numel:
            held = self.scratch[kind] = torch.zeros(numel, device=self.device, dtype=self.model.dtype)
        return held[:numel]

    # ---- the pieces ----------------------------------------------------------------------------

    def _chunk_rows(self, r: Rows) -> int:
        """Rows of one grid chunk's call where a piece runs per chunk (a session's rows if fewer):
        a span's chunks then see the calls their one-chunk passes see."""
        return min(r.seg, self.grid)

    def _linear(self, r: Rows, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        step = self._chunk_rows(r)  # off CUDA a GEMM never takes two chunks' rows
        if not self.gemm_per_session or r.n <= step:
            return F.linear(x, w)
        return torch.cat([F.linear(x[at:at + step], w) for at in range(0, r.n, step)])

    def _norm(self, r: Rows, w: torch.Tensor) -> torch.Tensor:
        """``rmsnorm(h + delta)``, with the pending delta added into the stream in place."""
        assert r.h is not None
        x = torch.empty_like(r.h)
        kernels.rms_norm(r.h, w, self.eps, x, add=r.delta)
        r.delta = None
        return x

    def _mlp(self, r: Rows, lw: GdnW | FullW) -> None:
        x = self._norm(r, lw.norm_post)
        act = torch.empty(r.n, lw.down.shape[1], device=x.device, dtype=x.dtype)
        if self.mlp_forms.get(r.n) == "fused":
            gate_up.gate_up_silu(x, lw.gate_up, act)
        else:
            kernels.silu_mul(self._linear(r, x, lw.gate_up), act)
        r.delta = self._linear(r, act, lw.down)

    def _gdn(self, r: Rows, lw: GdnW) -> None:
        cfg, n, b = self.cfg, r.n, r.sessions
        x = self._norm(r, lw.norm_in)
        proj = self._linear(r, x, lw.w_in)  # [n, conv_dim + value_dim + 2 value heads]
        kd, vd, hv = cfg.key_dim, cfg.value_dim, cfg.linear_num_value_heads
        mixed = torch.empty(n * cfg.conv_dim, device=x.device, dtype=x.dtype)
        if self.device.type == "cuda":
            kernels.conv_silu(proj, self.conv_all[lw.index, :b], lw.conv, kd, cfg.linear_key_head_dim, r.valid,
                              mixed, block_t=8 if b == 1 or r.seg % 8 == 0 else 1)  # 1: single-row sessions (decode)
        else:
            kernels.conv_silu_torch(proj, self.conv_all[lw.index, :b], lw.conv, kd, cfg.linear_key_head_dim, r.valid,
                                    mixed)
        q = mixed[:n * kd].view(n, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        k = mixed[n * kd:2 * n * kd].view(n, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        v = mixed[2 * n * kd:].view(n, hv, cfg.linear_value_head_dim)
        g = torch.empty(n, hv, device=x.device, dtype=torch.float32)
        beta = torch.empty(n, hv, device=x.device, dtype=x.dtype)
        z_off = cfg.conv_dim
        chunked = self._chunked(n)
        kernels.gates(proj, z_off + vd, z_off + vd + hv, lw.neg_a, lw.dt_bias, r.valid, g, beta,
                      chunk_sums=chunked, seg=r.seg)
        states = self.rec_all[lw.index, :b]
        if chunked:
            assert r.solve is not None
            o = self._fla.chunk_rule_in_place(q, k, v, g, beta, states, r.solve)
        else:  # a call a chunk (or a session's rows, if fewer), each from what the one before left
            outs = []
            step = self._chunk_rows(r)
            for rows in range(0, n, step):
                part = slice(rows, rows + step)
                state = states[rows // r.seg]
                args = (q[part], k[part], v[part], g[part], beta[part], state)
                if self._fla is None:
                    o_i, new = gated_delta_rule_chunked(*args, normalized=True)
                else:
                    o_i, new = self._fla.recurrent_step(*args, normalized=True)
                state.copy_(new)
                outs.append(o_i)
            o = outs[0] if len(outs) == 1 else torch.cat(outs)
        y = torch.empty(n, vd, device=x.device, dtype=x.dtype)
        kernels.gated_norm(o.contiguous(), proj, z_off, lw.norm, self.eps, y)
        r.delta = self._linear(r, y, lw.out)
        self._mlp(r, lw)

    def _piece(self, r: Rows, j: int) -> None:
        """Piece ``j``: close full-attention layer ``j-1`` (if any), run the GDN layers up to full layer
        ``j``, and prepare its q, k, v (if any)."""
        cfg = self.cfg
        if j == 0:
            r.h = F.embedding(r.ids, self.model.embed)
            r.delta = None
        else:
            lw = self.segments[j - 1][-1]
            assert isinstance(lw, FullW) and r.proj is not None
            gated = torch.empty_like(r.attn)
            kernels.output_gate(r.attn, r.proj, gated)
            r.delta = self._linear(r, gated.view(r.n, -1), lw.o)
            self._mlp(r, lw)
        for lw in self.segments[j]:
            if isinstance(lw, GdnW):
                self._gdn(r, lw)
                continue
            x = self._norm(r, lw.norm_in)
            r.proj = self._linear(r, x, lw.w_in)
            kvh, hd = cfg.num_key_value_heads, cfg.head_dim
            q = torch.empty(r.n, cfg.num_attention_heads, hd, device=x.device, dtype=x.dtype)
            k = torch.empty(r.n, kvh, hd, device=x.device, dtype=x.dtype)
            v = torch.empty(r.n, kvh, hd, device=x.device, dtype=x.dtype)
            kernels.qk_norm_rope(r.proj, lw.q_norm, lw.k_norm, self.model._inv_freq, r.starts, self.eps, q, k, v,
                                 seg=r.seg)
            r.qkv[lw.index] = (q, k, v)

    def _logits(self, r: Rows) -> None:
        assert r.h is not None and r.delta is not None
        last = r.valid - 1
        h = r.h.index_select(0, last)
        x = torch.empty_like(h)
        kernels.rms_norm(h, self.final_norm, self.eps, x, add=r.delta.index_select(0, last))
        r.logits = F.linear(x, self.model.lm_head).float()[0]

    def _run(self, r: Rows, j: int) -> None:
        if r.graphs:
            r.graphs[j].replay()
        elif j < len(self.segments):
            self._piece(r, j)
        else:
            self._logits(r)

    def _read_pass(self, ids: torch.Tensor, states: Sequence[ModelState], seg: int, sources: Sequence[int]) -> None:
        """A read's pass (``seg`` rows a session, no logits): one captured graph, its attention
        reading each grid chunk's start, split rule and KV addresses from the staged table, its
        first and last launches moving the states at ``sources`` (``slots.sources``; none staged:
        they moved apart) into their slots and back."""
        if not self.table_reads:
            piecewise.run(self, ids, states, seg, logits=False, seg=seg)
            return
        r = self._rows_for(ids.shape[0], seg, read=True)
        if len(states) != r.sessions:
            raise ValueError(f"{r.n} rows are {r.sessions} sessions' passes, got {len(states)} sessions")
        starts = [s.length for s in states]
        for s in states:
            s.reserve(s.length + seg)
        table = read_table(states, starts, seg, self.grid, self.n_attn, self.cfg.num_attention_heads,
                           self._kv_like)
        r.stage(ids, starts, seg, table, sources)
        if r.whole is not None:
            r.whole.replay()
        else:
            self._table_pass(r)

    def _table_pass(self, r: Rows, read: bool = True) -> None:
        """A pass as its graph holds it: the pieces, and between them each layer's K and V rows
        written and attended to through the table; a read's staged states moved into their slots
        first and back last (a fork's stay in slot 0), and a read stops early where it may."""
        stop = read and self.read_stops_early
        if read:
            slots.move(self, r, into=True)
        for j in range(self.n_attn):
            self._piece(r, j)
            q, k, v = r.qkv[j]
            attention.write_rows(k, v, r.table[j])
            if not (stop and j == self.n_attn - 1):
                attention.attend_table(q, r.table[j], self._kv_like, r.attn)
        if not stop:
            self._piece(r, self.n_attn)
        if read:
            slots.move(self, r, into=False)

    # ---- what the reader calls -------------------------------------------------------------

    def read_chunk(self, ids: torch.Tensor, state: ModelState) -> None:
        """Commit ``grid`` ids: the state moves on, exactly as a fresh prefill's chunk would."""
        self.read_chunks([(ids, state)])

    def read_chunks(self, chunks: Sequence[tuple[torch.Tensor, ModelState]], size: int | None = None) -> None:
        """Commit ``grid`` ids to each state in one pass (a batch size this path takes), or ``k *
        grid`` ids to one state (a span of a size given at construction): each state moves on
        exactly as if its chunks were read alone, one pass each. ``size``: the batch size to read
        them in, its slots past theirs empty (``slots.placeholders``)."""
        empty = slots.placeholders(self, size - len(chunks)) if size else []
        chunks = [*chunks, *((chunks[0][0].new_zeros(self.grid), state) for state in empty)]  # ids where theirs are
        b = len(chunks)
        seg = chunks[0][0].shape[0] if chunks else 0
        if seg == self.grid and b not in self.batches:
            raise ValueError(f"a pass reads {list(self.batches)} sessions, got {b}")
        if seg != self.grid and (seg % self.grid or seg // self.grid not in self.spans or b != 1
                                 or seg // self.grid in self.refused_spans):
            raise ValueError(f"a pass reads {self.grid} ids a session, or one session's span of "
                             f"{list(self.spans)} chunks; got {b} of {seg} ids")
        for ids, _ in chunks:
            if ids.shape[0] != seg:
                raise ValueError(f"a pass reads the same number of ids a session, got {ids.shape[0]} and {seg}")
        states = [state for _, state in chunks]
        if len({id(s) for s in states}) != b:
            raise ValueError("a session appears twice in one batch")
        # the piecewise path (no table reads) holds no slot copies of its own: its states move apart
        sources = slots.sources(self, states) if self.table_reads else []
        if not sources:
            for slot, state in enumerate(states):
                slots.copy(self, state, slot, into_slot=True)
        self._read_pass(chunks[0][0] if b == 1 else torch.cat([ids for ids, _ in chunks]), states, seg, sources)
        for slot, state in enumerate(states):
            if not sources:
                slots.copy(self, state, slot, into_slot=False)
            state.length += seg
        for state in empty:
            state.length = 0

    def fork(self, ids: list[int], state: ModelState) -> Fork:
        """Start a fork above the committed rows: the state's conv and recurrent tensors are not
        written; KV rows above ``state.length`` are scratch."""
        slots.copy(self, state, 0, into_slot=True)
        return Fork(self, state, state.length).extend(ids)

    # ---- capture -------------------------------------------------------------------------------

    def warm_up(self) -> float:
        """Choose the MLP's form per read row count, capture every row count's pieces (CUDA only),
        then check each batch size against its sessions read alone; returns the seconds it took."""
        if self.use_graphs and self.pool is None:
            if self.fused_mlp:
                self.mlp_forms = gate_up.choose(self)
            graphs.capture(self)
            graphs.check(self)
        return self.mlp_choose_s + self.capture_s + self.check_s

    def report(self) -> dict[str, Any]:
        """What the fast path holds beside the sessions, shared by all of them."""
        return graphs.report(self)
