"""The arithmetic's fingerprint: which bits this process's reader makes, as one SHA-256.

A session's state is exact where it is a fresh prefill's bits *on the reader that holds it*. Those
bits follow the arithmetic, not only the weights: which attention kernel runs (its split rule
changes the order of the sums with depth), the fast path or the torch forward, cuBLAS' choice of
algorithm by GPU model and SM count, and the versions of torch, CUDA, Triton and fla. A park made
under other arithmetic equals neither a fresh prefill there nor here, so a park carries the
fingerprint of the reader that made it, and a restore under another fingerprint is refused (the
session is read again from its ids).

The fingerprint is the SHA-256 of a fresh prefill of a fixed id sequence (every tensor the state
holds: name, dtype, shape, bytes), then of a question's fp32 logits on top of it. The sequence is
``CHUNKS`` whole chunks, so that the attention's depth crosses the split rule's changes: its split
count grows by one every ``MIN_SPLIT`` keys (1,024 on the GPU, 64 under the CPU tests' Triton
interpreter) until the splits fill the device, and the merge runs from two splits on. On the grid
of 512, eight chunks reach 4,096 keys: every split count the rule gives a 512-row chunk of the
shipped shapes, on either kernel's tiles (the 0.8B and 2B: up to 4 with the Gluon kernels' 128-row
programs, 2 with Triton's 64; the 4B: 2); on the CPU tests' grid of 64 they reach eight splits.
Then a tail of half a chunk that the question's fork covers with ``QUESTION`` ids of its own (more
than the 16 rows from which the fork attends with the kernel, not torch's). Its cost is that of
eight chunks and one question, once.

The ids come from SHA-256 in counter mode, below the vocabulary: fixed for a model, no file to
ship. It is computed once per reader, on first need (``TorchReader.fingerprint``): at warm-up, and
in any case before a park is written or restored.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import TYPE_CHECKING

import torch

from shadow.core.session import SessionBook

if TYPE_CHECKING:
    from .reader import TorchReader

CHUNKS = 8  # whole chunks read (see the module docstring)
QUESTION = 24  # a question's own ids after the half-chunk tail
SEED = b"qwen38-shadow-fingerprint-1"


def sequence(n: int, vocab_size: int, seed: bytes = SEED) -> list[int]:
    """``n`` fixed ids below ``vocab_size``: SHA-256 of the seed and a counter, 4 bytes an id."""
    out: list[int] = []
    block = 0
    while len(out) < n:
        digest = hashlib.sha256(seed + block.to_bytes(8, "little")).digest()
        out.extend(int.from_bytes(digest[i:i + 4], "little") % vocab_size for i in range(0, 32, 4))
        block += 1
    return out[:n]


def _update(h: hashlib._Hash, name: str, t: torch.Tensor) -> None:
    t = t.detach().to("cpu").contiguous()
    h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
    h.update(t.view(-1).view(torch.uint8).numpy().data)


def fingerprint(reader: TorchReader) -> str:
    """The reader's fingerprint (see the module docstring): a fresh prefill through its public
    methods, on a session of its own that is dropped after."""
    grid = reader.grid
    ids = sequence(CHUNKS * grid + grid // 2 + QUESTION, reader.vocab_size)
    book = SessionBook(grid=grid, ids=array("i", ids[:CHUNKS * grid + grid // 2]))
    tensors = reader.new_session()
    while book.pending >= grid:
        reader.read_chunk(book, tensors)
    h = hashlib.sha256()
    for name, t in sorted(reader.export(tensors).items()):
        _update(h, name, t)
    _update(h, "question", reader.fork_logits(book, tensors, ids[len(book.ids):]))
    return h.hexdigest()
