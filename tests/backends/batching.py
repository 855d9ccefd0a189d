"""Helpers for the batched-read tests (CPU and GPU): sessions driven turn by turn as the facade drives
them, deep copies of a session, and the check that a batch reads each session as it reads alone."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from shadow.backends.qwen35.fast.graphs import clone_state
from shadow.backends.reader import SessionTensors, TorchReader
from shadow.core.session import SessionBook


@dataclass
class Followed:
    """One session as the facade holds it: its book and its tensors."""

    book: SessionBook
    tensors: SessionTensors

    @classmethod
    def new(cls, reader: TorchReader) -> Followed:
        return cls(SessionBook(grid=reader.grid), reader.new_session())

    def feed_prompt(self, reader: TorchReader, prompt: list[int]) -> bool:
        """The facade's feed_prompt: returns whether it rolled the state back."""
        rollback = self.book.feed_prompt(prompt)
        if rollback is not None:
            reader.roll_back(self.tensors, rollback.resume_at)
        reader.checkpoint_if_due(self.book, self.tensors)
        return rollback is not None

    def copy(self) -> Followed:
        checkpoints = {pos: ([c.clone() for c in conv], [r.clone() for r in rec])
                       for pos, (conv, rec) in self.tensors.checkpoints.items()}
        return Followed(copy.deepcopy(self.book), SessionTensors(clone_state(self.tensors.state), checkpoints))


def assert_same(reader: TorchReader, got: Followed, want: Followed, what: str) -> None:
    assert got.book.committed == want.book.committed, what
    assert got.book.checkpoints == want.book.checkpoints, what
    a, b = reader.export(got.tensors), reader.export(want.tensors)
    assert a.keys() == b.keys()
    for name in b:
        assert torch.equal(a[name], b[name]), f"{what}: {name} differs"
    assert got.tensors.checkpoints.keys() == want.tensors.checkpoints.keys(), what
    for pos, (conv, rec) in want.tensors.checkpoints.items():
        held = got.tensors.checkpoints[pos]
        for x, y in zip(held[0] + held[1], conv + rec, strict=True):
            assert torch.equal(x, y), f"{what}: checkpoint at {pos} differs"


def read_batch_and_compare(reader: TorchReader, batch: list[Followed], what: str) -> None:
    """Read the next chunk of every session in one ``read_chunks`` call and, on copies, each alone
    with ``read_chunk``: every tensor (and checkpoint) must be equal."""
    alone = [s.copy() for s in batch]
    for s in alone:
        reader.read_chunk(s.book, s.tensors)
    reader.read_chunks([(s.book, s.tensors) for s in batch])
    for i, (got, want) in enumerate(zip(batch, alone, strict=True)):
        depth = want.book.committed - reader.grid
        assert_same(reader, got, want, f"{what}: session {i} of {len(batch)} (depth {depth})")
