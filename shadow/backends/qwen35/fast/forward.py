"""``FastForward``: the fast path's layers and passes, composed of its parts (the package's
docstring says how a pass keeps each session's bits). One instance serves every session, one
forward at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from .. import kernels
from ..attention import choose
from ..attention import table as attention_table
from ..attention.backend import AttentionBackend
from ..gdn import gated_delta_rule_chunked
from ..merged import FullW, GdnW, merge, one_plus
from ..model import Qwen35
from ..state import ModelState
from . import gate_up, piecewise
from .fork import Fork
from .graphs import Graphs
from .slots import StateSlots
from .staging import Rows, Staging, read_table

# Fork pass sizes below the grid (the grid itself is one too): above 64 rows a question pads by at
# most a quarter.
FORK_SIZES = (1, 8, 32, 64, 128, 192, 256, 320, 384, 448)
# Sessions one read pass may take, each size captured on CUDA: every size, so that no pass reads an
# empty slot (an empty slot's cost: benchmarks/README.md). Off CUDA (eager) three sizes.
BATCHES = tuple(range(1, 17))
EAGER_BATCHES = (1, 2, 4)


class FastForward:
    """The fast forward of one model. ``attention``: the chunk attention backend (the container
    resolves the ``ATTENTION`` setting; by default ``auto`` for the model's device)."""

    def __init__(self, model: Qwen35, grid: int, graphs: bool | None = None,
                 batches: Sequence[int] | None = None, spans: Sequence[int] = (), fused_mlp: bool = True,
                 attention: AttentionBackend | None = None) -> None:
        if model.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("the fast path off CUDA runs its Triton kernels under Triton's interpreter: "
                             "set TRITON_INTERPRET=1 before start (slow; meant for tests)")
        cfg = model.config
        self.model = model
        self.cfg = cfg
        self.grid = grid
        self.device = model.device
        self.attention = choose("auto", model.device) if attention is None else attention
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
        # Per read row count: "fused" where the MLP's GEMM and SiLU run as one kernel, else why not
        # (``gate_up.choose`` at warm-up; bits as cuBLAS's either way).
        self.fused_mlp = fused_mlp
        self.mlp_forms: dict[int, str] = {}
        self.mlp_choose_s = 0.0
        # Without CUDA, GEMMs run per session (the package's docstring).
        self.gemm_per_session = self.device.type != "cuda"
        self.slots = StateSlots(cfg, self.batches[-1], grid, self.device, model.dtype)
        self.staging = Staging(cfg, grid, self.n_attn, self.device, model.dtype)
        self.graphs = Graphs(self, model.device.type == "cuda" if graphs is None else graphs)
        # A read's pass is captured whole: its attention reads each chunk's start and KV addresses
        # from a table on the device (``AttentionBackend.attend_table``), where our kernel serves the grid.
        self.table_reads = self.attention.fits(grid, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.fork_tables = True  # and a fork's pass likewise (``whole_forks``; off: piecewise, for the probes)
        # any tensor of the KV rows' dtype and layout: what a table launch takes its strides from
        self.kv_like = torch.empty(1, cfg.num_key_value_heads, cfg.head_dim, device=self.device, dtype=model.dtype)
        self._fla: Any = None
        if self.device.type == "cuda":
            from .. import gdn_fla

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
    def refused(self) -> dict[int, str]:
        """Per batch size its warm-up check refused: why (``Graphs.check``)."""
        return self.graphs.refused

    @property
    def usable(self) -> tuple[int, ...]:
        """Batch sizes a read may take (those whose warm-up check passed, or not yet checked)."""
        return tuple(b for b in self.batches if b not in self.graphs.refused)

    @property
    def usable_spans(self) -> tuple[int, ...]:
        """Span sizes a read may take (those whose warm-up check passed, or not yet checked)."""
        return tuple(k for k in self.spans if k not in self.graphs.refused_spans)

    @property
    def max_batch(self) -> int:
        return self.usable[-1]

    def batch_sizes(self) -> dict[int, str]:
        """Per batch size: "ok" once checked (1 needs no check), "unchecked" before, else why refused."""
        return self.graphs.batch_sizes()

    @property
    def whole_forks(self) -> bool:
        """Whether a fork's pass takes its attention from a table, its layers one graph (``fork.py``)."""
        return self.table_reads and self.fork_tables

    def size_for(self, n: int) -> int:
        """The smallest row count a pass takes that holds ``n`` rows."""
        return next(s for s in self.sizes if s >= n)

    def chunked(self, n: int) -> bool:
        """Whether ``n`` rows take fla's chunked kernels (else its recurrent step, or without fla
        the torch form): a decode step's few rows cost more in the chunked form's launches."""
        return self._fla is not None and n >= 16

    def rows_for(self, n: int, seg: int | None = None, read: bool = False) -> Rows:
        """The static tensors of a pass of ``n`` rows, ``seg`` a session (``min(n, grid)`` by default)."""
        seg = min(n, self.grid) if seg is None else seg
        return self.staging.get(n, seg, read, self.whole_forks, self.chunked(n))

    @contextmanager
    def on_slots(self, slots: StateSlots) -> Iterator[None]:
        """The pieces compute on ``slots`` instead of the forward's own while the block runs (a graph
        captured inside keeps their addresses: a batched decode's slots, ``benchmarks/ab_agents.py``)."""
        own, self.slots = self.slots, slots
        try:
            yield
        finally:
            self.slots = own

    def block_rows(self) -> int:
        """The split rule's unit of this model's chunks under the attention backend."""
        return self.attention.block_rows(self.device.type, self.model.dtype, self.cfg.head_dim)

    # ---- the pieces ----------------------------------------------------------------------------

    def chunk_rows(self, r: Rows) -> int:
        """Rows of one grid chunk's call where a piece runs per chunk (a session's rows if fewer):
        a span's chunks then see the calls their one-chunk passes see."""
        return min(r.seg, self.grid)

    def _linear(self, r: Rows, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        step = self.chunk_rows(r)  # off CUDA a GEMM never takes two chunks' rows
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
            kernels.conv_silu(proj, self.slots.conv[lw.index, :b], lw.conv, kd, cfg.linear_key_head_dim, r.valid,
                              mixed, block_t=8 if b == 1 or r.seg % 8 == 0 else 1)  # 1: single-row sessions (decode)
        else:
            kernels.conv_silu_torch(proj, self.slots.conv[lw.index, :b], lw.conv, kd, cfg.linear_key_head_dim, r.valid,
                                    mixed)
        q = mixed[:n * kd].view(n, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        k = mixed[n * kd:2 * n * kd].view(n, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        v = mixed[2 * n * kd:].view(n, hv, cfg.linear_value_head_dim)
        g = torch.empty(n, hv, device=x.device, dtype=torch.float32)
        beta = torch.empty(n, hv, device=x.device, dtype=x.dtype)
        z_off = cfg.conv_dim
        chunked = self.chunked(n)
        kernels.gates(proj, z_off + vd, z_off + vd + hv, lw.neg_a, lw.dt_bias, r.valid, g, beta,
                      chunk_sums=chunked, seg=r.seg)
        states = self.slots.recurrent[lw.index, :b]
        if chunked:
            assert r.solve is not None
            o = self._fla.chunk_rule_in_place(q, k, v, g, beta, states, r.solve)
        else:  # a call a chunk (or a session's rows, if fewer), each from what the one before left
            outs = []
            step = self.chunk_rows(r)
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

    def piece(self, r: Rows, j: int) -> None:
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
            kernels.qk_norm_rope(r.proj, lw.q_norm, lw.k_norm, self.model.inv_freq, r.starts, self.eps, q, k, v,
                                 seg=r.seg)
            r.qkv[lw.index] = (q, k, v)

    def logits(self, r: Rows) -> None:
        assert r.h is not None and r.delta is not None
        last = r.valid - 1
        h = r.h.index_select(0, last)
        x = torch.empty_like(h)
        kernels.rms_norm(h, self.final_norm, self.eps, x, add=r.delta.index_select(0, last))
        r.logits = F.linear(x, self.model.lm_head).float()[0]

    def run_piece(self, r: Rows, j: int) -> None:
        """Piece ``j`` of pass ``r``: its graph replayed where captured, else run (the last: the logits)."""
        if r.graphs:
            r.graphs[j].replay()
        elif j < len(self.segments):
            self.piece(r, j)
        else:
            self.logits(r)

    def _read_pass(self, ids: torch.Tensor, states: Sequence[ModelState], seg: int, sources: Sequence[int]) -> None:
        """A read's pass (``seg`` rows a session, no logits): one captured graph, its attention
        reading each grid chunk's start, split rule and KV addresses from the staged table, its
        first and last launches moving the states at ``sources`` (``StateSlots.sources``; none
        staged: they moved apart) into their slots and back."""
        if not self.table_reads:
            piecewise.run(self, ids, states, seg, logits=False, seg=seg)
            return
        r = self.rows_for(ids.shape[0], seg, read=True)
        if len(states) != r.sessions:
            raise ValueError(f"{r.n} rows are {r.sessions} sessions' passes, got {len(states)} sessions")
        starts = [s.length for s in states]
        for s in states:
            s.reserve(s.length + seg)
        table = read_table(states, starts, seg, self.grid, self.n_attn, self.cfg.num_attention_heads, self.kv_like,
                           self.block_rows())
        r.stage(ids, starts, seg, table, sources)
        if r.whole is not None:
            r.whole.replay()
        else:
            self.table_pass(r)

    def table_pass(self, r: Rows, read: bool = True) -> None:
        """A pass as its graph holds it: the pieces, and between them each layer's K and V rows
        written and attended to through the table; a read's staged states moved into their slots
        first and back last (a fork's stay in slot 0), and a read stops early where it may."""
        stop = read and self.read_stops_early
        if read:
            self.slots.move(r, into=True)
        for j in range(self.n_attn):
            self.piece(r, j)
            q, k, v = r.qkv[j]
            attention_table.write_rows(k, v, r.table[j])
            if not (stop and j == self.n_attn - 1):
                self.attention.attend_table(q, r.table[j], self.kv_like, r.attn)
        if not stop:
            self.piece(r, self.n_attn)
        if read:
            self.slots.move(r, into=False)

    def fork_pass(self, ids: torch.Tensor, state: ModelState, real: int, logits: bool) -> torch.Tensor | None:
        """One pass of a fork: ``ids`` (a captured fork size, the first ``real`` of them real) at the
        state's length, on slot 0. Returns the logits of the last real row if asked."""
        if not self.whole_forks:
            return piecewise.run(self, ids, [state], real, logits=logits)
        r = self.rows_for(ids.shape[0])
        start = state.length
        state.reserve(start + r.n)
        r.stage(ids, [start], real, read_table([state], [start], r.n, r.n, self.n_attn, self.cfg.num_attention_heads,
                                               self.kv_like, self.block_rows()))
        if r.whole is not None:
            r.whole.replay()
            if logits:
                r.graphs[0].replay()
        else:
            self.table_pass(r, read=False)
            if logits:
                self.logits(r)
        return r.logits if logits else None

    # ---- what the reader calls -------------------------------------------------------------

    def read_chunk(self, ids: torch.Tensor, state: ModelState) -> None:
        """Commit ``grid`` ids: the state moves on, exactly as a fresh prefill's chunk would."""
        self.read_chunks([(ids, state)])

    def read_chunks(self, chunks: Sequence[tuple[torch.Tensor, ModelState]], size: int | None = None) -> None:
        """Commit ``grid`` ids to each state in one pass (a batch size this path takes), or ``k *
        grid`` ids to one state (a span of a size given at construction): each state moves on
        exactly as if its chunks were read alone, one pass each. ``size``: the batch size to read
        them in, its slots past theirs empty (``StateSlots.empty``)."""
        empty = self.slots.empty(size - len(chunks)) if size else []
        chunks = [*chunks, *((chunks[0][0].new_zeros(self.grid), state) for state in empty)]  # ids where theirs are
        b = len(chunks)
        seg = chunks[0][0].shape[0] if chunks else 0
        if seg == self.grid and b not in self.batches:
            raise ValueError(f"a pass reads {list(self.batches)} sessions, got {b}")
        if seg != self.grid and (seg % self.grid or seg // self.grid not in self.usable_spans or b != 1):
            raise ValueError(f"a pass reads {self.grid} ids a session, or one session's span of "
                             f"{list(self.spans)} chunks; got {b} of {seg} ids")
        for ids, _ in chunks:
            if ids.shape[0] != seg:
                raise ValueError(f"a pass reads the same number of ids a session, got {ids.shape[0]} and {seg}")
        states = [state for _, state in chunks]
        if len({id(s) for s in states}) != b:
            raise ValueError("a session appears twice in one batch")
        # the piecewise path (no table reads) holds no slot copies of its own: its states move apart
        sources = self.slots.sources(states) if self.table_reads else []
        if not sources:
            for slot, state in enumerate(states):
                self.slots.copy(state, slot, into_slot=True)
        self._read_pass(chunks[0][0] if b == 1 else torch.cat([ids for ids, _ in chunks]), states, seg, sources)
        for slot, state in enumerate(states):
            if not sources:
                self.slots.copy(state, slot, into_slot=False)
            state.length += seg
        for state in empty:
            state.length = 0

    def fork(self, ids: list[int], state: ModelState) -> Fork:
        """Start a fork above the committed rows: the state's conv and recurrent tensors are not
        written; KV rows above ``state.length`` are scratch."""
        self.slots.copy(state, 0, into_slot=True)
        return Fork(self, state, state.length).extend(ids)

    # ---- warm-up -------------------------------------------------------------------------------

    def warm_up(self) -> float:
        """Choose the MLP's form per read row count, capture every row count's pieces (CUDA only),
        then check each batch size against its sessions read alone; returns the seconds it took."""
        if self.graphs.enabled and not self.graphs.captured:
            if self.fused_mlp:
                self.mlp_forms, self.mlp_choose_s = gate_up.choose(self.layers, self.cfg, self.model.dtype,
                                                                    self.read_row_counts())
            self.graphs.capture()
            self.graphs.check()
        return self.mlp_choose_s + self.graphs.capture_s + self.graphs.check_s

    def read_row_counts(self) -> list[int]:
        """Every row count a read's pass takes: each batch's, each span's."""
        return sorted({b * self.grid for b in self.batches} | {k * self.grid for k in self.spans})

    def report(self) -> dict[str, Any]:
        """What the fast path holds beside the sessions, shared by all of them, for this model's size."""
        cfg = self.cfg
        merged = sum(t.numel() * t.element_size() for lw in self.layers for t in (lw.w_in, lw.gate_up))
        return {
            "sizes": list(self.sizes), "attention": self.attention.name,
            "model": {"hidden_size": cfg.hidden_size, "layers": len(cfg.layer_types), "dtype": str(self.model.dtype)},
            # per read row count: "fused" (the MLP's GEMM and SiLU in one kernel) or why not
            "mlp": {str(n): why for n, why in self.mlp_forms.items()}, "mlp_choose_s": self.mlp_choose_s,
            "state_slots": self.slots.count, "state_slot_bytes": self.slots.slot_bytes(),
            "static_bytes": self.slots.nbytes() + self.staging.nbytes(), "merged_weight_bytes": merged,
            **self.graphs.report(),
        }
