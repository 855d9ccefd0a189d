"""When the reader may read: the ``Scheduler`` seam, the ration's arithmetic, and what a scheduler
reports about each chunk (``Telemetry``). Pure Python; the schedulers live in
``shadow.backends.schedulers`` and the spans in ``shadow.adapters.telemetry``.

Two windows (docs/architecture.md, promise 6):

- ``idle``: no request runs or waits and no hold is on; reads at most ``idle_window_s`` and checks
  before every pass whether a request waits, so a request waits at most one pass.
- ``ration``: decided between two of the host's decode rounds (read there or on its own thread):
  device-wide, at most ``share`` of the time during which any followed request decodes (per turn, the first
  design: of the time since the turn's first token), less what was used, in slices of at most
  ``slice_s``, whole passes only, each pass's cost estimated from the facade's table of costs by
  batch size and depth (``shadow.core.costs``).

Each builds a ``ReadPlan`` (``shadow.core.plan``) that ``Shadow.read``, the one loop, carries out: schedule,
read, account.

Nothing here sleeps or reads a clock of its own: time comes in as arguments or as an injected
clock, so the same code runs under a simulated timeline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .costs import fits
from .protocols import Scheduler, Span, Telemetry, Window
from .records import Answer, ChunkRead, TurnTimeline, WindowStatus

__all__ = ["Scheduler", "Span", "Telemetry", "Window", "fits"]  # the seams, defined with the others in protocols

Clock = Callable[[], float]

SHARE = 0.02  # a turn's ration (RATION_SCOPE=turn), and the narrator's arithmetic
DEVICE_SHARE = 0.08  # the device's ration (README: "The default share")
SLICE_S = 0.150
IDLE_POLL_S = 0.2
IDLE_WINDOW_S = 2.0


class _NullSpan:
    def set(self, key: str, value: Any) -> None:
        pass


class NullTelemetry:
    """Records nothing (traces off)."""

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Span]:
        yield _NullSpan()

    def chunk(self, window: Window, chunk: ChunkRead, backlog_after: int, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None = None) -> None:
        pass

    def count(self, name: str, value: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        pass

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        pass


class AskSpan:
    """The ``shadow.ask`` span of one question, whoever asks it (a host, the router)."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def answered(self, answer: Answer) -> None:
        self.span.set("shadow.ask.label", answer.label)
        self.span.set("shadow.ask.probability", float(answer.probs[answer.label]))
        self.span.set("shadow.ask.behind", answer.behind)
        self.span.set("shadow.ask.latency_ms", answer.latency_ms)

    def failed(self, err: BaseException) -> None:
        self.span.set("shadow.ask.error", str(err))


@contextmanager
def ask_span(telemetry: Telemetry, kind: str, session: str, choices: Sequence[str]) -> Iterator[AskSpan]:
    """A ``shadow.ask`` span; ``kind`` is who asks (``ask``: a host; ``router``: the router's question)."""
    with telemetry.span("shadow.ask", {"gen_ai.operation.name": "chat", "shadow.ask.kind": kind,
                                       "gen_ai.conversation.id": session,
                                       "shadow.ask.choices": list(choices)}) as span:
        yield AskSpan(span)


def ration_budget(turn: TurnTimeline, now: float, share: float = SHARE, slice_s: float = SLICE_S,
                  spent_s: float | None = None) -> float:
    """Seconds this slice may use: ``share`` of the time since the turn's first token, less what
    the turn used already (``spent_s``; by default the reader's ``turn.spent_s``: the narrator
    passes its own), at most ``slice_s``; 0 before the first token."""
    if turn.first_token_s is None:
        return 0.0
    earned = share * max(0.0, now - turn.first_token_s)
    used = turn.spent_s if spent_s is None else spent_s
    return max(0.0, min(slice_s, earned - used))


@dataclass
class WindowStats:
    """Chunks and measured seconds read per window, for status and the demo's summary (several
    request threads add to the ration's at once)."""

    windows: int = 0
    chunks: int = 0
    rows: int = 0
    spent_s: float = 0.0
    _mu: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, chunks: list[ChunkRead]) -> None:
        with self._mu:
            if chunks:
                self.windows += 1
            self.chunks += len(chunks)
            self.rows += sum(c.rows for c in chunks)
            self.spent_s += sum(c.cost_s for c in chunks)

    def status(self) -> WindowStatus:
        with self._mu:
            return WindowStatus(self.windows, self.chunks, self.rows, round(self.spent_s * 1e3, 3))


class IdleLoop:
    """Runs a scheduler's ``step`` every ``poll_s`` on a thread of its own until ``stop``.

    Between steps it waits on its stop event for ``poll_s`` of real time (not the schedulers' clock):
    ``stop`` ends the wait at once, and no other sleep hides in the loop."""

    def __init__(self, step: Callable[[], object], poll_s: float = IDLE_POLL_S,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.step = step
        self.poll_s = poll_s
        self.on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="shadow-idle", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as err:  # the loop outlives one bad window; the error goes to status
                if self.on_error is not None:
                    self.on_error(err)
            self.ticks += 1
            self._stop.wait(self.poll_s)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def epoch_ns() -> int:
    """Span timestamps (OpenTelemetry wants epoch nanoseconds); never used for a budget."""
    return time.time_ns()
