"""A fork above a session's committed rows (a question, a narrator's decode) on the fast path: its
ids go through whole-grid passes and one padded pass of the smallest captured size that holds the
rest, on the static conv and recurrent buffers (slot 0), so the session's own conv and recurrent
tensors are never written; its KV rows above the committed ones are scratch.

Where a read's attention comes from a table (``FastForward.whole_forks``), a fork's pass does too:
its layers are one captured graph and its logits another, with a one-entry table staged per pass
(the fork's start, its split rule and the session's KV addresses), where the piecewise form ran six
eager attention calls between seven graphs (both forms measured: benchmarks/README.md, the forks'
section). From 16 rows the table's kernel gives
``attend``'s bits, so a question's logits are the piecewise form's; a decode step's one row, which
piecewise takes torch's flash kernel, takes ours too (its split rule a function of the depth alone,
as everywhere).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..state import ModelState


class ForkPasses(Protocol):
    """What a fork runs on: the forward's grid, its pass sizes and one fork pass (``FastForward``)."""

    grid: int

    def size_for(self, n: int) -> int: ...

    def fork_pass(self, ids: torch.Tensor, state: ModelState, real: int, logits: bool) -> torch.Tensor | None: ...


class Fork:
    """A fork in progress: ids are pushed through whole-grid passes and one padded pass."""

    def __init__(self, passes: ForkPasses, state: ModelState, committed: int) -> None:
        self.passes = passes
        self.state = state
        self.committed = committed
        self.logits: torch.Tensor | None = None

    def extend(self, ids: list[int]) -> Fork:
        passes, state = self.passes, self.state
        pos = 0
        while pos < len(ids):
            take = min(passes.grid, len(ids) - pos)
            size = passes.size_for(take)
            piece = ids[pos:pos + take] + [0] * (size - take)  # padding: any valid id, masked out
            batch = torch.tensor(piece, dtype=torch.long)
            self.logits = passes.fork_pass(batch, state, take, logits=pos + take == len(ids))
            state.length += take
            pos += take
        return self

    def decode(self, max_new: int, stop: set[int], look_every: int = 16) -> list[int]:
        """Greedy decoding from the fork's logits. Each token's argmax feeds the next pass on the
        device, with no trip to the host in between, so the host queues passes while the GPU runs
        them; the host reads the tokens every ``look_every`` and cuts at the first stop id (the
        passes queued after it only wrote scratch rows above the committed ones)."""
        passes, state = self.passes, self.state
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
            self.logits = passes.fork_pass(step, state, 1, logits=True)
            state.length += 1
        return out

    def close(self) -> None:
        self.state.truncate(self.committed)
