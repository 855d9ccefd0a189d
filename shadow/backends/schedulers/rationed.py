"""The ration: between two of the host's decode rounds, on the request's thread.

``step(turn)`` is one slice. It may use ``share`` (2 %) of the time since the turn's first token,
less what the turn used already, and at most ``slice_s`` (150 ms). It reads whole chunks of the
turn's own session only, in order, so the prompt first and then the output so far; a chunk starts
only when its cost, estimated from the last chunk's measured cost, still fits. The device is
synchronised before the first chunk, so nothing of the small model runs beside the host's work.
Spent time is the measured device time of the chunks (``ChunkRead.cost_s``); the turn keeps the
sum, so the next slice's budget is what is left of the share.

Bounds this gives: a slice spends at most its budget plus the last chunk's estimation error (at
most one chunk: the very first chunk, with no cost measured yet, is read on any positive budget),
and a turn at most ``share`` of the time since its first token plus one chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shadow.core.host import HostActivity, TurnTimeline
from shadow.core.records import ChunkRead
from shadow.core.scheduling import SHARE, SLICE_S, Clock, NullTelemetry, Telemetry, Window, fits, ration_budget
from shadow.core.slot import Slot

from .common import backlog_after, backlog_of, read_one


class RationedScheduler:
    window: Window = "ration"

    def __init__(self, slot: Slot, telemetry: Telemetry | None = None, clock: Clock = time.monotonic,
                 share: float = SHARE, slice_s: float = SLICE_S, sync: Callable[[], None] | None = None, *,
                 activity: HostActivity) -> None:
        self.slot = slot
        self.activity = activity  # the turn's only writer (its lock)
        self.telemetry = telemetry or NullTelemetry()
        self.clock = clock
        self.share = share
        self.slice_s = slice_s
        self.sync = sync  # None: the facade's own (its reader's device)
        self.last_cost_s: float | None = None  # the last chunk's measured cost, any session
        self._cost: dict[str, float] = {}  # the last chunk's cost per session (a chunk's cost grows with depth)

    def estimate(self, session: str) -> float | None:
        return self._cost.get(session, self.last_cost_s)

    def budget(self, turn: TurnTimeline) -> float:
        return ration_budget(turn, self.clock(), self.share, self.slice_s)

    def may_read(self, turn: TurnTimeline, backlog: int, grid: int, budget: float | None = None) -> bool:
        """Whether a step now (or with ``budget``) could read a chunk of the turn's session, whose
        backlog is at most ``backlog``: the step's own test, which the service also asks on a round
        it would rather leave quiet."""
        if self.share <= 0 or turn.session is None or backlog < grid:
            return False
        return fits(0.0, self.estimate(turn.session), self.budget(turn) if budget is None else budget)

    def step(self, turn: TurnTimeline | None = None) -> list[ChunkRead]:
        """One slice. Its budget is computed here only and kept on the turn (``budget_s``), so what
        the service reports is what was enforced."""
        if turn is None or turn.session is None:
            return []
        budget = self.budget(turn)
        shadow = self.slot.get()
        if shadow is None or not self.may_read(turn, backlog_of(shadow, turn.session), shadow.grid, budget):
            self.activity.record_ration(turn.request_id, 0.0, 0, budget)
            return []
        (self.sync or shadow.sync)()
        spent = 0.0
        done: list[ChunkRead] = []
        attrs = {"shadow.window": "ration", "gen_ai.conversation.id": turn.session,
                 "shadow.request.id": turn.request_id, "shadow.ration.budget_ms": budget * 1e3,
                 "shadow.ration.since_first_token_ms": (self.clock() - (turn.first_token_s or 0.0)) * 1e3,
                 "shadow.ration.turn_spent_before_ms": turn.spent_s * 1e3}
        with self.telemetry.span("shadow.ration", attrs) as span:
            while fits(spent, self.estimate(turn.session), budget):
                estimate = self.estimate(turn.session)
                chunk, t0, t1 = read_one(shadow, turn.session)
                if chunk is None:
                    break
                spent += chunk.cost_s
                self.last_cost_s = self._cost[turn.session] = chunk.cost_s
                done.append(chunk)
                part = "prompt" if chunk.first_row + chunk.rows <= turn.prompt_len else (
                    "output" if chunk.first_row >= turn.prompt_len else "prompt+output")
                self.telemetry.chunk("ration", chunk, backlog_after(shadow, chunk), t0, t1,
                                     {"shadow.request.id": turn.request_id, "shadow.chunk.part": part,
                                      "shadow.chunk.estimate_ms": -1.0 if estimate is None else estimate * 1e3})
            self.activity.record_ration(turn.request_id, spent, len(done), budget)
            span.set("shadow.ration.spent_ms", spent * 1e3)
            span.set("shadow.ration.chunks", len(done))
        return done
