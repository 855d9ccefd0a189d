"""What a chunk costs, by batch size and depth: the one table every plan reads.

The facade records each pass it reads (``Shadow.read``, a question's tail) here, and every
planner (the idle window, the ration, the narrator) estimates the next pass from it: there is no
other copy. A pass of ``B`` sessions is keyed by ``B`` and its sessions' mean depth, in buckets of
``bucket`` rows: a chunk's cost grows with its depth (attention over the rows below) and falls per
session with the batch (the projections' rows are shared), and a pass's attention is the sum of
its sessions' own, so the mean depth stands for the pass. The estimate is the last pass measured
at that key (a chunk's cost is steady; the last one follows a device that slows down), else the
nearest depth measured at that batch size, else one session's cost at that depth per session (a
batch costs no more per session than reading each alone), else the nearest measured; ``None``
when nothing was measured yet: the first pass ever is read on any positive budget (``fits``).

Pure Python, no clock: costs come in as the reader measured them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

BUCKET_ROWS = 4096


def fits(spent: float, estimate: float | None, budget: float) -> bool:
    """Whether the next whole pass may start: its estimated cost still fits. Without an estimate
    (the first pass ever) one may start if nothing was spent yet and anything is left: the bound is
    then the budget plus one pass."""
    if budget <= 0:
        return False
    if estimate is None:
        return spent == 0.0
    return spent + estimate <= budget


class ChunkCosts:
    def __init__(self, bucket: int = BUCKET_ROWS) -> None:
        if bucket <= 0:
            raise ValueError(f"bucket must be positive, got {bucket}")
        self.bucket = bucket
        self._per_chunk: dict[tuple[int, int], float] = {}  # (batch, depth bucket) -> seconds per chunk
        self._mu = threading.Lock()

    def _key(self, depths: Sequence[int]) -> tuple[int, int]:
        return len(depths), sum(depths) // len(depths) // self.bucket

    def record(self, depths: Sequence[int], cost_s: float) -> None:
        """A pass measured: the sessions' depths (rows below each one's chunk) and its whole cost."""
        if not depths:
            raise ValueError("a pass reads at least one session")
        with self._mu:
            self._per_chunk[self._key(depths)] = cost_s / len(depths)

    def per_chunk(self, batch: int, depth: int) -> float | None:
        """Seconds per session of a pass of ``batch`` sessions at mean depth ``depth``."""
        at = depth // self.bucket
        with self._mu:
            if (batch, at) in self._per_chunk:
                return self._per_chunk[(batch, at)]
            same = [k for k in self._per_chunk if k[0] == batch]
            if same:
                return self._per_chunk[min(same, key=lambda k: abs(k[1] - at))]
            alone = [k for k in self._per_chunk if k[0] == 1]
            keys = alone or list(self._per_chunk)
            if not keys:
                return None
            return self._per_chunk[min(keys, key=lambda k: (abs(k[1] - at), abs(k[0] - batch)))]

    def estimate(self, depths: Sequence[int]) -> float | None:
        """The whole cost of a pass over sessions at these depths; None when nothing was measured."""
        if not depths:
            return 0.0
        each = self.per_chunk(len(depths), sum(depths) // len(depths))
        return None if each is None else each * len(depths)

    def span_that_fits(self, spans: Sequence[int], first_row: int, grid: int, room: int, spent: float,
                       budget: float | None) -> int:
        """The largest of ``spans`` (chunks of one session in one pass) up to ``room`` whose estimate
        fits what is left of ``budget``, else 1. A span is costed as a pass of as many sessions at
        its chunks' depths: the H200 measured the two within 0.12 ms per 512 ids (``span_chunk`` and
        ``batch_chunk`` rows in ``benchmarks/results/read_rate.json``), so one table serves both."""
        for k in sorted(spans, reverse=True):
            if k <= room and (budget is None or fits(spent, self.estimate([first_row + i * grid for i in range(k)]),
                                                     budget)):
                return k
        return 1

    def as_dict(self) -> dict[str, float]:
        """``"B x depth-bucket-start"`` -> ms per chunk, for status."""
        with self._mu:
            return {f"{b}x{k * self.bucket}": round(s * 1e3, 4) for (b, k), s in sorted(self._per_chunk.items())}


# A pass of a size the reader did not capture runs in the next captured size up when that leaves at
# most this many of its sessions empty, else as the largest captured size below and the rest after:
# 3 sessions in a pass of 4 rather than passes of 2 and 1 (see ``pass_plan``). Chosen by the replay
# of 64 agents (``benchmarks/results/concurrency_pad.json``): at most 0, 1, 2, 3 empty slots cost
# 3.35, 3.31, 3.35 and 3.42 % of the device.
PAD_SLOTS = 1


def pass_plan(sessions: int, sizes: Sequence[int], pad: int = PAD_SLOTS) -> list[tuple[int, int]]:
    """The passes that read one chunk of each of ``sessions`` sessions with graphs captured for
    ``sizes`` batch sizes: ``(size, real)`` per pass, in order, the first ``real`` of its ``size``
    slots holding sessions and the rest an empty placeholder. A batch's bits are each session's
    own, whatever else is in it, so an empty slot changes nothing but the pass's cost: one pass
    of 4 at 0-2k costs 6.4 ms on the H200, passes of 2 and 1 6.9 (``read_rate.json`` at ff0708d)."""
    if sessions < 0 or not sizes or min(sizes) < 1 or 1 not in sizes:
        raise ValueError(f"sessions {sessions} in sizes {list(sizes)}: sizes must include 1, sessions >= 0")
    ordered = sorted(set(sizes))
    plan: list[tuple[int, int]] = []
    left = sessions
    while left > 0:
        up = next((s for s in ordered if s >= left), None)
        if up is not None and up - left <= pad:
            plan.append((up, left))
            break
        take = max(s for s in ordered if s <= left)
        plan.append((take, take))
        left -= take
    return plan
