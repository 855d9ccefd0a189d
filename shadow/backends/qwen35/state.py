"""What a Qwen3.5 forward carries from one call to the next, for one sequence.

- KV rows of each full-attention layer: ``k[i]``, ``v[i]`` of shape [capacity, kv_heads, head_dim],
  rows first, so a slice ``[:n]`` has the same strides whatever the capacity: the rows below ``n``
  are read by the same kernels with the same layout however large the buffer has grown. The
  capacity grows in steps of ``KV_STEP`` rows; growth copies the held rows once per step, never
  per chunk.
- conv state of each GDN layer: the last ``kernel`` pre-conv inputs, [conv_dim, kernel], model dtype.
- recurrent state of each GDN layer: [value_heads, key_dim, value_dim], fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from .config import Qwen35Config

KV_STEP = 8192

T = TypeVar("T")


@dataclass
class ModelState:
    cfg: Qwen35Config
    device: torch.device
    dtype: torch.dtype
    length: int = 0  # positions consumed; the next token sits at position ``length``
    k: list[torch.Tensor] = field(default_factory=list)
    v: list[torch.Tensor] = field(default_factory=list)
    conv: list[torch.Tensor] = field(default_factory=list)
    recurrent: list[torch.Tensor] = field(default_factory=list)
    # What the fast path derives from these tensors (their stacked bases, their addresses checked),
    # with the tensors it was derived from: valid while each is still the same object (``memo``).
    derived: dict[str, tuple[tuple[torch.Tensor, ...], tuple[int, ...], Any]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def memo(self, key: str, tensors: Sequence[torch.Tensor], derive: Callable[[], T]) -> T:
        """``derive()``, computed again only when some tensor of ``tensors`` was replaced since (a
        buffer grown, a list rebuilt): a read's pass asks per session what would otherwise cost the
        host tens of microseconds a pass. The memo holds the tensors, so none of their ids is reused
        while it lives; it goes with the state."""
        ids = tuple(map(id, tensors))  # compared in C: a Python loop over 18 layers cost more than the memo saved
        hit = self.derived.get(key)
        if hit is not None and hit[1] == ids:
            value: T = hit[2]
            return value
        value = derive()
        self.derived[key] = (tuple(tensors), ids, value)
        return value

    @classmethod
    def empty(cls, cfg: Qwen35Config, device: torch.device | str, dtype: torch.dtype) -> ModelState:
        device = torch.device(device)
        s = cls(cfg, device, dtype)
        for _ in cfg.full_layers:
            s.k.append(torch.empty(0, cfg.num_key_value_heads, cfg.head_dim, device=device, dtype=dtype))
            s.v.append(torch.empty(0, cfg.num_key_value_heads, cfg.head_dim, device=device, dtype=dtype))
        # One tensor per kind, a view per layer: the fast path moves a session's state in and out
        # of its static buffers in one copy each.
        layers = len(cfg.linear_layers)
        s.conv = list(torch.zeros(layers, cfg.conv_dim, cfg.linear_conv_kernel_dim, device=device,
                                  dtype=dtype).unbind(0))
        s.recurrent = list(torch.zeros(layers, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                       cfg.linear_value_head_dim, device=device, dtype=torch.float32).unbind(0))
        return s

    @property
    def capacity(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` KV rows, growing in whole steps of KV_STEP."""
        if rows <= self.capacity:
            return
        new_cap = -(-rows // KV_STEP) * KV_STEP
        held = self.length
        self.derived.clear()  # the memo holds the old buffers: they must go when these do
        for buffers in (self.k, self.v):
            for i, old in enumerate(buffers):
                grown = torch.empty(new_cap, *old.shape[1:], device=old.device, dtype=old.dtype)
                grown[:held].copy_(old[:held])
                buffers[i] = grown

    def truncate(self, rows: int) -> None:
        """Forget positions at and above ``rows`` (their KV rows become scratch)."""
        if rows > self.length:
            raise ValueError(f"cannot truncate to {rows} rows: only {self.length} held")
        self.length = rows

    def save_recurrent(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of the conv and recurrent state (what a fork must put back)."""
        return [c.clone() for c in self.conv], [r.clone() for r in self.recurrent]

    def load_recurrent(self, saved: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        conv, rec = saved
        for dst, src in zip(self.conv, conv, strict=True):
            dst.copy_(src)
        for dst, src in zip(self.recurrent, rec, strict=True):
            dst.copy_(src)

    def nbytes(self) -> int:
        """Bytes held on the device, KV capacity included."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v, *self.conv, *self.recurrent))
