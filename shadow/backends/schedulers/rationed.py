"""The ration: between two of the host's decode rounds, on the request's thread.

``step(turn)`` is one slice, at one of ``turn``'s rounds. Two scopes (``RATION_SCOPE``):

- ``device`` (the default): one budget for the device. It earns ``share`` of the time during which
  any followed request decodes (``HostActivity.decoding_s``), whatever the number of requests in
  flight, and carries at most one slice unspent. A slice reads the sessions of the turns in flight
  (the one nearest to fresh first: ``Shadow.read`` says why), then the most recently used
  sessions, in batches; one slice runs at a time on the device (a round that finds one running
  reads nothing).
- ``turn``: the first design, one budget per turn: ``share`` of the time since the turn's first
  token, less what the turn used, spent on the turn's own session in order. Its cost adds up over
  concurrent turns (``benchmarks/concurrency.py`` measures both).

Device-wide, a slice may gather (``gather``, ``gather_s``): while fewer than ``gather`` whole chunks
are pending over every readable session, it reads nothing, for at most ``gather_s`` from the round
that first found some pending; the bank keeps earning meanwhile. A pass of one chunk costs about
as much as a pass of several sessions' chunks, and beside an engine's decode step far more
(``benchmarks/README.md``, "Gathering"), so the share buys more ids in fuller passes.

Either way a slice is at most ``slice_s`` (150 ms), passes start only while their cost, estimated
from the facade's one table of costs by batch size and depth, still fits, and the device is
synchronised before the first one, so nothing of the small model runs beside the host's work.
Spent time is the measured device time of the passes; the turn at whose round a slice ran is
charged with it (``HostActivity.record_ration``).

Bounds: a slice spends at most its budget plus one pass's estimation error (the very first pass,
with no cost measured yet, is read on any positive budget). Per turn: ``share`` of the time since
its first token plus one pass. Device-wide: ``share`` of the decoding time, plus one slice carried,
plus one pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from shadow.core.host import HostActivity, TurnTimeline
from shadow.core.records import ChunkRead
from shadow.core.scheduling import DEVICE_SHARE, SLICE_S, Clock, NullTelemetry, Telemetry, Window, fits, ration_budget
from shadow.core.shadow import Shadow
from shadow.core.slot import Slot

from .common import backlog_after, backlog_of, chunk_estimate, depth_of

Scope = Literal["device", "turn"]


class RationedScheduler:
    window: Window = "ration"

    def __init__(self, slot: Slot, activity: HostActivity, telemetry: Telemetry | None = None,
                 clock: Clock = time.monotonic, share: float = DEVICE_SHARE, slice_s: float = SLICE_S,
                 sync: Callable[[], None] | None = None, scope: Scope = "device", gather: int = 1,
                 gather_s: float = 0.0) -> None:
        if scope not in ("device", "turn"):
            raise ValueError(f"scope must be device or turn, got {scope!r}")
        if gather < 1 or gather_s < 0:
            raise ValueError(f"gather must be at least 1 chunk and gather_s not negative, got {gather} and {gather_s}")
        self.slot = slot
        self.telemetry = telemetry or NullTelemetry()
        self.clock = clock
        self.share = share
        self.slice_s = slice_s
        self.sync = sync  # None: the facade's own (its reader's device)
        self.activity = activity
        self.scope = scope
        self.gather = gather
        self.gather_s = gather_s
        self._gathering_since: float | None = None  # the round that first found too few chunks pending
        self._bank = 0.0  # (device) earned and not spent, at most one slice; negative after an overrun
        self._earned_to = activity.decoding_s()
        self._mu = threading.Lock()  # the bank's
        self._slice = threading.Lock()  # one slice at a time on the device

    def estimate(self, session: str) -> float | None:
        """A chunk of ``session`` read alone, at its depth (the narrator's planning)."""
        shadow = self.slot.get()
        return None if shadow is None else chunk_estimate(shadow, session)

    def budget(self, turn: TurnTimeline) -> float:
        if self.scope == "turn":
            return ration_budget(turn, self.clock(), self.share, self.slice_s)
        decoding = self.activity.decoding_s()
        with self._mu:
            self._bank = min(self.slice_s, self._bank + self.share * max(0.0, decoding - self._earned_to))
            self._earned_to = decoding
            return max(0.0, self._bank)

    def may_read(self, turn: TurnTimeline, backlog: int, grid: int, budget: float | None = None) -> bool:
        """Whether a step now (or with ``budget``) could read a chunk, the turn's session's backlog
        being at most ``backlog``: the step's own test, which the service also asks on a round it
        would rather leave quiet. Its estimate is the cheapest first pass (one session, the
        shallowest that could be read), so device-wide it may say yes and the step read nothing
        (another round's slice runs), not the reverse."""
        shadow = self.slot.get()
        if self.share <= 0 or turn.session is None or shadow is None:
            return False
        depths = [depth_of(shadow, turn.session)] if backlog >= grid else []
        if self.scope == "device" and (lowest := shadow.lowest_ready_depth()) is not None:
            depths.append(lowest)
        if not depths:
            return False
        return fits(0.0, shadow.costs.estimate([min(depths)]), self.budget(turn) if budget is None else budget)

    def step(self, turn: TurnTimeline | None = None) -> list[ChunkRead]:
        """One slice. Its budget is computed here only and kept on the turn (``budget_s``), so what
        the service reports is what was enforced."""
        if turn is None or turn.session is None or not self._slice.acquire(blocking=False):
            return []
        try:
            return self._slice_at(turn)
        finally:
            self._slice.release()

    def _slice_at(self, turn: TurnTimeline) -> list[ChunkRead]:
        assert turn.session is not None
        budget = self.budget(turn)
        shadow = self.slot.get()
        if shadow is None or not self.may_read(turn, backlog_of(shadow, turn.session), shadow.grid, budget) \
                or not self._gathered(shadow):
            self._charge(turn, [], budget)
            return []
        (self.sync or shadow.sync)()
        attrs = {"shadow.window": "ration", "shadow.ration.scope": self.scope,
                 "gen_ai.conversation.id": turn.session, "shadow.request.id": turn.request_id,
                 "shadow.ration.budget_ms": budget * 1e3,
                 "shadow.ration.since_first_token_ms": (self.clock() - (turn.first_token_s or 0.0)) * 1e3,
                 "shadow.ration.turn_spent_before_ms": turn.spent_s * 1e3}
        with self.telemetry.span("shadow.ration", attrs) as span:
            chunks = self._read(shadow, turn, budget)
            spent = self._charge(turn, chunks, budget)
            span.set("shadow.ration.spent_ms", spent * 1e3)
            span.set("shadow.ration.chunks", len(chunks))
        return chunks

    def _gathered(self, shadow: Shadow) -> bool:
        """Whether a device-wide slice reads now: ``gather`` chunks pending, or the oldest wait over."""
        if self.scope != "device" or self.gather <= 1:
            return True
        pending = 0
        for name in shadow.ready():
            pending += shadow.backlog(name) // shadow.grid
            if pending >= self.gather:
                self._gathering_since = None
                return True
        now = self.clock()
        if self._gathering_since is None:
            self._gathering_since = now
        if now - self._gathering_since >= self.gather_s:
            self._gathering_since = None
            return True
        return False

    def _read(self, shadow: Shadow, turn: TurnTimeline, budget: float) -> list[ChunkRead]:
        def on_pass(chunks: list[ChunkRead], estimate: float | None, t0: int, t1: int) -> None:
            for chunk in chunks:
                end = chunk.first_row + chunk.rows
                part = "other" if chunk.session != turn.session else "prompt" if end <= turn.prompt_len else (
                    "output" if chunk.first_row >= turn.prompt_len else "prompt+output")
                attrs: dict[str, Any] = {"shadow.request.id": turn.request_id, "shadow.chunk.part": part,
                                         "shadow.chunk.batch": chunk.batch, "shadow.chunk.span": chunk.span,
                                         "shadow.chunk.estimate_ms": -1.0 if estimate is None else estimate * 1e3}
                self.telemetry.chunk("ration", chunk, backlog_after(shadow, chunk), t0, t1, attrs)

        if self.scope == "turn":
            return shadow.read(turn.session, budget_s=budget, on_pass=on_pass)
        # whole passes: with many sessions ready the share buys more ids in batches than read alone
        return shadow.read(first=self.activity.sessions_in_flight(), budget_s=budget, on_pass=on_pass, whole=True)

    def _charge(self, turn: TurnTimeline, chunks: list[ChunkRead], budget: float) -> float:
        """The slice's cost: off the device's bank, onto the turn whose round it ran at."""
        spent = sum(c.cost_s for c in chunks)
        with self._mu:
            self._bank -= spent
        self.activity.record_ration(turn.request_id, spent, len(chunks), budget)
        return spent
