"""The facade's read loop on its own: passes of up to ``max_batch`` sessions, which sessions come
first, the budget, and the one table of chunk costs. The reader here does the bookkeeping only and
costs what the test says (by batch size and depth), so nothing depends on this machine's speed."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shadow.core.costs import ChunkCosts, fits, pass_plan
from shadow.core.host import HostActivity
from shadow.core.plan import ReadPlan
from shadow.core.session import GENERATION_TAIL, SessionBook
from shadow.core.shadow import Shadow
from tests.conftest import FakeClock, wait_until
from tests.core.test_residency import Memory, Tensors

GRID = 64


class CostedReader:
    """The ``Reader``'s bookkeeping (commit, checkpoints) with a cost per pass: ``base`` per chunk,
    plus ``per_row`` for each row below it, times ``share`` per session in a batch of more than one."""

    grid = GRID
    vocab_size = 1000

    def __init__(self, max_batch: int = 4, base: float = 0.003, per_row: float = 1e-7, share: float = 0.5,
                 spans: tuple[int, ...] = ()) -> None:
        self.max_batch = max_batch
        self.spans = spans  # a span of k chunks costs what a batch of k sessions at their depths costs
        self.base, self.per_row, self.share = base, per_row, share
        self.passes: list[list[tuple[int, int]]] = []  # (id of the book, its depth) per session, per pass

    def new_session(self) -> Tensors:
        return Tensors(0)

    def _cost(self, depths: Sequence[int]) -> float:
        each = [self.base + self.per_row * d for d in depths]
        return sum(each) * (self.share if len(depths) > 1 else 1.0)

    def read_chunk(self, book: SessionBook, tensors: Any) -> float:
        return self.read_chunks([(book, tensors)])

    def read_chunks(self, batch: Sequence[tuple[SessionBook, Any]]) -> float:
        assert 1 <= len(batch) <= self.max_batch
        depths = [book.committed for book, _ in batch]
        for book, _ in batch:
            assert book.pending >= self.grid
            book.committed_chunk()
            if book.checkpoint_due():
                book.took_checkpoint()
        self.passes.append([(id(book), d) for (book, _), d in zip(batch, depths, strict=True)])
        return self._cost(depths)

    def read_span(self, book: SessionBook, tensors: Any, chunks: int) -> float:
        start = book.committed
        assert chunks in self.spans and book.pending >= chunks * self.grid
        assert not any(start < w < start + chunks * self.grid for w in book.wanted)
        depths = [start + i * self.grid for i in range(chunks)]
        for _ in range(chunks):
            book.committed_chunk()
        self.checkpoint_if_due(book, tensors)
        self.passes.append([(id(book), d) for d in depths])
        return self._cost(depths)

    def checkpoint_if_due(self, book: SessionBook, tensors: Any) -> None:
        if book.checkpoint_due():
            book.took_checkpoint()

    def roll_back(self, tensors: Any, resume_at: int) -> None:
        pass

    def sync(self) -> None:
        pass


def facade(reader: CostedReader, clock: FakeClock) -> Shadow:
    return Shadow(reader, prompter=None, clock=clock, memory=Memory())  # type: ignore[arg-type]


def fed(sh: Shadow, clock: FakeClock, backlogs: dict[str, int]) -> None:
    for i, (name, chunks) in enumerate(backlogs.items()):
        clock.advance(1.0)  # the later fed, the more recently used
        sh.feed_prompt(name, [(i * 7 + j) % 1000 for j in range(chunks * GRID)])


def test_a_read_takes_passes_of_up_to_max_batch_in_flight_nearest_to_fresh_first_then_most_recently_used() -> None:
    clock = FakeClock()
    reader = CostedReader(max_batch=2)
    sh = facade(reader, clock)
    fed(sh, clock, {"old": 1, "flight-small": 1, "recent": 1, "flight-big": 3})
    got = sh.read(ReadPlan(favoured=["flight-small", "flight-big"]))
    sessions = [c.session for c in got]
    assert sessions == ["flight-small", "flight-big",  # the turns in flight, the one nearest to fresh first
                        "flight-big", "recent",  # then the rest, the most recently used first
                        "flight-big", "old"]
    assert [len(p) for p in reader.passes] == [2, 2, 2] and all(c.batch == 2 for c in got)
    assert [c.first_row for c in got if c.session == "flight-big"] == [0, GRID, 2 * GRID]
    assert sh.backlogs() == dict.fromkeys(["old", "flight-small", "recent", "flight-big"], 0)
    assert sh.lowest_ready_depth() is None and sh.ready() == []


def test_a_settled_read_stops_at_each_sessions_latest_prompt_line() -> None:
    clock = FakeClock()
    reader = CostedReader(max_batch=4, spans=(2, 4))
    sh = facade(reader, clock)
    for name, chunks in (("a", 3), ("b", 1)):  # prompts ending in the generation prompt's tail
        clock.advance(1.0)
        sh.feed_prompt(name, list(range(chunks * GRID + GENERATION_TAIL)))
        sh.feed_output(name, list(range(chunks * GRID - GENERATION_TAIL)))  # Qwen's output: as many more chunks
    assert sh.backlog("a") == 6 * GRID and sh.backlog("a", settled=True) == 3 * GRID
    assert sorted(sh.ready()) == sorted(sh.ready(settled=True)) == ["a", "b"]
    got = sh.read(ReadPlan(favoured=["a"], settled=True))
    assert sorted((c.session, c.first_row) for c in got) == [("a", 0), ("a", GRID), ("a", 2 * GRID), ("b", 0)]
    assert sh.ready(settled=True) == [] and sh.lowest_ready_depth(settled=True) is None
    assert sorted(sh.ready()) == ["a", "b"] and sh.lowest_ready_depth() == GRID  # the output, for the idle window
    assert sh.read(ReadPlan("a", settled=True)) == []
    assert [c.first_row for c in sh.read(ReadPlan("a"))] == [3 * GRID, 4 * GRID, 5 * GRID]


def test_a_chunk_carries_its_share_of_the_pass_and_the_pass_cost_is_kept_once_by_batch_and_depth() -> None:
    clock = FakeClock()
    reader = CostedReader(max_batch=4, base=0.004, per_row=0.0, share=0.5)
    sh = facade(reader, clock)
    assert sh.costs.estimate([0]) is None  # nothing measured: the first pass starts on any budget
    fed(sh, clock, {"a": 2, "b": 2, "c": 2})
    first = sh.read(ReadPlan(max_chunks=3))
    assert [c.batch for c in first] == [3, 3, 3]
    assert sum(c.cost_s for c in first) == pytest.approx(3 * 0.004 * 0.5)
    assert all(c.cost_s == pytest.approx(0.002) for c in first)
    assert sh.costs.estimate([GRID, GRID, GRID]) == pytest.approx(0.006)
    assert sh.costs.per_chunk(3, 0) == pytest.approx(0.002)
    # a batch size never measured is estimated at one session's cost each, once that is known
    assert sh.costs.estimate([0, 0]) == pytest.approx(0.004)
    sh.read(ReadPlan("a"))  # a use of one session: a pass of one, recorded as such
    assert sh.costs.per_chunk(1, GRID) == pytest.approx(0.004)
    assert sh.costs.estimate([0, 0]) == pytest.approx(0.008)


def test_a_pass_shrinks_until_its_estimate_fits_what_is_left_of_the_budget() -> None:
    clock = FakeClock()
    reader = CostedReader(max_batch=4, base=0.010, per_row=0.0, share=1.0)
    sh = facade(reader, clock)
    fed(sh, clock, {"a": 3, "b": 3, "c": 3, "d": 3})
    sh.read(ReadPlan(max_chunks=4))  # measured: 10 ms a session at batch 4
    got = sh.read(ReadPlan(budget_s=0.025, favoured=["a", "b", "c", "d"]))
    # 40 ms for four does not fit 25, nor 30 for three (never measured: 10 each); two fit, then none
    assert [c.batch for c in got] == [2, 2]
    assert sum(c.cost_s for c in got) <= 0.025
    assert sh.read(ReadPlan(budget_s=0.005)) == []  # not even one chunk fits
    assert fits(0.0, None, 0.001) and not fits(0.001, None, 1.0) and not fits(0.0, 0.0, 0.0)


def test_a_whole_read_takes_the_lines_whole_head_or_waits_for_the_budget_to_cover_it() -> None:
    clock = FakeClock()
    reader = CostedReader(max_batch=4, base=0.010, per_row=0.0, share=0.5)
    sh = facade(reader, clock)
    fed(sh, clock, {"a": 2, "b": 2, "c": 2, "d": 2})
    sh.read(ReadPlan(max_chunks=4))  # measured: 5 ms a session at batch 4
    # 20 ms for the four: a 15 ms budget reads nothing whole (a pass of two would have fitted)
    assert sh.read(ReadPlan(budget_s=0.015, favoured=["a", "b", "c", "d"], whole=True)) == []
    assert reader.passes[-1] == reader.passes[0]
    got = sh.read(ReadPlan(budget_s=0.020, favoured=["a", "b", "c", "d"], whole=True))
    assert [c.batch for c in got] == [4, 4, 4, 4] and len(reader.passes) == 2
    # a line shorter than max_batch is the whole head: one session ready reads alone
    sh.feed_output("a", [1] * GRID)
    assert [c.batch for c in sh.read(ReadPlan(budget_s=0.050, whole=True))] == [1]


def test_the_first_pass_may_be_free_and_stop_is_asked_before_every_pass() -> None:
    clock = FakeClock()
    reader = CostedReader(max_batch=1, base=0.010)
    sh = facade(reader, clock)
    fed(sh, clock, {"a": 5})
    sh.read(ReadPlan("a", max_chunks=1))
    assert sh.read(ReadPlan(budget_s=0.001)) == []
    assert len(sh.read(ReadPlan(budget_s=0.001, first_pass_free=True))) == 1  # (the idle window's first pass)
    passes: list[int] = []
    got = sh.read(on_pass=lambda chunks, est, t0, t1: passes.append(len(chunks)), stop=lambda: len(passes) >= 2)
    assert len(got) == 2 and passes == [1, 1]
    assert sh.backlog("a") == GRID


def test_the_cost_table_falls_back_nearest_depth_then_one_session_each() -> None:
    costs = ChunkCosts(bucket=1000)
    costs.record([0], 0.003)
    costs.record([50_000], 0.005)
    costs.record([0, 0, 0, 0], 0.004)
    assert costs.per_chunk(1, 999) == 0.003 and costs.per_chunk(1, 40_000) == 0.005
    assert costs.per_chunk(4, 90_000) == 0.001  # the nearest depth measured at that batch size
    assert costs.estimate([50_000, 50_000]) == pytest.approx(0.010)  # batch 2 unmeasured: alone, each
    assert costs.estimate([0, 2000]) == pytest.approx(0.006)  # a pass is keyed by its mean depth
    assert costs.as_dict() == {"1x0": 3.0, "1x50000": 5.0, "4x0": 1.0}
    with pytest.raises(ValueError):
        costs.record([], 0.1)


def test_a_batch_of_an_uncaptured_size_fills_the_next_size_up_only_past_one_empty_slot() -> None:
    sizes = (1, 2, 4, 8, 16)
    assert pass_plan(3, sizes) == [(4, 3)]  # one pass of 4, not 2 then 1
    assert pass_plan(6, sizes) == [(4, 4), (2, 2)]  # two slots empty would cost more than a pass of 2
    assert pass_plan(11, sizes) == [(8, 8), (4, 3)]
    assert pass_plan(3, sizes, pad=0) == [(2, 2), (1, 1)]  # the reader before: the largest size first
    assert pass_plan(0, sizes) == [] and pass_plan(20, sizes) == [(16, 16), (4, 4)]
    assert pass_plan(3, (1, 2)) == [(2, 2), (1, 1)]  # 4 refused at warm-up: not taken
    for bad in ((2, 4), ()):
        with pytest.raises(ValueError, match="sizes must include 1"):
            pass_plan(3, bad)


@given(st.integers(0, 70), st.sets(st.integers(2, 32), max_size=5), st.integers(0, 3))
def test_a_pass_plan_reads_every_session_once_in_captured_sizes(n: int, more: set[int], pad: int) -> None:
    sizes = (1, *sorted(more))
    plan = pass_plan(n, sizes, pad)
    assert sum(real for _, real in plan) == n
    assert all(size in sizes and 0 < real <= size for size, real in plan)
    assert all(size == real for size, real in plan[:-1])  # only the last pass holds empty slots
    assert all(size - real <= pad for size, real in plan)


def test_decoding_time_counts_once_however_many_turns_decode_at_once() -> None:
    clock = FakeClock(0.0)
    a = HostActivity(clock=clock)
    a.record_started("r1", "s1")
    clock.advance(5.0)  # a prefill: not decoding
    a.record_first_token("r1")
    clock.advance(2.0)
    a.record_started("r2", "s2")
    a.record_round_ended("r2", 3)  # its first token came with this round
    clock.advance(3.0)  # two decode at once: counted once
    assert a.decoding_s() == pytest.approx(5.0)
    a.record_finished("r1")
    clock.advance(1.0)
    a.record_finished("r2")
    clock.advance(10.0)  # nobody decodes
    assert a.decoding_s() == pytest.approx(6.0)
    assert a.sessions_in_flight() == []


def test_a_ration_slice_is_written_through_the_activity() -> None:
    a = HostActivity(clock=FakeClock())
    a.record_started("r1", "s1")
    assert a.sessions_in_flight() == ["s1"]
    a.record_ration("r1", 0.003, 1, 0.01)
    turn = a.record_ration("r1", 0.002, 2, 0.02)
    assert (turn.spent_s, turn.chunks, turn.budget_s) == (pytest.approx(0.005), 3, 0.02)


def test_a_pass_of_one_session_reads_its_chunks_in_the_largest_span_that_fits() -> None:
    """One session behind, the reader taking spans of 2 and 4: a pass reads as many of its chunks
    as the largest span that is pending, fits the budget and ``max_chunks``, and steps over no
    wanted checkpoint line; each chunk keeps its own row and its share; several sessions behind
    read in batches of one chunk each, as before."""
    clock = FakeClock()
    reader = CostedReader(max_batch=4, base=0.004, per_row=0.0, share=0.5, spans=(2, 4))
    sh = facade(reader, clock)
    clock.advance(1.0)
    sh.feed_prompt("long", [7] * (11 * GRID + 5))  # 11 chunks; a checkpoint is wanted at 11 * GRID
    got = sh.read(ReadPlan("long"))
    assert [len(p) for p in reader.passes] == [4, 4, 2, 1]  # 4 + 4 + 2 stop at 10; one more to 11
    assert [c.first_row for c in got] == [i * GRID for i in range(11)]
    assert [c.span for c in got] == [4] * 8 + [2] * 2 + [1] and all(c.batch == 1 for c in got)
    assert got[0].cost_s == pytest.approx(0.002)  # 4 chunks at half a chunk's cost each
    assert sh.position("long").checkpoints == (11 * GRID,)

    sh.feed_output("long", [8] * (6 * GRID))  # 6 more: spans fit the budget, then max_chunks
    assert [c.span for c in sh.read(ReadPlan(budget_s=0.005))] == [2, 2]  # 8 ms for 4 does not fit, 4 for 2 does
    assert [c.span for c in sh.read(ReadPlan(max_chunks=3))] == [2, 2, 1]
    assert [c.span for c in sh.read(ReadPlan("long"))] == [1]  # the last one: no span of 1
    # a checkpoint line inside: the span stops there
    sh.feed_prompt("cut", [9] * (3 * GRID + GENERATION_TAIL))  # wanted at 3 * GRID
    sh.feed_output("cut", [9] * (4 * GRID - GENERATION_TAIL))
    sh.read(ReadPlan("cut"))
    assert [len(p) for p in reader.passes[-3:]] == [2, 1, 4]

    fed(sh, clock, {"a": 2, "b": 2})  # two sessions behind: batches of one chunk each
    assert [(c.batch, c.span) for c in sh.read()] == [(2, 1)] * 4


class GatedReader(CostedReader):
    """A pass that waits for ``go`` once it has begun (``began``): another thread can come to the
    facade while a pass is in flight."""

    def __init__(self) -> None:
        super().__init__(max_batch=1)
        self.began, self.go = threading.Event(), threading.Event()

    def read_chunks(self, batch: Sequence[tuple[SessionBook, Any]]) -> float:
        self.began.set()
        assert self.go.wait(10.0)
        return super().read_chunks(batch)


@pytest.mark.parametrize("yields", [True, False])
def test_a_read_that_yields_stops_after_the_pass_in_flight_once_another_caller_waits(yields: bool) -> None:
    """A background read holds the facade across its passes; with ``yields`` a caller that comes
    mid-pass (here a look at the backlogs, as a status page or a question would) waits for that
    pass only, and the read ends there; without it the caller waits for the whole read."""
    clock = FakeClock()
    reader = GatedReader()
    sh = facade(reader, clock)
    fed(sh, clock, {"a": 2, "b": 2, "c": 2})
    got: list[list[Any]] = []
    background = threading.Thread(target=lambda: got.append(sh.read(ReadPlan(yields=yields))))
    background.start()
    assert reader.began.wait(10.0)
    seen: list[dict[str, int]] = []
    caller = threading.Thread(target=lambda: seen.append(sh.backlogs()))
    caller.start()
    wait_until(lambda: sh.residency.lock.waiting == 1, "the caller to wait for the facade")
    reader.go.set()
    caller.join(10.0)
    background.join(10.0)
    assert not caller.is_alive() and not background.is_alive()
    read = len(got[0])
    assert read == (1 if yields else 6) == len(reader.passes)
    assert sum(seen[0].values()) == (6 - read) * GRID  # what the caller saw is what was left then
    assert sh.residency.lock.waiting == 0
