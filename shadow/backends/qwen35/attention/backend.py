"""What every chunk attention backend is: a name (the ``ATTENTION`` setting's value), a priority
(``auto`` takes the highest that is available), ``available()``, and a self-check against the naive
reference (``naive.py``).

A backend decides a session's bits: its kernel, and the split rule's unit that follows the kernel
(``block_rows``), which a read's table carries. So a process resolves one backend once, before its
first read (the container does), and every pass of that process goes through it; the status names
it (``attention``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from . import naive


class AttentionCheckFailed(RuntimeError):
    """A backend's self-check found it wrong on this device."""


# The self-check's chunk: the 0.8B's attention (8 query heads, 2 KV heads, head dim 256, bf16) on the
# GPU; off it (Triton's interpreter) a small fp32 one, with the interpreter's small tiles. Its two
# depths: the first chunk, and one deep enough that the keys split.
CHECK_SHAPES = {"cuda": (512, 8, 2, 256, torch.bfloat16, (0, 4096), 2e-2),
                "cpu": (16, 4, 2, 32, torch.float32, (0, 200), 1e-5)}


class AttentionBackend(ABC):
    """Chunk attention for the fast path: ``attend`` (one chunk's call), ``attend_table`` (every
    entry of a table in one launch, as a captured pass runs it) and the split rule's unit."""

    name: ClassVar[str]
    priority: ClassVar[int]  # ``auto`` takes the available backend with the highest

    @classmethod
    @abstractmethod
    def why_unavailable(cls, device: torch.device) -> str:
        """Why this backend cannot run on ``device`` ("" where it can)."""

    @classmethod
    def available(cls, device: torch.device) -> bool:
        return not cls.why_unavailable(device)

    @abstractmethod
    def fits(self, n: int, heads: int, kv_heads: int, head_dim: int) -> bool:
        """Whether this backend serves a pass of ``n`` rows at this shape (else torch's flash kernel)."""

    @abstractmethod
    def block_rows(self, device_type: str, dtype: torch.dtype, head_dim: int) -> int:
        """The packed query rows of one program of the kernel that reads chunks of this kind: the
        split rule's unit. A table's rows and the launch that reads them must agree on it."""

    @abstractmethod
    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor) -> Any:
        """``out[t, h] = softmax(q[t, h] . keys[:start + t + 1, h // G]) . values`` for ``q`` of shape
        ``[n, H, D]`` and ``keys``/``values`` of shape ``[>= start + n, KV, D]`` (rows past ``start +
        n`` are not read). Returns the launched kernel."""

    @abstractmethod
    def attend_table(self, q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor) -> None:
        """``attend`` for every entry of ``table`` (``[E, table.FIELDS]`` on ``q``'s device) in one
        launch, each entry's bits those of its own ``attend`` call. ``like``: any tensor of the KV
        rows' dtype and ``[.., KV, D]`` contiguous layout."""

    @abstractmethod
    def table_row(self, start: int, n: int, heads: int, keys: torch.Tensor, values: torch.Tensor) -> list[int]:
        """A table entry: a chunk of ``n`` rows at ``start`` over ``keys``/``values``, with the split
        rule ``attend`` applies at that depth."""

    def self_check(self, device: torch.device) -> None:
        """Raise ``AttentionCheckFailed`` unless, on a chunk of ``CHECK_SHAPES`` at each of its depths,
        ``attend`` agrees with the naive reference within the dtype's rounding, repeats its bits, and a
        table launch of both chunks gives each the bits of its own ``attend`` call."""
        n, heads, kv, d, dtype, starts, tol = CHECK_SHAPES[device.type]
        gen = torch.Generator().manual_seed(54)
        q = torch.randn(len(starts) * n, heads, d, generator=gen).to(dtype).to(device)
        kvs = [tuple(torch.randn(start + n, kv, d, generator=gen).to(dtype).to(device) for _ in "kv")
               for start in starts]
        alone = torch.empty_like(q)
        for e, (start, (k, v)) in enumerate(zip(starts, kvs, strict=True)):
            rows = slice(e * n, (e + 1) * n)
            self.attend(q[rows], k, v, start, alone[rows])
            again = torch.empty_like(alone[rows])
            self.attend(q[rows], k, v, start, again)
            err = (alone[rows].float() - naive.attend(q[rows], k, v, start)).abs().max().item()
            if not err <= tol:
                raise AttentionCheckFailed(f"{self.name}: a chunk at {start} is {err:.3g} off the reference")
            if not torch.equal(alone[rows], again):
                raise AttentionCheckFailed(f"{self.name}: a chunk at {start} gave other bits when called again")
        table = torch.tensor([self.table_row(start, n, heads, k, v) for start, (k, v) in zip(starts, kvs, strict=True)],
                             device=device)
        together = torch.empty_like(q)
        self.attend_table(q, table, kvs[0][0], together)
        if not torch.equal(together, alone):
            raise AttentionCheckFailed(f"{self.name}: a table launch gave other bits than each chunk's own call")
