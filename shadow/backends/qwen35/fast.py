"""The fast forward: merged projections, fused kernels and piecewise CUDA graphs.

Why piecewise graphs around attention (and not one graph per chunk): a chunk's shape never
changes (``grid`` rows), but its depth and its session do. Everything except attention depends on
the chunk alone, so it is captured once per row count and replayed for every session at every
depth. Attention runs eagerly between the pieces, over the session's own KV rows, which can
therefore grow in 8,192-row steps as before: no per-session reservation of a maximum length, no
paging. The engines do the same (vLLM's piecewise graphs). Passes of 16 rows or more (chunks,
questions) attend through our own kernel (``attention.py``: 4 query heads a KV head packed as
rows, keys split by a rule of the depth alone); fewer rows (decode) through torch's flash kernel.
Neither sizes anything from a buffer's capacity, which would change bits as the buffer grew.

Per-session state that the graphs touch lives in static buffers shared by every session: the
conv and recurrent state are copied in before a forward and, for a chunk that commits, copied
out after it (about 19 MB each way at 0.8B). KV rows are written by the eager step between the
pieces, straight into the session's own buffers. A fork (question, decode) copies in and never
out, so the committed state is untouched by construction. A pass's inputs (ids, the position of
row 0, the number of real rows) cross in one copy from pinned host memory into a static buffer
that the captured kernels read, so they change with no new capture and no fill launches.

Row counts: a chunk uses ``grid`` rows; a fork runs whole ``grid`` passes and then one padded
pass of the smallest captured size that holds the rest. Padding rows come after the real ones:
attention is causal, and the gate kernel gives them no decay and no write (``valid``), so they
change neither the real rows' outputs nor the state the next step continues.

Exactness: a chunk at any depth runs the same captured kernels with the same fixed
configurations, so reading a session over many turns gives the bits of a fresh prefill on the
same grid, on this path, in any process. Against the torch forward the fast path agrees within
bf16 rounding (its kernels round once where the torch forward rounds at every op).

Without CUDA (the tests) the same pieces run eagerly, the Triton kernels under Triton's
interpreter, and GDN through the torch form.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from . import attention, kernels
from .gdn import gated_delta_rule_chunked
from .model import Qwen35, _Full, _Linear
from .state import ModelState

# Fork pass sizes below the grid (the grid itself is one too): above 64 rows a question pads by at
# most a quarter.
FORK_SIZES = (1, 8, 32, 64, 128, 192, 256, 320, 384, 448)


@dataclass(frozen=True, slots=True)
class _GdnW:
    index: int  # among the GDN layers
    norm_in: torch.Tensor  # 1 + w, fp32
    norm_post: torch.Tensor
    w_in: torch.Tensor  # [qkv | z | b | a]
    conv: torch.Tensor  # [conv_dim, kernel]
    neg_a: torch.Tensor
    dt_bias: torch.Tensor
    norm: torch.Tensor
    out: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True, slots=True)
class _FullW:
    index: int  # among the full-attention layers
    norm_in: torch.Tensor
    norm_post: torch.Tensor
    w_in: torch.Tensor  # [q|gate per head, k, v]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


# Host staging slots per row count: the host may queue this many passes (a fork's decode) before it
# waits for the oldest one's inputs to have reached the device.
STAGING_SLOTS = 4


@dataclass(eq=False)
class _Rows:
    """One row count's static inputs, the tensors that cross from a piece to the eager attention
    and back, and (on CUDA) its captured graphs. The attributes a piece sets are the same tensors
    on every replay."""

    n: int
    # [ids (n) | start | valid]: a pass's inputs, one copy from the host. start is the position of
    # row 0; valid the number of real rows (those above are padding that leaves the state alone).
    io: torch.Tensor
    attn: torch.Tensor  # attention output, written eagerly, read by the next piece
    staging: list[torch.Tensor] = field(default_factory=list)  # pinned host copies of io, used in turn
    staged: list[Any] = field(default_factory=list)  # per slot: the event recorded after its last copy
    turn: int = 0
    h: torch.Tensor | None = None
    delta: torch.Tensor | None = None
    proj: torch.Tensor | None = None
    # q, k, v of each attention layer, kept apart: a captured piece writes its own tensors on every
    # replay, and the eager step after it must read those (not the last piece's), and they must
    # stay allocated so that no later capture reuses their memory
    qkv: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    logits: torch.Tensor | None = None
    # fla's solve buffer for this row count, zeroed once (see ``gdn_fla.chunk_rule_in_place``)
    solve: torch.Tensor | None = None
    graphs: list[Any] = field(default_factory=list)  # one per piece, then the logits graph

    @property
    def ids(self) -> torch.Tensor:
        return self.io[:self.n]

    @property
    def start(self) -> torch.Tensor:
        return self.io[self.n:self.n + 1]

    @property
    def valid(self) -> torch.Tensor:
        return self.io[self.n + 1:]

    def stage(self, ids: torch.Tensor, start: int, valid: int) -> None:
        """Queue the copy of a pass's inputs to ``io``: one copy from pinned memory (ids already on
        the device, a decode step's argmax, are copied there apart). A slot is written only once
        the device has taken its previous contents."""
        n = self.n
        if not self.staging:  # off CUDA: the copy is synchronous
            self.io[:n].copy_(ids)
            self.io[n] = start
            self.io[n + 1] = valid
            return
        slot = self.turn % len(self.staging)
        self.turn += 1
        self.staged[slot].synchronize()  # returns at once for an event never recorded
        host = self.staging[slot]
        view = host.numpy()
        view[n] = start
        view[n + 1] = valid
        if ids.is_cuda:
            self.io[:n].copy_(ids)
            self.io[n:].copy_(host[n:], non_blocking=True)
        else:
            view[:n] = ids.numpy()
            self.io.copy_(host, non_blocking=True)
        self.staged[slot].record()


def _stacked(views: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensor that ``views`` are consecutive slices of (``t.unbind(0)``), or None."""
    base = views[0]._base if views else None
    if base is None or not base.is_contiguous() or base.shape[0] != len(views):
        return None
    step = base.stride(0) * base.element_size()
    for i, v in enumerate(views):
        if v.data_ptr() != base.data_ptr() + i * step or v.shape != base.shape[1:]:
            return None
    return base


