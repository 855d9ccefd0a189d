"""The static slots a pass computes on: each session's conv and recurrent state moved in before a
read's pass and back after it, or into slot 0 for a fork (never back: a fork leaves the committed
state untouched by construction).

A state ``ModelState.empty`` makes is stacked (one tensor a kind, a view per layer), and a read of B
such sessions moves them with one launch a kind each way (``kernels.copy_slots``), the addresses
staged with the pass's inputs (``Rows.slot_sources``), inside the read's captured graph: no launch
of the host's. A per-session ``copy_`` into the strided slot ran at half the bandwidth
(``benchmarks/probes/pass_levers.py``: 8 sessions of the 0.8B, 172 us each way against 89), and
the copies launched apart cost the host more than they saved at one session
(``benchmarks/probes/slots_ab.py``). A state that is not stacked moves by ``copy``, a layer at a
time, around the pass, whose own copies then find no address staged and leave the slots alone.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from .. import kernels
from ..config import Qwen35Config
from ..state import ModelState
from .staging import Rows, stacked


class StateSlots:
    """The conv and recurrent state of ``count`` sessions a pass computes on (``[layer, slot, ...]``:
    a layer's slots are contiguous, fla's batch axis), and the placeholder states of a batch's empty
    slots."""

    def __init__(self, cfg: Qwen35Config, count: int, grid: int, device: torch.device, dtype: torch.dtype) -> None:
        layers = len(cfg.linear_layers)
        self.cfg, self.count, self.grid, self.device, self.dtype = cfg, count, grid, device, dtype
        self.conv = torch.zeros(layers, count, cfg.conv_dim, cfg.linear_conv_kernel_dim, device=device, dtype=dtype)
        self.recurrent = torch.zeros(layers, count, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                     cfg.linear_value_head_dim, device=device, dtype=torch.float32)
        self.placeholders: list[ModelState] = []  # a batch's empty slots (``placeholders``)

    def sources(self, states: Sequence[ModelState]) -> list[int]:
        """The addresses of the states' stacked conv tensors, then of their recurrent ones; empty when
        any state is not stacked as the slots want it (then each moves by ``copy``)."""
        convs = [s.memo("conv", s.conv, functools.partial(stacked, s.conv)) for s in states]
        recs = [s.memo("recurrent", s.recurrent, functools.partial(stacked, s.recurrent)) for s in states]
        for bases, static in ((convs, self.conv), (recs, self.recurrent)):
            want = static.shape[:1] + static.shape[2:]  # a slot's shape
            for base in bases:
                if base is None or base.dtype != static.dtype or base.shape != want:
                    return []
        return [t.data_ptr() for t in convs + recs if t is not None]

    def move(self, r: Rows, into: bool) -> None:
        """The sessions whose addresses pass ``r`` staged into slots 0.. (or back): one launch a kind."""
        kernels.copy_slots(self.conv, r.slot_sources[0], into)
        kernels.copy_slots(self.recurrent, r.slot_sources[1], into)

    def copy(self, state: ModelState, slot: int, into_slot: bool) -> None:
        """A session's conv and recurrent state into slot ``slot`` or back: two copies when stacked,
        else one per layer."""
        conv, rec = stacked(state.conv), stacked(state.recurrent)
        if conv is not None and rec is not None:
            pairs = [(self.conv[:, slot], conv), (self.recurrent[:, slot], rec)]
        else:
            pairs = [(self.conv[i, slot], t) for i, t in enumerate(state.conv)]
            pairs += [(self.recurrent[i, slot], t) for i, t in enumerate(state.recurrent)]
        for static, own in pairs:
            (static if into_slot else own).copy_(own if into_slot else static)

    def empty(self, count: int) -> list[ModelState]:
        """``count`` states for a batch's empty slots (3 sessions in the graph of 4, where the warm-up
        check refused 3), each with KV rows for one chunk, at length 0, read on from whatever it holds
        (its ids zeros). Each session of a batch gets its own bits whatever the others are
        (``graphs``), so what they compute is nobody's and changes no one's; the caller puts their
        length back to 0. Made once, kept."""
        held, cfg = self.placeholders, self.cfg
        while len(held) < count:
            state = ModelState.empty(cfg, self.device, self.dtype)
            shape = (self.grid, cfg.num_key_value_heads, cfg.head_dim)
            state.k = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in state.k]
            state.v = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in state.v]
            held.append(state)
        return held[:count]

    def slot_bytes(self) -> int:
        """One slot's bytes (every layer's conv and recurrent state of one session)."""
        return sum(t[:, 0].numel() * t.element_size() for t in (self.conv, self.recurrent))

    def nbytes(self) -> int:
        """Every slot's bytes, and the placeholders' once a batch read one."""
        own = sum(t.numel() * t.element_size() for t in (self.conv, self.recurrent))
        return own + sum(s.nbytes() for s in self.placeholders)
