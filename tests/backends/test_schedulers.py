"""The idle window and the ration with the real (tiny, real-vocabulary) model and a simulated clock.

Built through the container with providers overridden (clock, tracer provider, telemetry), never
patched. Costs are the reader's own measurements; the clock only moves when a test moves it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from dependency_injector import providers

from shadow.adapters.service import ShadowUnavailable
from shadow.adapters.telemetry import SpanTelemetry
from shadow.backends.schedulers import IdleScheduler, RationedScheduler
from shadow.core.host import HostActivity, RankedLock
from shadow.core.plan import ReadPlan
from shadow.core.records import ChunkRead
from shadow.core.scheduling import Window
from tests.conftest import CHUNK_S, GRID, FakeClock, Spans, ids, joined, make_container, make_settings, wait_until


def loaded(checkpoint: Path, tmp_path: Path, clock: FakeClock | None, spans: Spans | None, **kw: Any) -> Any:
    c = make_container(make_settings(checkpoint, tmp_path, **kw), clock, spans)
    svc = c.service()
    assert svc.idle_step() == [] and c.slot().state == "loaded"  # the first idle window loads the model
    return c, svc


class ArriveAfter:
    """Telemetry that announces a request once the idle window has read ``k`` chunks."""

    def __init__(self, inner: SpanTelemetry, k: int) -> None:
        self.inner, self.k, self.n = inner, k, 0
        self.activity: HostActivity | None = None

    def span(self, name: str, attributes: Mapping[str, Any]) -> Any:
        return self.inner.span(name, attributes)

    def chunk(self, window: Window, chunk: ChunkRead, backlog_after: int, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None = None) -> None:
        self.inner.chunk(window, chunk, backlog_after, start_ns, end_ns, attributes)
        self.n += 1
        if self.n == self.k and self.activity is not None:
            self.activity.record_arrived("came-in")

    def count(self, name: str, value: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        self.inner.count(name, value, labels)

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        self.inner.observe(name, value, labels)


class CallAfterPass(ArriveAfter):
    """Telemetry that, once a pass's chunk is told (on the reading thread, the facade held), starts
    ``call`` on a thread of its own and returns once that call waits for the facade: a caller
    coming mid-read, however it reaches the facade."""

    def __init__(self, inner: SpanTelemetry, call: Any = None) -> None:
        super().__init__(inner, k=0)
        self.call, self.lock, self.caller = call, None, None
        self.passes: set[int] = set()

    def chunk(self, window: Window, chunk: ChunkRead, backlog_after: int, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None = None) -> None:
        self.inner.chunk(window, chunk, backlog_after, start_ns, end_ns, attributes)
        self.passes.add(start_ns)
        if self.call is not None and self.caller is None:
            lock = self.lock
            self.caller = threading.Thread(target=self.call)
            self.caller.start()
            wait_until(lambda: lock.waiting == 1, "the caller to wait for the facade")


# ---- the slot --------------------------------------------------------------------------------------

def test_model_loads_in_an_idle_window_soon_after_start_not_on_a_request(checkpoint, tmp_path, clock):
    c = make_container(make_settings(checkpoint, tmp_path), clock)
    svc = c.service()
    assert c.slot().state == "empty"
    prompt = ids(5 * GRID + 9)
    _, fed = svc.started("r1", "s", prompt)  # the request's path does not load the model
    assert fed.followed and fed.queued and c.slot().state == "empty"
    svc.first_token("r1")
    clock.advance(10)
    assert svc.round_ended("r1", ids(8, 1)).chunks == 0 and c.slot().state == "empty"
    with pytest.raises(ShadowUnavailable, match="loading"):
        svc.ask("s", "Done? A: yes, B: no.", ["A", "B"])
    svc.finished("r1")
    assert svc.idle_step() == [] and c.slot().state == "loaded"  # the first idle window loads it
    assert svc.status().sessions["s"].ids == len(prompt) + 8  # what came meanwhile, replayed
    assert len(svc.idle_step()) == 5
    assert svc.ask("s", "Done? A: yes, B: no.", ["A", "B"]).behind == 17


def test_no_profile_on_no_early_load(checkpoint, tmp_path, clock):
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("chat: {}\ncoding:\n  shadow: {mode: off}\n")
    c = make_container(make_settings(checkpoint, tmp_path, profiles=str(profiles), profile="chat"), clock)
    svc = c.service()
    assert svc.idle_step() == [] and c.slot().state == "empty" and not c.slot().due
    assert svc.feed_prompt("s", ids(100)).reason == "profile"


def test_narrator_model_shares_one_slot_and_one_copy(checkpoint, tmp_path, clock):
    c, svc = loaded(checkpoint, tmp_path, clock, None, narrator_model=str(checkpoint))
    assert svc.status().slot.shared_with == ["narrator"]
    assert c.shadow().reader.model is c.model()


# ---- the idle window -------------------------------------------------------------------------------

def test_a_call_coming_during_an_idle_window_waits_for_the_pass_in_flight_not_the_window(
        checkpoint, tmp_path, clock, spans):
    """A call that is no request (a question, a status look, a session fed by name) does not shut
    the window; it waits for the pass in flight, and the window ends there."""
    c = make_container(make_settings(checkpoint, tmp_path), clock, spans)
    told = CallAfterPass(SpanTelemetry(spans.provider))
    c.telemetry.override(providers.Object(told))
    svc = c.service()
    svc.idle_step()
    svc.feed_prompt("s", ids(20 * GRID))
    told.lock = c.slot().get().residency.lock
    fed: list[Any] = []
    told.call = lambda: fed.append(svc.feed_prompt("t", ids(2 * GRID, 4)))
    read = svc.idle_step()
    joined(told.caller, "the call")
    assert len(told.passes) == 1 and 1 <= len(read) < 20 and fed[0].followed
    assert svc.idle_step() != []  # nothing shuts the window: the next one reads on


def test_a_request_arriving_during_an_idle_read_waits_at_most_one_chunk(checkpoint, tmp_path, clock, spans):
    c = make_container(make_settings(checkpoint, tmp_path), clock, spans)
    recorder = ArriveAfter(SpanTelemetry(spans.provider), k=3)
    c.telemetry.override(providers.Object(recorder))
    svc = c.service()
    recorder.activity = c.activity()
    svc.idle_step()
    svc.feed_prompt("s", ids(20 * GRID))
    read = svc.idle_step()
    assert len(read) == 3  # the request came while the third chunk was read: no fourth
    [window] = spans.all("shadow.window")
    assert window.attributes["shadow.window.stopped_for"] == "request"
    assert svc.idle_step() == []  # it waits: the window stays shut
    c.activity().record_started("came-in", "s")
    c.activity().record_finished("came-in")
    assert len(svc.idle_step()) == 17


def test_a_request_on_another_thread_waits_for_the_chunk_in_flight_only(checkpoint, tmp_path, spans):
    c, svc = loaded(checkpoint, tmp_path, None, spans)  # the real clock
    svc.feed_prompt("s", ids(120 * GRID))
    reader = threading.Thread(target=svc.idle_step)
    reader.start()
    wait_until(spans.chunks, "the idle window's first chunk", poll_s=0.001)
    arrived = time.time_ns()
    svc.arrived("r1")
    assert c.activity().out_of_the_way(timeout=10)  # the barrier a request passes before its prefill
    through = time.time_ns()
    joined(reader, "the idle window's thread")
    chunks = spans.chunks("idle")
    after = [s for s in chunks if s.start_time > arrived]
    assert len(after) <= 1, "a chunk started after the request came, besides the one already deciding"
    assert all(s.end_time <= through for s in chunks)  # the barrier let it pass only once reading stopped
    assert len(chunks) < 120


def test_the_idle_window_reads_at_most_its_length(checkpoint, tmp_path, clock, spans):
    _, svc = loaded(checkpoint, tmp_path, clock, spans, idle_window_s=0.03)
    svc.feed_prompt("s", ids(60 * GRID))
    for _ in range(3):
        read = svc.idle_step()
        assert read
        longest = max(ch.cost_s for ch in read)
        assert sum(ch.cost_s for ch in read) <= 0.03 + longest
    assert sum(ch.attributes["shadow.chunk.rows"] for ch in spans.chunks("idle")) == \
        svc.status().sessions["s"].committed


def test_the_idle_window_stays_shut_while_busy(checkpoint, tmp_path, clock):
    c, svc = loaded(checkpoint, tmp_path, clock, None, idle_poll_s=0.01)
    a = c.activity()
    svc.feed_prompt("s", ids(10 * GRID))
    with svc.hold():
        assert svc.idle_step() == []
    assert a.box_lock.acquire(blocking=False)
    assert svc.idle_step() == []  # the box lock is taken without waiting, or not at all
    a.box_lock.release()
    a.engine_lock.acquire(0)
    assert svc.idle_step() == []  # behind the engine lock's holder, for lock_wait_s at most
    a.engine_lock.release()
    svc.started("r", "s", ids(10 * GRID))
    assert svc.idle_step() == []  # a request runs
    svc.finished("r")
    assert len(svc.idle_step()) == 10


def test_over_the_cap_without_a_disk_the_idle_window_goes_quiet(checkpoint, tmp_path, clock, spans):
    c, svc = loaded(checkpoint, tmp_path / "one", clock, None)
    svc.feed_prompt("x", ids(10 * GRID))
    svc.idle_step()
    size = c.shadow().resident_bytes()
    c, svc = loaded(checkpoint, tmp_path, clock, spans, gb=2.5 * size / 2**30)  # room for two of three
    for i, name in enumerate("abc"):
        svc.feed_prompt(name, ids(10 * GRID, i))
    per_step = [len(svc.idle_step()) for _ in range(20)]
    assert per_step[0] <= 30 and per_step[1:] == [0] * 19  # the one dropped is not read again unused
    windows = len(spans.all("shadow.window"))
    assert windows == 1  # and no window opens for nothing once the host stops feeding
    dropped = [n for n in "abc" if svc.status().sessions[n].where == "dropped"]
    assert len(dropped) == 1
    svc.feed_output(dropped[0], ids(5, 9))  # used again: the idle window reads it
    assert len(svc.idle_step()) == 10 and svc.status().sessions[dropped[0]].committed == 10 * GRID


# ---- the ration ------------------------------------------------------------------------------------

def test_the_ration_spends_at_most_its_share_in_slices_prompt_then_output(checkpoint, tmp_path, clock, spans):
    c, svc = loaded(checkpoint, tmp_path, clock, spans, ration_scope="turn", ration=0.02)  # the first design
    svc.feed_prompt("other", ids(6 * GRID, 7))  # another session's backlog: not this turn's to read
    prompt = ids(30 * GRID + 20, 1)
    svc.started("r1", "s", prompt)
    clock.advance(17.0)  # a long prefill earns nothing
    assert svc.round_ended("r1", ids(8, 2)).chunks == 0  # the first token came with this round
    first = c.activity().turn("r1").first_token_s
    # The simulated decode runs until the ration has read the prompt and some output (a chunk costs
    # the test's 4 ms, whatever this machine's load); the bound only stops a runaway loop.
    rounds = 4_000
    out = ids(8 * rounds, 3)
    for k in range(rounds):
        clock.advance(0.05)
        r = svc.round_ended("r1", out[8 * k: 8 * k + 8])
        turn = c.activity().turn("r1")
        read = spans.chunks("ration")
        longest = max((s.attributes["shadow.chunk.device_ms"] for s in read), default=0.0) / 1e3
        assert turn.spent_s <= 0.02 * (clock() - first) + longest + 1e-9
        assert r.spent_ms <= 150.0 + longest * 1e3
        if read and read[-1].attributes["shadow.chunk.part"] == "output":
            break
    read = spans.chunks("ration")
    assert len(read) > 31  # the whole prompt, then output
    assert {s.attributes["gen_ai.conversation.id"] for s in read} == {"s"}
    assert svc.status().sessions["other"].committed == 0
    rows = [s.attributes["shadow.chunk.first_row"] for s in read]
    assert rows == sorted(rows) and rows[0] == 0
    parts = [s.attributes["shadow.chunk.part"] for s in read]
    order = {"prompt": 0, "prompt+output": 1, "output": 2}
    assert [order[p] for p in parts] == sorted(order[p] for p in parts) and parts[0] == "prompt"
    spent_in_spans = sum(s.attributes["shadow.chunk.device_ms"] for s in read) / 1e3
    assert spent_in_spans == pytest.approx(c.activity().turn("r1").spent_s)
    for sl in spans.all("shadow.ration"):
        assert sl.attributes["shadow.ration.budget_ms"] <= 150.0 + 1e-9


@pytest.mark.parametrize("scope", ["turn", "device"])
def test_with_more_requests_running_the_ration_reads_no_further_than_the_prompts_grid_line(
        checkpoint, tmp_path, clock, spans, scope):
    """With two requests running (more than RATION_OUTPUT_TURNS, 1) the ration stops at each latest
    prompt's line (the settled end): an agent's next prompt rewrites Qwen's output, so it is left to
    the idle window, and to questions, which read it."""
    c, svc = loaded(checkpoint, tmp_path, clock, spans, ration_scope=scope, ration=0.05)
    svc.started("r1", "s", ids(4 * GRID + 20, 1))
    svc.started("r2", "t", ids(GRID + 7, 2))
    for rid in ("r1", "r2"):
        svc.first_token(rid)
    out = ids(8 * 600, 3)
    for k in range(600):  # far more decode time than the prompts need: 10 chunks of output each
        clock.advance(0.05)
        for rid in ("r1", "r2"):
            svc.round_ended(rid, out[8 * k: 8 * k + 8])
    read = spans.chunks("ration")
    rows = sorted((s.attributes["gen_ai.conversation.id"], s.attributes["shadow.chunk.first_row"]) for s in read)
    assert rows == [("s", 0), ("s", GRID), ("s", 2 * GRID), ("s", 3 * GRID), ("t", 0)]
    status = svc.status().sessions
    assert status["s"].committed == 4 * GRID and status["s"].backlog == 20 + len(out)
    assert status["t"].committed == GRID and status["t"].backlog == 7 + len(out)
    assert not c.ration().may_read(c.activity().turn("r1"), status["s"].backlog, GRID)  # quiet rounds stay quiet
    svc.finished("r2")  # one request left running: its output is read too
    clock.advance(1.0)
    svc.round_ended("r1", [])
    assert svc.status().sessions["s"].committed > 4 * GRID
    svc.finished("r1")
    svc.idle_step()  # the idle window, which costs the host nothing, reads the rest
    assert all(line.backlog < GRID for line in svc.status().sessions.values())


def test_a_slice_is_at_most_150_ms_and_starts_whole_chunks_on_the_estimate(checkpoint, tmp_path, clock, spans):
    _, svc = loaded(checkpoint, tmp_path, clock, spans)
    svc.started("r1", "s", ids(400 * GRID, 4))
    svc.first_token("r1")
    clock.advance(100.0)  # 2 s earned: the slice caps it
    r = svc.round_ended("r1", [])
    [sl] = spans.all("shadow.ration")
    assert sl.attributes["shadow.ration.budget_ms"] == pytest.approx(150.0) == r.budget_ms
    read = spans.chunks("ration")
    assert len(read) == r.chunks > 1
    spent = 0.0
    for s in read:  # each chunk started only if the spent time plus its estimate (the last cost) fit
        est = s.attributes["shadow.chunk.estimate_ms"]
        assert est < 0 or spent + est <= 150.0 + 1e-9
        spent += s.attributes["shadow.chunk.device_ms"]
    assert sl.attributes["shadow.ration.spent_ms"] == pytest.approx(spent) == pytest.approx(r.spent_ms)
    worst_miss = max(max(0.0, s.attributes["shadow.chunk.device_ms"] - s.attributes["shadow.chunk.estimate_ms"])
                     for s in read if s.attributes["shadow.chunk.estimate_ms"] >= 0)
    assert spent <= 150.0 + worst_miss


def test_the_device_is_synchronised_before_the_first_chunk_of_a_slice(checkpoint, tmp_path, clock, spans):
    c, svc = loaded(checkpoint, tmp_path, clock, spans)
    events: list[str] = []
    ration = RationedScheduler(c.slot(), c.activity(), SpanTelemetry(spans.provider), clock,
                               sync=lambda: events.append("sync"))
    original = ration.telemetry.chunk

    def chunk(*args: Any, **kw: Any) -> None:
        events.append("chunk")
        original(*args, **kw)

    ration.telemetry.chunk = chunk  # type: ignore[method-assign]
    svc.feed_prompt("s", ids(10 * GRID, 5))
    turn = c.activity().record_started("r", "s", 10 * GRID)
    assert ration.step(turn) == [] and events == []  # before the first token: nothing, not even a sync
    c.activity().record_first_token("r")
    clock.advance(5.0)
    assert ration.step(turn)
    assert events[0] == "sync" and events.count("sync") == 1 and events.count("chunk") >= 1


def test_a_host_shares_its_own_locks(checkpoint, tmp_path, clock):
    engine, box = RankedLock(), threading.Lock()
    c = make_container(make_settings(checkpoint, tmp_path, idle_poll_s=0.01), clock)
    c.activity.override(providers.Object(HostActivity(clock=clock, engine_lock=engine, box_lock=box)))
    svc = c.service()
    svc.idle_step()
    svc.feed_prompt("s", ids(3 * GRID))
    with box:  # the host loads a model: the idle window does not wait for the box
        assert svc.idle_step() == []
    with engine.held(0):  # the engine holds its lock around a prefill, and says so
        svc.started("r", "s", ids(4 * GRID), barrier=False)
        assert svc.idle_step() == []
    svc.finished("r")
    assert len(svc.idle_step()) == 4


# ---- the device-wide ration ------------------------------------------------------------------------

def test_the_device_ration_alone_keeps_many_turns_fresh_within_one_share(checkpoint, tmp_path, clock, spans):
    """Four requests decode at once and no idle window ever opens: the one ration of the device reads
    the turns in flight (most behind first), then the session used last, and stays within its share
    of the time during which something decoded, however many turns were in flight."""
    share = 0.10
    c, svc = loaded(checkpoint, tmp_path, clock, spans, ration=share)
    svc.feed_prompt("earlier", ids(2 * GRID + 5, 9))  # a session used before, not in flight now
    turns = [f"r{i}" for i in range(4)]
    for i, rid in enumerate(turns):
        svc.started(rid, f"s{i}", ids((i + 1) * GRID + 5, i))
        svc.first_token(rid)
    a = c.activity()
    out = {rid: ids(8 * 120, 10 + i) for i, rid in enumerate(turns)}
    for k in range(120):  # one engine step: every request's round, 8 ids each
        clock.advance(0.05)
        for rid in turns:
            svc.round_ended(rid, out[rid][8 * k: 8 * k + 8])
    status = svc.status().sessions
    # fresh to the prompt's line, by the ration alone; the output is the idle window's (settled ids only)
    assert all(status[f"s{i}"].committed == (i + 1) * GRID for i in range(4))
    assert all(status[f"s{i}"].backlog == 5 + len(out[f"r{i}"]) for i in range(4))
    assert status["earlier"].committed == 2 * GRID  # and the session used last, once they were
    read = spans.chunks("ration")
    assert spans.chunks("idle") == []
    first_other = next(i for i, s in enumerate(read) if s.attributes["shadow.chunk.part"] == "other"
                       and s.attributes["gen_ai.conversation.id"] == "earlier")
    prompts = {f"s{i}": (i + 1) * GRID for i in range(4)}
    before = [s for s in read[:first_other] if s.attributes["shadow.chunk.first_row"] < prompts.get(
        s.attributes["gen_ai.conversation.id"], 0)]
    assert len(before) == sum(p // GRID for p in prompts.values())  # every prompt read before it
    spent = sum(a.turn(rid).spent_s for rid in turns)
    assert spent == pytest.approx(sum(s.attributes["shadow.chunk.device_ms"] for s in read) / 1e3)
    assert spent <= share * a.decoding_s() + CHUNK_S + 1e-9  # one share for the device, not one a turn
    for sl in spans.all("shadow.ration"):
        assert sl.attributes["shadow.ration.budget_ms"] <= 150.0 + 1e-9
        assert sl.attributes["shadow.ration.scope"] == "device"


def test_a_quiet_device_wide_round_looks_when_another_session_has_a_chunk_to_read(checkpoint, tmp_path, clock):
    c, svc = loaded(checkpoint, tmp_path, clock, None)
    ration = c.ration()
    svc.started("r1", "s", ids(GRID // 2, 1))
    svc.first_token("r1")
    clock.advance(10.0)
    turn = c.activity().turn("r1")
    assert not ration.may_read(turn, GRID // 2, GRID)  # nothing anywhere: a quiet round
    svc.feed_prompt("other", ids(GRID, 2))
    assert ration.may_read(turn, GRID // 2, GRID)  # its own session is fresh, another is not
    assert svc.round_ended("r1", [5]).chunks == 1  # the look reads the other session
    assert svc.status().sessions["other"].committed == GRID


def test_the_idle_window_reads_in_batches_and_each_session_ends_as_a_fresh_prefill(checkpoint, tmp_path, clock, spans):
    """A reader that takes four sessions a pass: the idle window reads three sessions at different
    depths together, and each ends bit for bit as a fresh prefill of its ids (with the batched
    forward in place of the reader's loop, this is its promise through the service)."""
    c = make_container(make_settings(checkpoint, tmp_path), clock, spans)
    reader = c.reader()
    reader._eager_batch = 4  # the torch forward reads a pass's sessions one after the other
    svc = c.service()
    svc.idle_step()  # the load
    for i, chunks in enumerate((1, 3, 5)):
        svc.feed_prompt(f"s{i}", ids(chunks * GRID + 7, i))
    read = svc.idle_step()
    assert [ch.batch for ch in read] == [3, 3, 3, 2, 2, 2, 2, 1, 1]  # passes of 3, 2, 2, 1, 1
    assert [s.attributes["shadow.chunk.batch"] for s in spans.chunks("idle")] == [ch.batch for ch in read]
    sh = c.shadow()
    for i in range(3):
        got, want = sh.export_state(f"s{i}"), sh.fresh_state(sh.session_ids(f"s{i}"))
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), f"s{i}"