def _one_plus(w: torch.Tensor) -> torch.Tensor:
    return (1.0 + w.float()).contiguous()


class FastForward:
    """The fast forward of one model. One instance serves every session, one forward at a time."""

    def __init__(self, model: Qwen35, grid: int, graphs: bool | None = None) -> None:
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
        self.layers: list[_GdnW | _FullW] = []
        gdn_i = full_i = 0
        for layer in model.layers:
            common = dict(norm_in=_one_plus(layer.norm_in), norm_post=_one_plus(layer.norm_post),
                          gate_up=torch.cat((layer.gate, layer.up)).contiguous(), down=layer.down)
            if isinstance(layer, _Linear):
                self.layers.append(_GdnW(
                    index=gdn_i, w_in=torch.cat((layer.qkv, layer.z, layer.b, layer.a)).contiguous(),
                    conv=layer.conv[:, 0, :].contiguous(), neg_a=layer.neg_a.float().contiguous(),
                    dt_bias=layer.dt_bias, norm=layer.norm, out=layer.out, **common))
                gdn_i += 1
            else:
                assert isinstance(layer, _Full)
                self.layers.append(_FullW(
                    index=full_i, w_in=torch.cat((layer.q, layer.k, layer.v)).contiguous(),
                    q_norm=_one_plus(layer.q_norm), k_norm=_one_plus(layer.k_norm), o=layer.o, **common))
                full_i += 1
        self.final_norm = _one_plus(model.final_norm)
        self._share_weights()
        # pieces: layers up to and including the pre-attention part of full layer j
        self.segments: list[list[_GdnW | _FullW]] = [[]]
        for lw in self.layers:
            self.segments[-1].append(lw)
            if isinstance(lw, _FullW):
                self.segments.append([])
        self.n_attn = full_i
        # A chunk that commits needs no output: when the last layer is full attention, its KV rows
        # are all the state it leaves, so the read stops before its attention and MLP.
        self.read_stops_early = isinstance(self.layers[-1], _FullW)

        dev = self.device
        fresh = ModelState.empty(cfg, dev, model.dtype)  # stacked: one tensor per kind, one view per layer
        self.conv, self.rec = fresh.conv, fresh.recurrent
        conv_all, rec_all = _stacked(self.conv), _stacked(self.rec)
        assert conv_all is not None and rec_all is not None
        self.conv_all, self.rec_all = conv_all, rec_all
        self.rows: dict[int, _Rows] = {}
        self.pool: Any = None
        self.capture_s = 0.0
        self.capture_bytes = 0
        self._fla: Any = None
        if dev.type == "cuda":
            from . import gdn_fla

            if gdn_fla.available():
                self._fla = gdn_fla

    def _share_weights(self) -> None:
        """Point the torch forward's weights at slices of the merged ones, so the model holds one
        copy of each weight whichever path runs (slices of rows stay contiguous)."""
        cfg, model = self.cfg, self.model
        c, vd, hv = cfg.conv_dim, cfg.value_dim, cfg.linear_num_value_heads
        qn = cfg.num_attention_heads * 2 * cfg.head_dim
        kvn = cfg.num_key_value_heads * cfg.head_dim
        shared: list[_Linear | _Full] = []
        for layer, lw in zip(model.layers, self.layers, strict=True):
            inter = lw.down.shape[1]
            mlp = dict(gate=lw.gate_up[:inter], up=lw.gate_up[inter:])
            if isinstance(layer, _Linear):
                w = lw.w_in
                shared.append(replace(layer, qkv=w[:c], z=w[c:c + vd], b=w[c + vd:c + vd + hv],
                                      a=w[c + vd + hv:], **mlp))
            else:
                w = lw.w_in
                shared.append(replace(layer, q=w[:qn], k=w[qn:qn + kvn], v=w[qn + kvn:], **mlp))
        model.layers = shared

    # ---- sizes ---------------------------------------------------------------------------------

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(s for s in FORK_SIZES if s < self.grid) + (self.grid,)

    def _size_for(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def _chunked(self, n: int) -> bool:
        """Whether ``n`` rows take fla's chunked kernels (else its recurrent step, or without fla
        the torch form): a decode step's few rows cost more in the chunked form's launches."""
        return self._fla is not None and n >= 16

    def _rows_for(self, n: int) -> _Rows:
        rows = self.rows.get(n)
        if rows is None:
            cfg = self.cfg
            rows = _Rows(n=n, io=torch.zeros(n + 2, dtype=torch.long, device=self.device),
                         attn=torch.zeros(n, cfg.num_attention_heads, cfg.head_dim, device=self.device,
                                          dtype=self.model.dtype))
            if self.device.type == "cuda":
                rows.staging = [torch.empty(n + 2, dtype=torch.long, pin_memory=True) for _ in range(STAGING_SLOTS)]
                rows.staged = [torch.cuda.Event() for _ in range(STAGING_SLOTS)]  # type: ignore[no-untyped-call]
            if self._chunked(n):
                rows.solve = torch.zeros(1, n, cfg.linear_num_value_heads, kernels.FLA_CHUNK, device=self.device,
                                         dtype=self.model.dtype)
            self.rows[n] = rows
        return rows

    # ---- the pieces ----------------------------------------------------------------------------

    def _norm(self, r: _Rows, w: torch.Tensor) -> torch.Tensor:
        """``rmsnorm(h + delta)``, with the pending delta added into the stream in place."""
        assert r.h is not None
        x = torch.empty_like(r.h)
        kernels.rms_norm(r.h, w, self.eps, x, add=r.delta)
        r.delta = None
        return x

    def _mlp(self, r: _Rows, lw: _GdnW | _FullW) -> None:
        x = self._norm(r, lw.norm_post)
        gu = F.linear(x, lw.gate_up)
        act = torch.empty(r.n, lw.down.shape[1], device=x.device, dtype=x.dtype)
        kernels.silu_mul(gu, act)
        r.delta = F.linear(act, lw.down)

    def _gdn(self, r: _Rows, lw: _GdnW) -> None:
        cfg, n = self.cfg, r.n
        x = self._norm(r, lw.norm_in)
        proj = F.linear(x, lw.w_in)  # [n, conv_dim + value_dim + 2 value heads]
        kd, vd, hv = cfg.key_dim, cfg.value_dim, cfg.linear_num_value_heads
        mixed = torch.empty(n * cfg.conv_dim, device=x.device, dtype=x.dtype)
        kernels.conv_silu(proj, self.conv[lw.index], lw.conv, kd, cfg.linear_key_head_dim, r.valid, mixed)
        q = mixed[:n * kd].view(n, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        k = mixed[n * kd:2 * n * kd].view(n, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        v = mixed[2 * n * kd:].view(n, hv, cfg.linear_value_head_dim)
        g = torch.empty(n, hv, device=x.device, dtype=torch.float32)
        beta = torch.empty(n, hv, device=x.device, dtype=x.dtype)
        z_off = cfg.conv_dim
        chunked = self._chunked(n)
        kernels.gates(proj, z_off + vd, z_off + vd + hv, lw.neg_a, lw.dt_bias, r.valid, g, beta,
                      chunk_sums=chunked)
        state = self.rec[lw.index]
        if chunked:
            assert r.solve is not None
            o = self._fla.chunk_rule_in_place(q, k, v, g, beta, state, r.solve)
        else:
            if self._fla is None:
                o, new = gated_delta_rule_chunked(q, k, v, g, beta, state, normalized=True)
            else:
                o, new = self._fla.recurrent_step(q, k, v, g, beta, state, normalized=True)
            state.copy_(new)
        y = torch.empty(n, vd, device=x.device, dtype=x.dtype)
        kernels.gated_norm(o.contiguous(), proj, z_off, lw.norm, self.eps, y)
        r.delta = F.linear(y, lw.out)
        self._mlp(r, lw)

    def _piece(self, r: _Rows, j: int) -> None:
        """Piece ``j``: close full-attention layer ``j-1`` (if any), run the GDN layers up to full layer
        ``j``, and prepare its q, k, v (if any)."""
        cfg = self.cfg
        if j == 0:
            r.h = F.embedding(r.ids, self.model.embed)
            r.delta = None
        else:
            lw = self.segments[j - 1][-1]
            assert isinstance(lw, _FullW) and r.proj is not None
            gated = torch.empty_like(r.attn)
            kernels.output_gate(r.attn, r.proj, gated)
            r.delta = F.linear(gated.view(r.n, -1), lw.o)
            self._mlp(r, lw)
        for lw in self.segments[j]:
            if isinstance(lw, _GdnW):
                self._gdn(r, lw)
                continue
            x = self._norm(r, lw.norm_in)
            r.proj = F.linear(x, lw.w_in)
            kvh, hd = cfg.num_key_value_heads, cfg.head_dim
            q = torch.empty(r.n, cfg.num_attention_heads, hd, device=x.device, dtype=x.dtype)
            k = torch.empty(r.n, kvh, hd, device=x.device, dtype=x.dtype)
            v = torch.empty(r.n, kvh, hd, device=x.device, dtype=x.dtype)
            kernels.qk_norm_rope(r.proj, lw.q_norm, lw.k_norm, self.model._inv_freq, r.start, self.eps, q, k, v)
            r.qkv[lw.index] = (q, k, v)

    def _logits(self, r: _Rows) -> None:
        assert r.h is not None and r.delta is not None
        last = r.valid - 1
        h = r.h.index_select(0, last)
        x = torch.empty_like(h)
        kernels.rms_norm(h, self.final_norm, self.eps, x, add=r.delta.index_select(0, last))
        r.logits = F.linear(x, self.model.lm_head).float()[0]

    def _run(self, r: _Rows, j: int) -> None:
        if r.graphs:
            r.graphs[j].replay()
        elif j < len(self.segments):
            self._piece(r, j)
        else:
            self._logits(r)

    def _attend(self, r: _Rows, state: ModelState, i: int, start: int, compute: bool) -> None:
        """Eager, between two pieces: write the rows' K and V into the session, attend over its rows."""
        q, k, v = r.qkv[i]
        end = start + r.n
        state.k[i][start:end].copy_(k)
        state.v[i][start:end].copy_(v)
        if not compute:
            return
        cfg = self.cfg
        if attention.fits(r.n, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim):
            attention.attend(q, state.k[i], state.v[i], start, r.attn)
            return
        keys = state.k[i][:end].permute(1, 0, 2)[None]
        values = state.v[i][:end].permute(1, 0, 2)[None]
        if self.model.attention == "lower-right":
            mask: Any = causal_lower_right(r.n, end)
        else:
            keys_at = torch.arange(end, device=self.device)
            mask = keys_at[None, :] <= torch.arange(start, end, device=self.device)[:, None]
        out = F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], keys, values, attn_mask=mask,
                                             scale=self.cfg.head_dim ** -0.5, enable_gqa=True)
        r.attn.copy_(out[0].permute(1, 0, 2))

    def _pass(self, ids: torch.Tensor, state: ModelState, real: int, logits: bool) -> torch.Tensor | None:
        """One forward of ``ids`` (a captured row count, the first ``real`` of them real) at
        ``state.length``, on the static conv and recurrent buffers. Returns logits of the last real
        row if asked."""
        r = self._rows_for(ids.shape[0])
        start = state.length
        state.reserve(start + r.n)
        r.stage(ids, start, real)
        stop_early = not logits and self.read_stops_early
        for j in range(self.n_attn):
            self._run(r, j)
            self._attend(r, state, j, start, compute=not (stop_early and j == self.n_attn - 1))
        if stop_early:
            return None
        self._run(r, self.n_attn)
        if not logits:
            return None
        self._run(r, self.n_attn + 1)
        assert r.logits is not None
        return r.logits

    # ---- what the reader calls -------------------------------------------------------------

    def read_chunk(self, ids: torch.Tensor, state: ModelState) -> None:
        """Commit ``grid`` ids: the state moves on, exactly as a fresh prefill's chunk would."""
        if ids.shape[0] != self.grid:
            raise ValueError(f"a chunk is {self.grid} ids, got {ids.shape[0]}")
        self._copy_in(state)
        self._pass(ids, state, self.grid, logits=False)
        conv, rec = _stacked(state.conv), _stacked(state.recurrent)
        if conv is not None and rec is not None:
            conv.copy_(self.conv_all)
            rec.copy_(self.rec_all)
        else:
            torch._foreach_copy_(state.conv + state.recurrent, self.conv + self.rec)
        state.length += self.grid

    def _copy_in(self, state: ModelState) -> None:
        """The session's conv and recurrent state into the static buffers: two copies when the
        session's are stacked too (every state ``ModelState.empty`` makes), else one per layer."""
        conv, rec = _stacked(state.conv), _stacked(state.recurrent)
        if conv is not None and rec is not None:
            self.conv_all.copy_(conv)
            self.rec_all.copy_(rec)
        else:
            torch._foreach_copy_(self.conv + self.rec, state.conv + state.recurrent)

    def fork(self, ids: list[int], state: ModelState) -> _Fork:
        """Start a fork above the committed rows: the state's conv and recurrent tensors are not
        written; KV rows above ``state.length`` are scratch."""
        self._copy_in(state)
        return _Fork(self, state, state.length).extend(ids)

    # ---- capture -------------------------------------------------------------------------------

    def warm_up(self) -> float:
        """Capture every row count's pieces (CUDA only); returns the seconds it took."""
        if not self.use_graphs or self.pool is not None:
            return self.capture_s
        t0 = time.perf_counter()
        # Python's collector must not run during a capture: freeing another instance's graphs or
        # events is a CUDA call that a capture forbids (it invalidates the capture). Collect first.
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        try:
            # Capture empties the allocator's cache on entry: empty it first, so that the difference
            # below is what the capture added, not what it freed.
            torch.cuda.empty_cache()
            reserved_before = torch.cuda.memory_reserved(self.device)
            self.pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
            stream.wait_stream(torch.cuda.current_stream(self.device))
            # largest first, so the smaller ones fit in what it leaves (the pool is shared)
            for n in sorted(self.sizes, reverse=True):
                r = self._rows_for(n)
                r.valid.fill_(1)  # the capture's runs write scratch rows only
                with torch.cuda.stream(stream):  # compile every kernel and settle the allocator first
                    for j in range(self.n_attn + 2):
                        self._run(r, j)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graphs = []
                for j in range(self.n_attn + 2):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=self.pool, stream=stream):
                        self._run(r, j)
                    graphs.append(g)
                r.graphs = graphs
        finally:
            if collecting:
                gc.enable()
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        self.capture_bytes = torch.cuda.memory_reserved(self.device) - reserved_before
        return self.capture_s

    def report(self) -> dict[str, Any]:
        """What the fast path holds beside the sessions, shared by all of them."""
        static = sum(t.numel() * t.element_size() for t in (*self.conv, *self.rec))
        static += sum(r.io.numel() * 8 + r.attn.numel() * r.attn.element_size() for r in self.rows.values())
        merged = sum(t.numel() * t.element_size() for lw in self.layers
                     for t in (lw.w_in, lw.gate_up))
        out: dict[str, Any] = {"graphs": self.use_graphs, "sizes": list(self.sizes), "capture_s": self.capture_s,
                               "static_bytes": static, "merged_weight_bytes": merged}
        if self.use_graphs and self.pool is not None:
            # what the capture added to the allocator's reservation: the graphs' pool and work buffers
            out["capture_reserved_bytes"] = self.capture_bytes
            # everything the allocator holds after capture (the weights included)
            out["allocator_reserved_bytes"] = torch.cuda.memory_reserved(self.device)
        return out


