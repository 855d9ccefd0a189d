"""The idle window: when no request runs or waits and no hold is on, read for at most ``window_s``.

One ``step`` is one look (the service's loop looks every 0.2 s):

1. the host is busy (a request runs or waits, a hold is on): nothing;
2. nothing to do (no whole chunk pending in any session but those dropped and not used since, the
   model loaded or not wanted): nothing. Once the host stops feeding, this holds for good;
3. take the box lock without waiting (held: nothing). The model's first load, soon after the
   start, happens here, under the box lock only: a request that comes meanwhile does not wait for it;
4. take the engine lock at rank 4, behind every waiter (not free within ``lock_wait_s``: nothing),
   look again (a request may have come while it queued), then read in batches (``Shadow.read``,
   sessions most recently used first): before every pass, stop if a request waits or the next pass
   (its cost estimated from the facade's table of costs) would pass ``window_s``. A request that
   arrives while a pass is read waits for that one pass only;
5. then, still in the window, answer the questions that wait for the reader (the router's, in
   shadow mode), unless a request came.
"""

from __future__ import annotations

import time

from shadow.core.host import IDLE_RANK, HostActivity, TurnTimeline
from shadow.core.plan import ReadPlan
from shadow.core.protocols import Questioner
from shadow.core.records import ChunkRead
from shadow.core.scheduling import IDLE_WINDOW_S, Clock, NullTelemetry, Telemetry, Window
from shadow.core.shadow import Shadow
from shadow.core.slot import ModelSlot

from .common import backlog_after


class IdleScheduler:
    window: Window = "idle"

    def __init__(self, slot: ModelSlot, activity: HostActivity, telemetry: Telemetry | None = None,
                 clock: Clock = time.monotonic, window_s: float = IDLE_WINDOW_S, lock_wait_s: float = 0.2,
                 questions: Questioner | None = None) -> None:
        self.slot = slot
        self.activity = activity
        self.telemetry = telemetry or NullTelemetry()
        self.clock = clock
        self.window_s = window_s
        self.lock_wait_s = lock_wait_s
        self.questions = questions

    def _work(self) -> bool:
        shadow = self.slot.get()
        if shadow is None:
            return self.slot.due
        if shadow.lowest_ready_depth() is not None:
            return True
        return self.questions is not None and self.questions.pending(shadow)

    def step(self, turn: TurnTimeline | None = None) -> list[ChunkRead]:
        if self.activity.busy() or not self._work():
            return []
        box = self.activity.box_lock
        if not box.acquire(blocking=False):
            return []
        try:
            if self.slot.due:
                self.slot.load()
                return []
            shadow = self.slot.get()
            if shadow is None:
                return []
            engine = self.activity.engine_lock
            if not engine.acquire(IDLE_RANK, self.lock_wait_s):
                return []
            try:
                if self.activity.busy():
                    return []
                chunks = self._read(shadow, self.plan())
                if self.questions is not None and not self.activity.busy():
                    self.questions.answer(shadow, self.activity.busy)
                return chunks
            finally:
                engine.release()
        finally:
            box.release()

    def plan(self) -> ReadPlan:
        """The window's read: every ready session, most recently used first, within ``window_s``.
        Its first pass always starts (on a slow box a pass may take longer than the window); it
        steps aside for any call that waits for the facade (a question, a status look): they wait
        for the pass in flight, not the window."""
        return ReadPlan(budget_s=self.window_s, first_pass_free=True, yields=True)

    def _read(self, shadow: Shadow, plan: ReadPlan) -> list[ChunkRead]:
        def on_pass(chunks: list[ChunkRead], estimate: float | None, t0: int, t1: int) -> None:
            for chunk in chunks:
                self.telemetry.chunk("idle", chunk, backlog_after(shadow, chunk), t0, t1,
                                     {"shadow.chunk.batch": chunk.batch, "shadow.chunk.span": chunk.span})

        with self.telemetry.span("shadow.window", {"shadow.window": "idle",
                                                   "shadow.window.budget_ms": self.window_s * 1e3}) as span:
            done = shadow.read(plan, on_pass, stop=self.activity.busy)  # a request stops it too
            if self.activity.busy():
                span.set("shadow.window.stopped_for", "request")
            span.set("shadow.window.spent_ms", sum(c.cost_s for c in done) * 1e3)
            span.set("shadow.window.chunks", len(done))
        return done