def test_a_device_wide_slice_gathers_chunks_then_reads_them_in_one_pass_or_reads_when_its_wait_is_over(
        checkpoint, tmp_path, clock, spans):
    c, svc = loaded(checkpoint, tmp_path, clock, spans, ration_gather=3, ration_gather_ms=500)
    c.reader()._eager_batch = 4  # a reader that takes four sessions a pass
    svc.started("r1", "s", ids(GRID // 2, 1))
    svc.first_token("r1")
    clock.advance(10.0)  # the bank fills
    svc.feed_prompt("a", ids(GRID, 2))
    assert svc.round_ended("r1", [5]).chunks == 0  # one chunk pending of three: the slice gathers
    clock.advance(0.3)
    assert svc.round_ended("r1", [5]).chunks == 0
    svc.feed_prompt("b", ids(GRID, 3))
    svc.feed_prompt("c", ids(GRID, 4))
    assert svc.round_ended("r1", [5]).chunks == 3  # three gathered: one pass of three sessions
    assert [s.attributes["shadow.chunk.batch"] for s in spans.chunks("ration")] == [3, 3, 3]
    svc.feed_prompt("d", ids(GRID, 5))
    assert svc.round_ended("r1", [5]).chunks == 0
    clock.advance(0.49)
    assert svc.round_ended("r1", [5]).chunks == 0
    clock.advance(0.01)  # the longest wait, from the round that first found it pending
    assert svc.round_ended("r1", [5]).chunks == 1
    assert {n: svc.status().sessions[n].committed for n in "abcd"} == dict.fromkeys("abcd", GRID)


def test_each_scheduler_decides_its_plan_without_reading():
    """Schedule -> read -> account: a scheduler's decision is its plan, a value a test compares with
    no facade at all (no slot here: nothing can be read)."""
    activity = HostActivity()
    for rid in ("r1", "r2"):
        activity.record_arrived(rid)
    activity.record_started("r1", "s", 3 * GRID)
    turn = activity.turn("r1")
    device = RationedScheduler(None, activity)  # type: ignore[arg-type]
    assert device.plan(turn, 0.05) == ReadPlan(favoured=("s",), budget_s=0.05, whole=True)
    per_turn = RationedScheduler(None, activity, scope="turn", thread=True)  # type: ignore[arg-type]
    assert per_turn.plan(turn, 0.01) == ReadPlan("s", budget_s=0.01, yields=True)
    activity.record_started("r2", "t", GRID)  # two turns run, more than output_turns: below the settled ends
    both = device.plan(turn, 0.05)
    assert sorted(both.favoured) == ["s", "t"] and both.settled and both.whole and not both.yields
    assert per_turn.plan(turn, 0.01) == ReadPlan("s", budget_s=0.01, yields=True, settled=True)
    idle = IdleScheduler(None, activity, window_s=0.3)  # type: ignore[arg-type]
    assert idle.plan() == ReadPlan(budget_s=0.3, first_pass_free=True, yields=True)


def test_a_plan_reads_one_session_or_favours_some_never_both():
    assert ReadPlan(favoured=["a", "b"]) == ReadPlan(favoured=("a", "b"))  # a value, whatever sequence it came as
    assert ReadPlan("a").uses == {"a"} and ReadPlan(favoured=["a", "b"]).uses == {"a", "b"} and not ReadPlan().uses
    with pytest.raises(ValueError, match="not both"):
        ReadPlan("a", favoured=["b"])
    with pytest.raises(TypeError, match="sequence of session names"):
        ReadPlan(favoured="ab")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_chunks"):
        ReadPlan(max_chunks=-1)


def test_gathering_is_refused_where_it_cannot_mean_anything():
    from shadow.core.host import HostActivity

    with pytest.raises(ValueError, match="gather"):
        RationedScheduler(None, HostActivity(), gather=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gather"):
        RationedScheduler(None, HostActivity(), gather=2, gather_s=-1.0)  # type: ignore[arg-type]


def test_on_its_own_thread_a_slice_returns_the_round_at_once_and_charges_the_turn_when_it_ends(
        checkpoint, tmp_path, clock, spans):
    c, svc = loaded(checkpoint, tmp_path, clock, spans)
    gate = threading.Event()  # the slice's first step (its sync) waits here, on the ration's thread
    ration = RationedScheduler(c.slot(), c.activity(), c.telemetry(), clock, sync=gate.wait, thread=True)
    read: list[ChunkRead] = []
    ration.on_read = read.extend
    svc.started("r1", "s", ids(GRID // 2, 1))
    svc.first_token("r1")
    clock.advance(10.0)
    svc.feed_prompt("a", ids(2 * GRID, 2))
    turn = c.activity().turn("r1")
    assert ration.may_read(turn, 0, GRID)
    assert ration.step(turn) == []  # handed over: the call returns while the slice waits
    assert not ration.may_read(turn, 0, GRID)  # rounds stay quiet while it runs
    assert ration.step(turn) == []  # and no second slice starts
    assert svc.status().sessions["a"].committed == 0 and c.activity().turn("r1").spent_s == 0
    gate.set()
    wait_until(lambda: len(read) >= 1 and ration.may_read(turn, 0, GRID) == (len(read) < 2), "the slice's end")
    assert svc.status().sessions["a"].committed == len(read) * GRID
    assert c.activity().turn("r1").spent_s == pytest.approx(sum(ch.cost_s for ch in read))
    assert [s.attributes["gen_ai.conversation.id"] for s in spans.chunks("ration")] == ["a"] * len(read)
    ration.close()


def test_a_service_with_the_ration_on_its_thread_counts_what_it_reads_and_stops_it(checkpoint, tmp_path, clock):
    _, svc = loaded(checkpoint, tmp_path, clock, None, ration_thread=True)
    svc.started("r1", "s", ids(GRID // 2, 1))
    svc.first_token("r1")
    clock.advance(10.0)
    svc.feed_prompt("a", ids(GRID, 2))
    assert svc.round_ended("r1", [5]).chunks == 0  # read beside the round, not in it
    wait_until(lambda: svc.status().windows.ration.chunks == 1, "the ration's thread to read a's chunk")
    assert svc.status().sessions["a"].committed == GRID
    svc.stop()
    assert not any(t.name == "shadow-ration" for t in threading.enumerate())


def test_on_its_own_thread_a_slice_stops_after_the_pass_in_flight_when_a_request_waits(
        checkpoint, tmp_path, clock, spans):
    c, svc = loaded(checkpoint, tmp_path, clock, spans)
    gate = threading.Event()
    ration = RationedScheduler(c.slot(), c.activity(), c.telemetry(), clock, sync=gate.wait, thread=True)
    svc.started("r1", "s", ids(GRID // 2, 1))
    svc.first_token("r1")
    clock.advance(10.0)
    svc.feed_prompt("a", ids(3 * GRID, 2))
    turn = c.activity().turn("r1")
    assert ration.step(turn) == []
    svc.arrived("r2")  # a request waits before the slice's first pass
    gate.set()
    wait_until(lambda: ration.may_read(turn, 0, GRID), "the slice's end")
    assert svc.status().sessions["a"].committed == 0 and spans.chunks("ration") == []
    svc.started("r2", "t", ids(GRID // 2, 3))  # it starts: the next slice reads
    assert ration.step(turn) == []
    wait_until(lambda: svc.status().sessions["a"].committed > 0, "the next slice to read")
    ration.close()


def test_on_its_own_thread_a_slice_stops_after_the_pass_in_flight_when_any_call_waits_for_the_facade(
        checkpoint, tmp_path, clock, spans):
    """A request started without being announced (no ``arrived``: nothing counts it as waiting)
    waits for the slice's pass in flight, not the rest of the slice; what it left unread stays
    pending for the next slice."""
    c = make_container(make_settings(checkpoint, tmp_path), clock, spans)
    told = CallAfterPass(SpanTelemetry(spans.provider))
    c.telemetry.override(providers.Object(told))
    svc = c.service()
    assert svc.idle_step() == [] and c.slot().state == "loaded"
    ration = RationedScheduler(c.slot(), c.activity(), told, clock, thread=True)
    svc.started("r1", "s", ids(GRID // 2, 1))
    svc.first_token("r1")
    clock.advance(1000.0)  # a budget for far more than one pass (the slice's 150 ms bound applies)
    for k, name in enumerate("abcdef"):
        svc.feed_prompt(name, ids(3 * GRID, 10 + k))
    shadow = c.slot().get()
    told.lock = shadow.residency.lock
    started: list[Any] = []
    told.call = lambda: started.append(svc.started("r2", "t", ids(GRID // 2, 3)))
    slices: list[list[ChunkRead]] = []
    ration.on_read = slices.append
    turn = c.activity().turn("r1")
    assert ration.step(turn) == []
    wait_until(lambda: bool(started) and bool(slices), "the request to start and the slice to end")
    read = sum(svc.status().sessions[n].committed for n in "abcdef") // GRID
    assert len(told.passes) == 1 and 1 <= len(slices[0]) == read < 18  # one pass, then it stepped aside
    assert started[0][1].followed
    ration.close()
