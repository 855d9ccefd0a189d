"""The timed sequence of ``read_rate``, one walk up the depths, and the two kinds of side that walk it:
the shadow through its facade, and the peer (``peer``).

At each stop the side is brought to exactly that depth (untimed, nothing pending), then: the
300-id question (when the plan asks it there), the fork decode (likewise), then consecutive chunks
from that depth. Every clock read is preceded by a device sync.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from shadow import Shadow
from shadow.core.plan import ReadPlan

FIGURES = ("chunk", "question300", "fork_decode_token")


GRID = 512


@dataclass(frozen=True)
class Plan:
    """Where the walk stops and what it times there."""

    depths: tuple[int, ...]  # chunk figures
    question_depths: tuple[int, ...] = ()
    decode_depth: int | None = None
    chunks: int = 7  # consecutive chunks timed at each depth
    repeats: int = 5  # questions and decodes timed at each depth
    decode_n: tuple[int, int] = (8, 40)
    matmul_n: int = 8192
    copy_bytes: int = 2**30
    session: str = ""  # the exactness check's session file
    session_max_tokens: int = 0

    def stops(self) -> list[int]:
        extra = (self.decode_depth,) if self.decode_depth is not None else ()
        out = sorted(set(self.depths) | set(self.question_depths) | set(extra))
        for a, b in itertools.pairwise(out):
            if a in self.depths and a + self.chunks * GRID > b:
                raise ValueError(f"the chunks timed at {a} pass the next depth {b}")
        return out

    def depth0(self) -> Plan:
        """The same repeats, the chunk at depth 0 only (the larger shapes)."""
        return replace(self, depths=(0,), question_depths=(), decode_depth=None)


class Side(Protocol):
    notes: list[str]

    def sync(self) -> None: ...
    def advance_to(self, depth: int) -> bool: ...
    def prepare_chunks(self, k: int) -> None: ...
    def chunk(self) -> None: ...
    def fork(self) -> Any: ...
    def question(self, fork: Any, ids: list[int]) -> None: ...
    def decode_ms(self, prompt: list[int], plan: Plan) -> float | None: ...


def timed_ms(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e3


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def run_steps(side: Side, plan: Plan, qids: list[int], prompt: list[int],
              figures: dict[str, dict[int, float | None]]) -> None:
    """Walk ``plan``'s stops; ``figures[figure][depth]`` gets each median in ms."""
    for f in FIGURES:
        figures.setdefault(f, {})
    for depth in plan.stops():
        if not side.advance_to(depth):
            break  # the side says why in its notes
        if depth in plan.question_depths:
            times = []
            for _ in range(plan.repeats):
                fork = side.fork()

                def ask(fork: Any = fork) -> None:
                    side.question(fork, qids)

                times.append(timed_ms(ask, side.sync))
            figures["question300"][depth] = median(times)
        if depth == plan.decode_depth:
            figures["fork_decode_token"][depth] = side.decode_ms(prompt, plan)
        if depth in plan.depths:
            side.prepare_chunks(plan.chunks)
            figures["chunk"][depth] = median([timed_ms(side.chunk, side.sync) for _ in range(plan.chunks)])


class ShadowSide:
    """The shadow through its public calls only: feeds, ``read``, ``ask``, ``decode``."""

    def __init__(self, sh: Shadow, ids: list[int], session: str, grid: int) -> None:
        self.sh, self.ids, self.session, self.grid = sh, ids, session, grid
        self.fed = 0
        self.notes: list[str] = []

    def sync(self) -> None:
        self.sh.sync()

    def _feed_to(self, n: int) -> None:
        if n <= self.fed:
            return
        if self.fed == 0:
            self.sh.feed_prompt(self.session, self.ids[:n])
        else:
            self.sh.feed_output(self.session, self.ids[self.fed:n])
        self.fed = n

    def advance_to(self, depth: int) -> bool:
        if depth < self.fed:
            raise ValueError(f"{self.session} is at {self.fed} already, past {depth}")
        self._feed_to(depth)
        if self.fed:
            self.sh.read(ReadPlan(self.session))
        self.sync()
        return True

    def prepare_chunks(self, k: int) -> None:
        self._feed_to(self.fed + k * self.grid)

    def chunk(self) -> None:
        got = self.sh.read(ReadPlan(self.session, max_chunks=1))
        if len(got) != 1:
            raise RuntimeError(f"expected one chunk read, got {len(got)}")

    def fork(self) -> None:
        return None  # the facade forks inside ask and decode

    def question(self, fork: Any, ids: list[int]) -> None:
        self.sh.ask(self.session, ids, ["A", "B"])

    def decode_ms(self, prompt: list[int], plan: Plan) -> float | None:
        """(median time of max_new=N2 - that of N1) / (tokens returned by N2 - by N1)."""
        times: dict[int, float] = {}
        lens: dict[int, int] = {}
        for n in plan.decode_n:
            got: list[int] = []

            def run(n: int = n, got: list[int] = got) -> None:
                got[:] = self.sh.decode(self.session, prompt, max_new=n)

            times[n] = median([timed_ms(run, self.sync) for _ in range(plan.repeats)])
            lens[n] = len(got)
        n1, n2 = plan.decode_n
        if lens[n2] <= lens[n1]:
            self.notes.append(f"fork decode stopped on a stop id after {lens[n2]} tokens: no per-token figure")
            return None
        return (times[n2] - times[n1]) / (lens[n2] - lens[n1])

    def close(self) -> None:
        self.sh.forget(self.session)


class PeerRunner:
    """The peer's side of the walk, with a depth it is not taken past and out-of-memory handled as
    a skip (said in ``notes``) rather than the end of the run."""

    def __init__(self, side: Any, max_depth: int | None, grid: int) -> None:
        self.side = side
        self.grid = grid
        self.max_depth = max_depth
        self.notes: list[str] = []

    def sync(self) -> None:
        self.side.sync()

    def advance_to(self, depth: int) -> bool:
        if self.max_depth is not None and depth > self.max_depth:
            note = f"peer: depths above {self.max_depth} skipped"
            if note not in self.notes:
                self.notes.append(note)
            return False
        try:
            self.side.advance_to(depth)
        except torch.cuda.OutOfMemoryError:
            self.side.restart()
            self.max_depth = depth - 1
            self.notes.append(f"peer: out of GPU memory on the way to depth {depth}; that depth and above skipped")
            torch.cuda.empty_cache()
            return False
        return True

    def prepare_chunks(self, k: int) -> None:
        pass

    def chunk(self) -> None:
        self.side.chunk(self.grid)

    def fork(self) -> Any:
        return self.side.fork()

    def question(self, fork: Any, ids: list[int]) -> None:
        self.side.question(fork, ids)

    def decode_ms(self, prompt: list[int], plan: Plan) -> float | None:
        n1, n2 = plan.decode_n
        return median(self.side.decode_steps(self.side.fork(), prompt, n2 - n1))
