"""A fork above a session's committed rows (a question, a narrator's decode) on the fast path: its
ids go through whole-grid passes and one padded pass of the smallest captured size that holds the
rest, on the static conv and recurrent buffers (slot 0), so the session's own conv and recurrent
tensors are never written; its KV rows above the committed ones are scratch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import piecewise
from .state import ModelState

if TYPE_CHECKING:
    from .fast import FastForward


class Fork:
    """A fork in progress: ids are pushed through whole-grid passes and one padded pass."""

    def __init__(self, fast: FastForward, state: ModelState, committed: int) -> None:
        self.fast = fast
        self.state = state
        self.committed = committed
        self.logits: torch.Tensor | None = None

    def extend(self, ids: list[int]) -> Fork:
        fast, state = self.fast, self.state
        pos = 0
        while pos < len(ids):
            take = min(fast.grid, len(ids) - pos)
            size = fast._size_for(take)
            piece = ids[pos:pos + take] + [0] * (size - take)  # padding: any valid id, masked out
            batch = torch.tensor(piece, dtype=torch.long)
            self.logits = piecewise.run(fast, batch, [state], take, logits=pos + take == len(ids))
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
            step = queued[-1] if queued else torch.tensor([out[-1]])
            self.logits = piecewise.run(fast, step, [state], 1, logits=True)
            state.length += 1
        return out

    def close(self) -> None:
        self.state.truncate(self.committed)
