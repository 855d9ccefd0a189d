"""The host interface and the ration's arithmetic, pure Python on a simulated clock."""

from __future__ import annotations

import threading

import pytest

from shadow.core.errors import BadInput
from shadow.core.host import IDLE_RANK, HostActivity, RankedLock, TurnTimeline, UnknownRequest
from shadow.core.scheduling import IdleLoop, fits, ration_budget
from tests.conftest import FakeClock, joined, wait_until


def test_ranked_lock_serves_lowest_rank_first_then_arrival_order() -> None:
    lock = RankedLock()
    assert lock.acquire(0)
    order: list[str] = []
    threads = []
    for name, rank in [("idle", IDLE_RANK), ("req-a", 0), ("summary", 1), ("req-b", 0)]:
        def take(name: str = name, rank: int = rank) -> None:
            lock.acquire(rank)
            order.append(name)
            lock.release()
        t = threading.Thread(target=take)
        t.start()
        threads.append(t)
        wait_until(lambda: lock.waiting() >= len(threads), f"{name} to queue on the lock", 10, poll_s=0.001)
    assert lock.waiting() == 4 and lock.waiting(below_rank=IDLE_RANK) == 3
    lock.release()
    for t in threads:
        joined(t, "a thread queued on the lock", 5)
    assert order == ["req-a", "req-b", "summary", "idle"]


def test_ranked_lock_timeout_leaves_the_queue() -> None:
    lock = RankedLock()
    lock.acquire()
    assert not lock.acquire(IDLE_RANK, timeout=0.01)
    assert not lock.acquire(IDLE_RANK, timeout=0)
    assert lock.waiting() == 0
    lock.release()
    assert lock.acquire(IDLE_RANK, timeout=0) and lock.locked
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()


def test_activity_counts_waiting_running_holds() -> None:
    clock = FakeClock()
    a = HostActivity(clock=clock, stale_s=60)
    assert not a.busy()
    a.record_arrived("r1")
    assert a.counts() == (1, 0, 0) and a.busy()
    with pytest.raises(BadInput):
        a.record_arrived("r1")
    a.record_started("r1", "s", prompt_len=100)
    assert a.counts() == (0, 1, 0)
    a.record_arrived("r2")
    with pytest.raises(BadInput, match="not started"):
        a.record_first_token("r2")
    clock.advance(2.0)
    assert a.record_first_token("r1").first_token_s == clock.t
    t = a.record_round_ended("r1", 8)
    assert (t.rounds, t.output_len) == (1, 8)
    done = a.record_finished("r1", 3)
    assert done.output_len == 11 and done.finished_s == clock.t
    assert a.counts() == (1, 0, 0)  # r2 still waits
    clock.advance(61)  # a host that died with r2 queued: forgotten after stale_s
    assert a.counts() == (0, 0, 0)
    with pytest.raises(UnknownRequest):
        a.record_finished("r2")
    hold = a.record_hold(ttl_s=5)
    assert a.busy()
    clock.advance(6)
    assert not a.busy()
    with pytest.raises(UnknownRequest):
        a.record_hold_released(hold)
    with a.holding():
        assert a.counts()[2] == 1
    assert not a.busy()


def test_engine_lock_waiters_count_as_waiting() -> None:
    a = HostActivity()
    a.engine_lock.acquire(0)
    t = threading.Thread(target=lambda: (a.engine_lock.acquire(0), a.engine_lock.release()))
    t.start()
    wait_until(lambda: a.engine_lock.waiting() > 0, "the thread to queue on the engine lock", 10, poll_s=0.001)
    assert a.waiting() == 1 and a.busy()
    a.engine_lock.release()
    joined(t, "the thread queued on the engine lock", 5)
    assert not a.busy() and a.out_of_the_way(timeout=1)


def test_ration_budget_counts_from_the_first_token() -> None:
    turn = TurnTimeline("r", started_s=0.0)
    assert ration_budget(turn, now=20.0) == 0.0  # a 20 s prefill earns nothing
    turn.first_token_s = 17.0
    assert ration_budget(turn, now=20.0) == pytest.approx(0.06)
    turn.spent_s = 0.05
    assert ration_budget(turn, now=20.0) == pytest.approx(0.01)
    assert ration_budget(turn, now=117.0) == pytest.approx(0.150)  # a slice is at most 150 ms
    turn.spent_s = 5.0
    assert ration_budget(turn, now=117.0) == 0.0


def test_fits_whole_chunks_from_the_last_cost() -> None:
    assert fits(0.0, None, 0.001)  # no cost known yet: one chunk may start
    assert not fits(0.01, None, 1.0)
    assert fits(0.1, 0.04, 0.15) and not fits(0.12, 0.04, 0.15)
    assert not fits(0.0, 0.01, 0.0)


def test_idle_loop_steps_until_stopped() -> None:
    seen = threading.Event()
    errors: list[BaseException] = []
    calls = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("one bad window")
        if len(calls) >= 3:
            seen.set()

    loop = IdleLoop(step, poll_s=0.001, on_error=errors.append)
    loop.start()
    assert seen.wait(5), "the idle loop did not step three times in 5 s"
    loop.stop()
    assert not loop.running and len(errors) == 1 and loop.ticks >= 3


def test_a_turn_is_written_only_through_the_activity_and_its_lock() -> None:
    clock = FakeClock()
    a = HostActivity(clock=clock)
    a.record_started("r", "s", 10)
    turn = a.record_first_token("r")
    assert a.record_ration("r", 0.004, 2, 0.010) is turn
    a.record_ration("r", 0.001, 1, 0.003)
    assert (turn.spent_s, turn.chunks, turn.budget_s) == (pytest.approx(0.005), 3, 0.003)  # summed; the last budget
    a.record_host_time("r", 0.25)
    a.record_host_time("r", 0.5)
    done = a.record_finished("r", 4, host_s=0.125)
    assert done.host_s == 0.875 and done.output_len == 4
    with pytest.raises(UnknownRequest):  # a finished turn is no longer written
        a.record_host_time("r", 1.0)
    a.record_arrived("q")
    with pytest.raises(BadInput, match="has not started"):
        a.record_ration("q", 0.1, 1, 0.1)
    # status hands out copies: what a reader holds does not change under the lock
    a.record_started("q", "s")
    snap = a.status().turns[0]
    a.record_ration("q", 0.1, 1, 0.2)
    assert snap.spent_s == 0.0 and a.turn("q").spent_s == 0.1
