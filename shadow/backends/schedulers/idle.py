"""The idle window: when no request runs or waits and no hold is on, read for at most ``window_s``.

One ``step`` is one look (the service's loop looks every 0.2 s):

1. the host is busy (a request runs or waits, a hold is on): nothing;
2. nothing to do (no whole chunk pending in any session but those dropped and not used since, the
   model loaded or not wanted): nothing. Once the host stops feeding, this holds for good;
3. take the box lock without waiting (held: nothing). The model's first load, soon after the
   start, happens here, under the box lock only: a request that comes meanwhile does not wait for it;
4. take the engine lock at rank 4, behind every waiter (not free within ``lock_wait_s``: nothing),
   look again (a request may have come while it queued), then read: before every chunk, stop if a
   request waits or the next chunk (its cost estimated from the last) would pass ``window_s``. A
   request that arrives while a chunk is read waits for that one chunk only;
5. then, still in the window, answer the questions that wait for the reader (the router's, in
   shadow mode), unless a request came.
"""

from __future__ import annotations

import time

from shadow.core.host import IDLE_RANK, HostActivity, TurnTimeline
from shadow.core.protocols import Questioner
from shadow.core.scheduling import IDLE_WINDOW_S, Clock, NullTelemetry, Telemetry, Window
from shadow.core.shadow import ChunkRead, Shadow
from shadow.core.slot import Slot

from .common import backlog_after, read_one


class IdleScheduler:
    window: Window = "idle"

    def __init__(self, slot: Slot, activity: HostActivity, telemetry: Telemetry | None = None,
                 clock: Clock = time.monotonic, window_s: float = IDLE_WINDOW_S, lock_wait_s: float = 0.2,
                 questions: Questioner | None = None) -> None:
        self.slot = slot
        self.activity = activity
        self.telemetry = telemetry or NullTelemetry()
        self.clock = clock
        self.window_s = window_s
        self.lock_wait_s = lock_wait_s
        self.questions = questions
        self.last_cost_s: float | None = None

    def _work(self) -> bool:
        shadow = self.slot.get()
        if shadow is None:
            return self.slot.due
        grid = shadow.grid
        if any(b >= grid for b in shadow.readable_backlogs().values()):
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
                chunks = self._read(shadow)
                if self.questions is not None and not self.activity.busy():
                    self.questions.answer(shadow, self.activity.busy)
                return chunks
            finally:
                engine.release()
        finally:
            box.release()

    def _read(self, shadow: Shadow) -> list[ChunkRead]:
        start = self.clock()
        spent = 0.0
        done: list[ChunkRead] = []
        with self.telemetry.span("shadow.window", {"shadow.window": "idle",
                                                   "shadow.window.budget_ms": self.window_s * 1e3}) as span:
            while True:
                if self.activity.busy():
                    span.set("shadow.window.stopped_for", "request")
                    break
                elapsed = max(self.clock() - start, spent)
                if done and self.last_cost_s is not None and elapsed + self.last_cost_s > self.window_s:
                    break  # (a window's first chunk always starts: on a slow box a chunk may pass the window)
                chunk, t0, t1 = read_one(shadow, None)
                if chunk is None:
                    break
                spent += chunk.cost_s
                self.last_cost_s = chunk.cost_s
                done.append(chunk)
                self.telemetry.chunk("idle", chunk, backlog_after(shadow, chunk), t0, t1)
            span.set("shadow.window.spent_ms", spent * 1e3)
            span.set("shadow.window.chunks", len(done))
        return done
