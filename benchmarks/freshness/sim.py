"""One session's timeline through the service's own schedulers, on a simulated clock.

The parts are the service's: the container builds the ``ShadowService`` with its ``HostActivity``,
``IdleScheduler``, ``RationedScheduler``, ``ModelSlot`` and the ``Shadow`` facade, as ``shadow serve``
does; only two providers are overridden, as the service tests do: the clock (a ``SimClock``) and
the reader (a ``SimReader``: the ``Reader`` protocol with the session bookkeeping of the real one
and no maths, each chunk moving the clock on by its given cost).

The host is driven as an engine drives the service: ``arrived`` at the request's time (an event
on the clock, so a chunk of the idle window in flight at that moment ends first and the next
does not start), ``started`` with the rendered prompt, ``first_token``, ``round_ended`` every
``round_ids`` output ids spread over the decode (the ration reads there, and its reading pauses
the decode), ``finished``. The idle loop looks every ``idle_poll_s`` as ``IdleLoop`` does (a look,
then a wait); while no whole chunk is pending its looks are skipped arithmetically, keeping their
phase, since the idle window would find nothing to do until the next feed.

Delays the shadow causes (a request waiting for a chunk in flight, the ration's pauses) push the
rest of the session later: the host's gaps stay as they were.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dependency_injector import providers

from benchmarks.freshness.timelines import SessionTimeline
from shadow.adapters.tokens import N_VOCAB
from shadow.container import build_container
from shadow.core.session import SessionBook
from shadow.core.settings import ShadowSettings
from shadow.core.shadow import Shadow

ChunkCost = Callable[[int], float]  # seconds to read the chunk that starts at this row


class SimClock:
    """Time that moves only when told; events fire when it passes them, in order."""

    def __init__(self) -> None:
        self.t = 0.0
        self._due: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.t

    def at(self, t: float, event: Callable[[], object]) -> None:
        heapq.heappush(self._due, (t, next(self._seq), event))

    def advance_to(self, t: float) -> None:
        while self._due and self._due[0][0] <= t:
            when, _, event = heapq.heappop(self._due)
            self.t = max(self.t, when)
            event()
        self.t = max(self.t, t)

    def advance(self, dt: float) -> None:
        self.advance_to(self.t + dt)


class _NoTensors:
    def nbytes(self) -> int:
        return 0


class SimReader:
    """The ``Reader`` protocol with the real reader's bookkeeping (commit a chunk, take the wanted
    checkpoints) and no maths: a chunk costs ``cost(first_row)`` seconds of the simulated clock, a
    pass of several sessions ``pass_cost(first_rows)`` (default: their chunks' costs summed), a span
    of k chunks of one session ``span_cost(k, first_row)`` (default: ``pass_cost`` of its chunks)."""

    def __init__(self, grid: int, cost: ChunkCost, clock: SimClock, max_batch: int = 1,
                 pass_cost: Callable[[Sequence[int]], float] | None = None, spans: Sequence[int] = (),
                 span_cost: Callable[[int, int], float] | None = None) -> None:
        self.grid = grid
        self.cost = cost
        self.clock = clock
        self.max_batch = max_batch
        self.pass_cost = pass_cost or (lambda rows: sum(cost(r) for r in rows))
        self.spans = tuple(spans)
        self.span_cost = span_cost or (lambda k, row: self.pass_cost([row + i * grid for i in range(k)]))
        self.on_chunk: Callable[[int, float], None] = lambda committed, now: None
        # each pass: its (book, tensors) (a span's session once a chunk), the clock after it, its cost
        self.on_pass: Callable[[Sequence[tuple[SessionBook, Any]], float, float], None] = \
            lambda batch, now, cost: None

    @property
    def vocab_size(self) -> int:
        return N_VOCAB

    @property
    def weights_hash(self) -> str:
        return "simulated"

    @property
    def dtype(self) -> str:
        return "bfloat16"

    def new_session(self) -> _NoTensors:
        return _NoTensors()

    def warm_up(self) -> float:
        return 0.0  # nothing to capture: the service's start-up is outside the timeline

    @property
    def attention(self) -> str:
        return "simulated"  # no kernel runs

    @property
    def fingerprint(self) -> str:
        return "simulated"  # no arithmetic: nothing parked here is restored under another

    def batch_sizes(self) -> dict[int, str]:
        return dict.fromkeys(sorted({1, self.max_batch}), "ok")  # nothing captured, nothing to check

    def read_chunk(self, book: SessionBook, tensors: Any) -> float:
        if book.pending < self.grid:
            raise ValueError("no whole chunk pending")
        cost = self.cost(book.committed)
        self.clock.advance(cost)
        book.committed_chunk()
        self.checkpoint_if_due(book, tensors)
        self.on_chunk(book.committed, self.clock())
        self.on_pass([(book, tensors)], self.clock(), cost)
        return cost

    def read_chunks(self, batch: Sequence[tuple[SessionBook, Any]]) -> float:
        if any(book.pending < self.grid for book, _ in batch):
            raise ValueError("no whole chunk pending")
        cost = self.pass_cost([book.committed for book, _ in batch])
        self.clock.advance(cost)
        for book, tensors in batch:
            book.committed_chunk()
            self.checkpoint_if_due(book, tensors)
        self.on_pass(batch, self.clock(), cost)
        return cost

    def read_span(self, book: SessionBook, tensors: Any, chunks: int) -> float:
        start, end = book.committed, book.committed + chunks * self.grid
        if chunks not in self.spans or book.pending < end - start:
            raise ValueError(f"a span of {chunks} chunks: not taken, or not pending")
        if any(start < w < end for w in book.wanted):
            raise ValueError("a checkpoint line falls inside the span")
        cost = self.span_cost(chunks, start)
        self.clock.advance(cost)
        for _ in range(chunks):
            book.committed_chunk()
        self.checkpoint_if_due(book, tensors)
        self.on_chunk(book.committed, self.clock())
        self.on_pass([(book, tensors)] * chunks, self.clock(), cost)
        return cost

    def checkpoint_if_due(self, book: SessionBook, tensors: Any) -> None:
        if book.checkpoint_due():
            book.took_checkpoint()

    def roll_back(self, tensors: Any, resume_at: int) -> None:
        pass  # no tensors: the book already stands at resume_at

    def sync(self) -> None:
        pass

    def fresh(self, ids: list[int]) -> dict[str, Any]:
        return {}  # the service's warm-up at load: outside the timeline, free

    def _no_maths(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError("the simulated reader does no maths: questions and states are not simulated")

    fork_logits = fork_decode = export = probabilities = serialise = deserialise = _no_maths


class FacadeView:
    """Everything this benchmark asks of the ``Shadow`` facade, in one place (its API is moving)."""

    def __init__(self, shadow: Shadow) -> None:
        self.shadow = shadow

    def committed(self, session: str) -> int:
        status = self.shadow.session_status(session)
        return 0 if status is None else status.committed

    def whole_chunk_pending(self) -> bool:
        return any(b >= self.shadow.grid for b in self.shadow.backlogs().values())


@dataclass
class Policy:
    ration_pct: float  # 0: the idle window only
    scope: str = "turn"  # the ration's (RATION_SCOPE): one session at a time, per turn as first designed
    spans: bool = False  # a pass of one session may read several of its chunks (``Reader.read_span``)
    gather: int = 1  # device-wide: a slice waits for this many chunks pending (RATION_GATHER)
    gather_ms: float = 0.0  # ... at most this long (RATION_GATHER_MS)
    output_turns: int = 1  # the ration reads Qwen's output too while at most this many requests run

    @property
    def name(self) -> str:
        return "idle" if self.ration_pct == 0 else "idle+ration"


@dataclass
class Knobs:
    grid: int = 512
    round_ids: int = 8
    max_round_s: float = 1.0  # a slow decode still has a round this often (the host's clock sees events)
    idle_poll_s: float = 0.2
    idle_window_s: float = 2.0
    slice_ms: float = 150.0
    gaps: str = "real"  # "none": each request arrives when the one before it ends


@dataclass
class TurnRecord:
    index: int
    behind: int  # ids held before the turn, kept by its prompt, not read when it started
    new_ids: int  # the prompt's ids past what the session held
    prompt_line: int  # the prompt's last grid line
    read_s: float | None = None  # start -> the prompt's last grid line read (None: nothing new to read)
    superseded: bool = False  # a later prompt dropped the line before it was read
    request_wait_s: float = 0.0  # the request waited this long for an idle chunk in flight
    spent_s: float = 0.0  # the ration this turn used
    since_first_token_s: float = 0.0  # first token -> finished, as the host reported it (the ration's base)
    rollback: bool = False


@dataclass
class SessionRun:
    name: str
    policy: Policy
    chunk_ms: float
    turns: list[TurnRecord] = field(default_factory=list)
    idle_chunks: int = 0
    ration_chunks: int = 0
    tail_s: float = 0.0  # after the last turn, until every whole chunk is read
    tail_chunks: int = 0  # read by the idle window in that time


def _build(policy: Policy, knobs: Knobs, reader: SimReader, clock: SimClock, home: str) -> tuple[Any, Any]:
    settings = ShadowSettings(_env_file=None, model="simulated", dir=home, grid=knobs.grid, disk="off",
                              trace="none", profiles="", ration=policy.ration_pct / 100, ration_scope=policy.scope,
                              ration_gather=policy.gather, ration_gather_ms=policy.gather_ms,
                              ration_output_turns=policy.output_turns,
                              ration_thread=False,  # slices read in the round: the simulated clock is one thread's
                              slice_ms=knobs.slice_ms, idle_poll_s=knobs.idle_poll_s,
                              idle_window_s=knobs.idle_window_s)
    container = build_container(settings)
    container.clock.override(providers.Object(clock))
    container.reader.override(providers.Object(reader))
    service = container.service()
    if container.slot().load() is None:
        raise RuntimeError(f"the simulated shadow did not load: {container.slot().error}")
    return container, service


def replay_session(tl: SessionTimeline, policy: Policy, cost: ChunkCost, chunk_ms: float,
                   knobs: Knobs | None = None) -> SessionRun:
    k = knobs or Knobs()
    clock = SimClock()
    reader = SimReader(k.grid, cost, clock)
    run = SessionRun(tl.name, policy, chunk_ms)
    watching: list[tuple[TurnRecord, float]] = []  # (turn, its start) until its prompt line is read

    def on_chunk(committed: int, now: float) -> None:
        for rec, t0 in [w for w in watching if committed >= w[0].prompt_line]:
            rec.read_s = now - t0
            watching.remove((rec, t0))

    reader.on_chunk = on_chunk
    with tempfile.TemporaryDirectory(prefix="shadow-freshness-") as home:
        container, service = _build(policy, k, reader, clock, home)
        view = FacadeView(container.slot().get())
        session = "s"
        look = 0.0  # the idle loop's next look

        def idle_until(t: float) -> None:
            nonlocal look
            while look < t:
                if not view.whole_chunk_pending():  # nothing for the idle window until the next feed
                    if t != math.inf:
                        look += k.idle_poll_s * math.ceil((t - look) / k.idle_poll_s)
                    break
                clock.advance_to(look)
                chunks = service.idle_step()
                run.idle_chunks += len(chunks)
                look = clock() + k.idle_poll_s

        for i, turn in enumerate(tl.turns):
            rid = f"r{i}"
            due = clock() if k.gaps == "none" else turn.start_s + (clock() - tl.turns[i - 1].end_s if i else 0.0)
            arrival = max(due, clock())
            clock.at(arrival, functools.partial(service.arrived, rid))
            idle_until(arrival)
            clock.advance_to(arrival)
            started_at = clock()  # after the idle chunk in flight, if one was
            keep = turn.keep
            _, fed = service.started(rid, session, ids=turn.prompt_ids)
            committed = view.committed(session)
            line = len(turn.prompt_ids) // k.grid * k.grid
            rec = TurnRecord(i, max(0, keep - committed), len(turn.prompt_ids) - keep, line,
                             request_wait_s=started_at - arrival, rollback=fed.rollback)
            for old, t0 in list(watching):
                if old.prompt_line > keep:  # this prompt dropped what that one's line covered
                    old.superseded = True
                    watching.remove((old, t0))
            if line > keep:
                if committed >= line:
                    rec.read_s = 0.0
                else:
                    watching.append((rec, started_at))
            run.turns.append(rec)

            clock.advance_to(started_at + (turn.first_token_s - turn.start_s))  # the prefill: no reading
            service.first_token(rid)
            decode_s = turn.end_s - turn.first_token_s
            n = max(1, math.ceil(len(turn.output_ids) / k.round_ids), math.ceil(decode_s / k.max_round_s))
            out = turn.output_ids
            pieces = [out[j * len(out) // n:(j + 1) * len(out) // n] for j in range(n)]  # spread evenly
            dt = decode_s / n
            for piece in pieces:
                clock.advance(dt)
                got = service.round_ended(rid, piece)  # the ration reads here, pausing the decode
                run.ration_chunks += got.chunks
            done = service.finished(rid)
            assert done.first_token_s is not None and done.finished_s is not None
            rec.spent_s = done.spent_s
            rec.since_first_token_s = done.finished_s - done.first_token_s
            look += k.idle_poll_s * max(0, math.ceil((clock() - look) / k.idle_poll_s))  # busy looks

        end, before = clock(), run.idle_chunks
        idle_until(math.inf)
        run.tail_s, run.tail_chunks = clock() - end, run.idle_chunks - before
        for rec, _ in watching:
            rec.superseded = True  # a line past what the session ended with (cannot happen: kept as a guard)
        container.shutdown_resources()
    return run


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]
