"""The ration: decided between two of the host's decode rounds, read there or on its own thread.

``step(turn)`` is one slice, at one of ``turn``'s rounds. Two scopes (``RATION_SCOPE``):

- ``device`` (the default): one budget for the device. It earns ``share`` of the time during which
  any followed request decodes (``HostActivity.decoding_s``), whatever the number of requests in
  flight, and carries at most one slice unspent. A slice reads the sessions of the turns in flight
  (the one nearest to fresh first, the facade's order: ``shadow.core.shadow`` says why), then the most recently used
  sessions, in batches; one slice runs at a time on the device (a round that finds one running
  reads nothing).
- ``turn``: the first design, one budget per turn: ``share`` of the time since the turn's first
  token, less what the turn used, spent on the turn's own session in order. Its cost adds up over
  concurrent turns (``benchmarks/concurrency`` measures both).

Device-wide, a slice may gather (``gather``, ``gather_s``): while fewer than ``gather`` whole chunks
are pending over every readable session, it reads nothing, for at most ``gather_s`` from the round
that first found some pending; the bank keeps earning meanwhile. A chunk read alone costs more
than one in a fuller pass (2.74 ms against 1.66 at eight sessions a pass, 0-2k, H200), and beside
an engine's decode step far more (``benchmarks/README.md``, "Gathering"), so the share buys more
ids in fuller passes. Gathering pays only on the ration's own thread: in the round, the engine
waits for the longer slices.

With ``thread``, a slice is decided on the round's thread and read on the ration's own thread, so
the engine's round returns at once; while it reads, rounds stay quiet (``may_read`` says no), and
it stops after the pass in flight when a request waits (``arrived``, not started) or any call waits
for the facade (the plan's ``yields``, ``ReadPlan``). The turn is
charged when the slice ends, if it still runs.

With more than ``output_turns`` requests running (``RATION_OUTPUT_TURNS``, 1), a slice reads each
session only below its settled end, the latest prompt's grid line (``SessionBook.settled_end``):
an agent's next prompt mostly rewrites Qwen's output, so rows read past that line were mostly read
again (17 % of the ration's chunks at 64 agents, ``benchmarks/concurrency``). With one request
running the output costs little, and reading it keeps fresh the turns whose prompt keeps it. The
idle window, which costs the host nothing, reads everything.

Either way a slice is at most ``slice_s`` (150 ms), passes start only while their cost, estimated
from the facade's one table of costs by batch size and depth, still fits, and the reader's work
queued before is waited for first. Spent time is the measured device time of the passes; the turn
at whose round a slice was decided is charged with it (``HostActivity.record_ration``).

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

from shadow.core.host import HostActivity, TurnTimeline, UnknownRequest
from shadow.core.plan import ReadPlan
from shadow.core.records import ChunkRead
from shadow.core.scheduling import DEVICE_SHARE, SLICE_S, Clock, NullTelemetry, Telemetry, Window, fits, ration_budget
from shadow.core.shadow import Shadow
from shadow.core.slot import ModelSlot

from .common import backlog_after, backlog_of, chunk_estimate, depth_of

Scope = Literal["device", "turn"]


class RationedScheduler:
    window: Window = "ration"

    def __init__(self, slot: ModelSlot, activity: HostActivity, telemetry: Telemetry | None = None,
                 clock: Clock = time.monotonic, share: float = DEVICE_SHARE, slice_s: float = SLICE_S,
                 sync: Callable[[], None] | None = None, scope: Scope = "device", gather: int = 1,
                 gather_s: float = 0.0, thread: bool = False, output_turns: int = 1) -> None:
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
        self.thread = thread
        self.output_turns = output_turns
        self.on_read: Callable[[list[ChunkRead]], None] | None = None  # the service's count of what slices read
        self.on_error: Callable[[BaseException], None] | None = None
        self._wake = threading.Condition()
        self._job: tuple[TurnTimeline, Shadow, float] | None = None
        self._busy = False  # a slice handed to the thread and not ended
        self._closing = False
        self._worker: threading.Thread | None = None
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
        if self.share <= 0 or turn.session is None or shadow is None or self._busy:
            return False
        settled = self._settled()
        if settled and backlog >= grid:  # the ids a caller counts past the facade's are output: none settled
            backlog = min(backlog, backlog_of(shadow, turn.session, settled=True))
        depths = [depth_of(shadow, turn.session)] if backlog >= grid else []
        if self.scope == "device" and (lowest := shadow.lowest_ready_depth(settled)) is not None:
            depths.append(lowest)
        if not depths:
            return False
        return fits(0.0, shadow.costs.estimate([min(depths)]), self.budget(turn) if budget is None else budget)

    def step(self, turn: TurnTimeline | None = None) -> list[ChunkRead]:
        """One slice. Its budget is computed here only and kept on the turn (``budget_s``), so what
        the service reports is what was enforced. With ``thread`` the slice is decided here and
        read on the ration's own thread: the call returns at once, with no chunks."""
        if turn is None or turn.session is None or not self._slice.acquire(blocking=False):
            return []
        handed = False
        try:
            shadow, budget = self._decide(turn)
            if shadow is None:
                return []
            if not self.thread:
                return self._run(turn, shadow, budget)
            self._hand(turn, shadow, budget)
            handed = True
            return []
        finally:
            if not handed:
                self._slice.release()

    def _decide(self, turn: TurnTimeline) -> tuple[Shadow | None, float]:
        """The slice's budget, and the facade if the slice reads (else the turn is charged nothing)."""
        assert turn.session is not None
        budget = self.budget(turn)
        shadow = self.slot.get()
        if shadow is None or not self.may_read(turn, backlog_of(shadow, turn.session), shadow.grid, budget) \
                or not self._gathered(shadow):
            self._charge(turn, [], budget)
            return None, budget
        return shadow, budget

    def _run(self, turn: TurnTimeline, shadow: Shadow, budget: float) -> list[ChunkRead]:
        (self.sync or shadow.sync)()
        attrs = {"shadow.window": "ration", "shadow.ration.scope": self.scope,
                 "gen_ai.conversation.id": turn.session, "shadow.request.id": turn.request_id,
                 "shadow.ration.budget_ms": budget * 1e3,
                 "shadow.ration.since_first_token_ms": (self.clock() - (turn.first_token_s or 0.0)) * 1e3,
                 "shadow.ration.turn_spent_before_ms": turn.spent_s * 1e3}
        with self.telemetry.span("shadow.ration", attrs) as span:
            plan = self.plan(turn, budget)  # schedule
            chunks = self._read(shadow, turn, plan)  # read
            spent = self._charge(turn, chunks, budget)  # account
            span.set("shadow.ration.spent_ms", spent * 1e3)
            span.set("shadow.ration.chunks", len(chunks))
        return chunks

    # ---- the ration's own thread (``thread``) ------------------------------------------------------

    def _hand(self, turn: TurnTimeline, shadow: Shadow, budget: float) -> None:
        with self._wake:
            if self._closing:
                raise RuntimeError("the ration is closed")
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="shadow-ration", daemon=True)
                self._worker.start()
            self._job = (turn, shadow, budget)
            self._busy = True
            self._wake.notify()

    def _work(self) -> None:
        while True:
            with self._wake:
                while self._job is None and not self._closing:
                    self._wake.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            try:
                chunks = self._run(*job)
                if self.on_read is not None:
                    self.on_read(chunks)
            except Exception as err:  # the thread outlives one bad slice; the error goes to status
                if self.on_error is not None:
                    self.on_error(err)
            finally:
                self._busy = False
                self._slice.release()

    def close(self, timeout: float = 10.0) -> None:
        """Let a slice in flight end, then stop the ration's thread (if it ever started)."""
        with self._wake:
            self._closing = True
            self._wake.notify()
            worker = self._worker
        if worker is not None:
            worker.join(timeout)

    def _gathered(self, shadow: Shadow) -> bool:
        """Whether a device-wide slice reads now: ``gather`` chunks pending, or the oldest wait over."""
        if self.scope != "device" or self.gather <= 1:
            return True
        pending = 0
        settled = self._settled()
        for name in shadow.ready(settled):
            pending += shadow.backlog(name, settled) // shadow.grid
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

    def _read(self, shadow: Shadow, turn: TurnTimeline, plan: ReadPlan) -> list[ChunkRead]:
        def on_pass(chunks: list[ChunkRead], estimate: float | None, t0: int, t1: int) -> None:
            for chunk in chunks:
                end = chunk.first_row + chunk.rows
                part = "other" if chunk.session != turn.session else "prompt" if end <= turn.prompt_len else (
                    "output" if chunk.first_row >= turn.prompt_len else "prompt+output")
                attrs: dict[str, Any] = {"shadow.request.id": turn.request_id, "shadow.chunk.part": part,
                                         "shadow.chunk.batch": chunk.batch, "shadow.chunk.span": chunk.span,
                                         "shadow.chunk.estimate_ms": -1.0 if estimate is None else estimate * 1e3}
                self.telemetry.chunk("ration", chunk, backlog_after(shadow, chunk), t0, t1, attrs)

        # on its own thread a slice holds the facade between the host's calls: it stops after the pass
        # in flight when a request waits (arrived, not started), as the idle window does
        stop = (lambda: self.activity.waiting() > 0) if self.thread and self.scope == "device" else None
        return shadow.read(plan, on_pass, stop=stop)

    def plan(self, turn: TurnTimeline, budget: float) -> ReadPlan:
        """A slice's read, decided at ``turn``'s round with ``budget``. Per turn: that turn's session
        alone. Device-wide: the turns in flight first, then the rest, in whole passes (with many
        sessions ready the share buys more ids in batches than read alone). On the ration's own
        thread it yields to any call that waits for the facade (a request started without being
        announced, a round with ids to feed, ``finished``, a question). With more than
        ``output_turns`` turns running, only below each session's settled end."""
        settled = self._settled()
        if self.scope == "turn":
            return ReadPlan(turn.session, budget_s=budget, yields=self.thread, settled=settled)
        return ReadPlan(favoured=tuple(self.activity.sessions_in_flight()), budget_s=budget, whole=True,
                        yields=self.thread, settled=settled)

    def _settled(self) -> bool:
        """Whether a slice reads only below each session's settled end: more than ``output_turns`` run."""
        return len(self.activity.sessions_in_flight()) > self.output_turns

    def _charge(self, turn: TurnTimeline, chunks: list[ChunkRead], budget: float) -> float:
        """The slice's cost: off the device's bank, onto the turn whose round it ran at (on the
        ration's thread that turn may have ended meanwhile: then the bank alone pays)."""
        spent = sum(c.cost_s for c in chunks)
        with self._mu:
            self._bank -= spent
        try:
            self.activity.record_ration(turn.request_id, spent, len(chunks), budget)
        except UnknownRequest:
            if not self.thread:
                raise
        return spent
