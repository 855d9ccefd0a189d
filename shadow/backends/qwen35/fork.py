"""A fork above a session's committed rows (a question, a narrator's decode) on the fast path: its
ids go through whole-grid passes and one padded pass of the smallest captured size that holds the
rest, on the static conv and recurrent buffers (slot 0), so the session's own conv and recurrent
tensors are never written; its KV rows above the committed ones are scratch.

Where a read's attention comes from a table (``FastForward.whole_forks``), a fork's pass does too:
its layers are one captured graph and its logits another, with a one-entry table staged per pass
(the fork's start, its split rule and the session's KV addresses), where the piecewise form ran six
eager attention calls between seven graphs. On an H100 (``benchmarks/probes/fork_whole_ab.py``, both
forms in one process) a 300-id question took 3.37 / 4.81 ms at 32k / 100k against 3.53 / 5.44, a
decode step 1.64 ms a token at 32k against 1.72: what a decode step costs is not the host's launches
but the graph's own few hundred kernels at one row. From 16 rows the table's kernel gives
``attend``'s bits, so a question's logits are the piecewise form's; a decode step's one row, which
piecewise takes torch's flash kernel, takes ours too (its split rule a function of the depth alone,
as everywhere).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import piecewise
from .staging import read_table
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
            self.logits = run(fast, batch, state, take, logits=pos + take == len(ids))
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
            self.logits = run(fast, step, state, 1, logits=True)
            state.length += 1
        return out

    def close(self) -> None:
        self.state.truncate(self.committed)


def run(fast: FastForward, ids: torch.Tensor, state: ModelState, real: int, logits: bool) -> torch.Tensor | None:
    """One pass of a fork: ``ids`` (a captured fork size, the first ``real`` of them real) at the
    state's length, on slot 0. Returns the logits of the last real row if asked."""
    if not fast.whole_forks:
        return piecewise.run(fast, ids, [state], real, logits=logits)
    r = fast._rows_for(ids.shape[0])
    start = state.length
    state.reserve(start + r.n)
    cfg = fast.cfg
    r.stage(ids, [start], real, read_table([state], [start], r.n, r.n, fast.n_attn, cfg.num_attention_heads,
                                            fast._kv_like))
    if r.whole is not None:
        r.whole.replay()
        if logits:
            r.graphs[0].replay()
    else:
        fast._table_pass(r, read=False)
        if logits:
            fast._logits(r)
    return r.logits if logits else None