class _Fork:
    """A fork in progress: ids are pushed through whole-grid passes and one padded pass."""

    def __init__(self, fast: FastForward, state: ModelState, committed: int) -> None:
        self.fast = fast
        self.state = state
        self.committed = committed
        self.logits: torch.Tensor | None = None

    def extend(self, ids: list[int]) -> _Fork:
        fast, state = self.fast, self.state
        pos = 0
        while pos < len(ids):
            take = min(fast.grid, len(ids) - pos)
            size = fast._size_for(take)
            piece = ids[pos:pos + take] + [0] * (size - take)  # padding: any valid id, masked out
            batch = torch.tensor(piece, dtype=torch.long)
            self.logits = fast._pass(batch, state, take, logits=pos + take == len(ids))
            state.length += take
            pos += take
        return self

    def decode(self, max_new: int, stop: set[int], look_every: int = 16) -> list[int]:
        """Greedy decoding from the fork's logits. Each token's argmax feeds the next pass on the
        device, with no trip to the host in between, so the host queues passes while the GPU runs
        them; the host reads the tokens every ``look_every`` and cuts at the first stop id (the
        passes queued after it only wrote scratch rows above the committed ones)."""
        fast, state = self.fast, self.state
        out: list[int] = []
        queued: list[torch.Tensor] = []
        while self.logits is not None:
            queued.append(self.logits.argmax().view(1))
            if len(out) + len(queued) == max_new or len(queued) == look_every:
                for token in torch.cat(queued).tolist():
                    out.append(token)
                    if token in stop:
                        return out
                queued.clear()
                if len(out) == max_new:
                    return out
            self.logits = fast._pass(queued[-1] if queued else torch.tensor([out[-1]]), state, 1, logits=True)
            state.length += 1
        return out

    def close(self) -> None:
        self.state.truncate(self.committed)
