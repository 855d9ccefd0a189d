"""The narrator on its own slices: a real session with thoughts (mini-swe-agent on Gemini 3, its
reasoning rendered by the Qwen3.5 chat template), fed round by round as an engine would, on a fake
clock. One summary per finished thought, each admitted by the ration's arithmetic with the
narrator's share, the committed state untouched by the fork; and the summaries as server-sent
events over a real loopback server (the API's app and the proxy's)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from shadow.adapters.narrator import MAX_CHARS
from shadow.adapters.records import Narration
from shadow.adapters.tokens import THINK_END
from shadow.adapters.transcripts import Turn, load_transcript, render_turns
from shadow.api.app import KEEP_ALIVE_S, create_app
from shadow.api.client import ShadowClient
from shadow.api.server import BackgroundServer
from shadow.core.errors import ShadowError
from shadow.core.plan import ReadPlan
from shadow.proxy.app import create_proxy_app
from tests.conftest import FakeClock, Spans, joined, make_container, make_settings, wait_until

SESSION = "sessions/raw/mini-swe-agent-gemini3-swebench/django__django-12741.traj.json"
TURNS = 3  # two thoughts of 120 and 164 ids, then an empty one (the model closed it at once)
ROUND = 8  # ids a decode round
# Qwen's time a round on the fake clock. The tiny model on a shared CPU is far slower than the 0.8B
# on a GPU, so Qwen is slowed as much: the share then admits summaries as it would there.
ROUND_S = 20.0
MAX_TOKENS = 6
GRID = 256  # reads the tiny model 2 to 4 times faster on the CPU than the service tests' 64


@pytest.fixture(scope="module")
def turns(request: pytest.FixtureRequest) -> list[Turn]:
    shared = request.getfixturevalue("shared_data")
    return render_turns(load_transcript(shared / SESSION)[0], indices=range(TURNS))


def feed_turn(host: Any, clock: FakeClock, rid: str, session: str, turn: Turn, round_s: float = ROUND_S) -> None:
    """One turn as an engine reports it: queued, prefill, first token, rounds of ``ROUND`` ids."""
    host.arrived(rid)
    host.started(rid, session, ids=turn.prompt_ids)
    clock.advance(1.0)  # the prefill
    host.first_token(rid)
    out = turn.output_ids
    rounds = [out[i:i + ROUND] for i in range(0, len(out), ROUND)]
    for ids in rounds[:-1]:
        clock.advance(round_s)
        host.round_ended(rid, ids)
    host.finished(rid, rounds[-1])


def loaded(checkpoint: Path, tmp: Path, clock: FakeClock, spans: Spans | None = None, **kw: Any) -> Any:
    c = make_container(make_settings(checkpoint, tmp, grid=GRID, narrator="on", narrator_max_tokens=MAX_TOKENS,
                                     **kw), clock, spans)
    svc = c.service()
    svc.idle_step()
    assert c.slot().state == "loaded"
    return c, svc


def states_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_one_summary_per_thought_within_the_share_and_the_state_untouched(
        checkpoint: Path, tmp_path: Path, clock: FakeClock, spans: Spans, turns: list[Turn]) -> None:
    c, svc = loaded(checkpoint, tmp_path, clock, spans)
    shadow = c.shadow()
    got: list[Narration] = []

    def check(n: Narration) -> None:  # on the round's thread, right after the fork
        ids = shadow.session_ids("s")
        assert ids[n.at - 1] == THINK_END
        states_equal(shadow.export_state("s"), shadow.fresh_state(ids[:n.committed]))
        got.append(n)

    svc.on_narration(check)
    for k, turn in enumerate(turns):
        feed_turn(svc, clock, f"r{k}", "s", turn)
        svc.idle_step()  # the gap between turns: the idle window reads

    thoughts = [t.output_ids.count(THINK_END) for t in turns]
    assert thoughts == [1] * TURNS  # one thought a turn, so one summary a turn
    assert [(n.request_id, n.thought) for n in got] == [(f"r{k}", k + 1) for k in range(TURNS)]
    for k, n in enumerate(got):
        assert "\n" not in n.text and len(n.text) <= MAX_CHARS and 1 <= len(n.ids) <= MAX_TOKENS
        assert n.at == len(turns[k].prompt_ids) + turns[k].output_ids.index(THINK_END) + 1
        # forked at the thought's end, unless it waited and the ration read past it meanwhile
        assert n.extra_ids == 0 or (n.waited_rounds > 0 and n.committed > n.at)
        # admitted by the ration's arithmetic with the narrator's share (3 % since the first token)
        assert n.turn_spent_ms == 0.0  # one thought a turn
        assert n.budget_ms == pytest.approx(0.03 * n.since_first_token_ms)
        if k == 0:
            assert n.estimate_ms is None  # nothing measured yet: it starts on any budget, first of its slice
        else:
            assert n.estimate_ms is not None and n.estimate_ms <= n.budget_ms
    st = svc.status().narrator
    assert st is not None
    assert st.summaries == TURNS and st.skipped == {} and st.waiting == 0 and st.failed == 0
    assert st.spent_ms == pytest.approx(sum(n.cost_ms for n in got))
    marks = spans.all("shadow.narration")
    assert [s.attributes["shadow.narrator.spent_ms"] for s in marks] == [n.cost_ms for n in got]
    assert [s.attributes["shadow.narrator.budget_ms"] for s in marks] == [n.budget_ms for n in got]
    # the forks left nothing behind: once read, the session is a fresh prefill of its ids
    shadow.read(ReadPlan("s"))
    states_equal(shadow.export_state("s"), shadow.fresh_state(shadow.session_ids("s")))


def test_the_fork_leaves_every_state_tensor_as_it_was(checkpoint: Path, tmp_path: Path, clock: FakeClock,
                                                      turns: list[Turn]) -> None:
    c, svc = loaded(checkpoint, tmp_path, clock, ration=0.0)  # no ration: only the narrator touches it
    shadow = c.shadow()
    svc.feed_prompt("s", turns[0].prompt_ids)
    shadow.read(ReadPlan("s"))
    svc.arrived("r")
    svc.started("r", "s", ids=turns[0].prompt_ids)
    clock.advance(1.0)
    svc.first_token("r")
    cut = turns[0].output_ids.index(THINK_END) + 1
    thought = turns[0].output_ids[:cut]
    svc.round_ended("r", thought[:-1])
    before, committed = shadow.export_state("s"), shadow.position("s").committed
    assert shadow.position("s").pending + 1 < c.settings().grid  # so the narrator has no chunk to read
    clock.advance(30.0)
    svc.round_ended("r", thought[-1:])
    assert svc.status().narrator.summaries == 1
    assert shadow.position("s").committed == committed
    states_equal(shadow.export_state("s"), before)
    svc.finished("r")


def test_a_summary_waits_for_its_budget_and_is_skipped_when_the_turn_ends_first(
        checkpoint: Path, tmp_path: Path, clock: FakeClock, turns: list[Turn]) -> None:
    # no ration: the reader stands still, so a waiting summary's estimate does not move
    _, svc = loaded(checkpoint, tmp_path, clock, ration=0.0)
    got: list[Narration] = []
    svc.on_narration(got.append)
    feed_turn(svc, clock, "r0", "s", turns[0])  # the first summary: its costs are measured
    assert len(got) == 1
    # Turn 2: the thought ends in the first round; its budget comes with the rounds after it.
    svc.arrived("r1")
    svc.started("r1", "s", ids=turns[1].prompt_ids)
    svc.first_token("r1")
    start = clock()
    out = turns[1].output_ids
    cut = out.index(THINK_END) + 1
    svc.round_ended("r1", out[:cut])
    assert len(got) == 1 and svc.status().narrator.waiting == 1
    since = [0.0]
    for i in range(cut, len(out) - 1):
        clock.advance(1.0)
        since.append(clock() - start)
        svc.round_ended("r1", out[i:i + 1])
        if len(got) == 2:
            break
    assert len(got) == 2, "the summary never fitted"
    n = got[1]
    assert n.waited_rounds == len(since) - 1 > 0
    assert n.estimate_ms is not None and n.estimate_ms <= n.budget_ms == pytest.approx(0.03 * since[-1] * 1e3)
    assert 0.03 * since[-2] * 1e3 < n.estimate_ms  # the round before, it did not fit
    svc.finished("r1", out[i + 1:])
    # Turn 3 finishes before its thought's summary fits: skipped, and counted.
    svc.arrived("r2")
    svc.started("r2", "s", ids=turns[2].prompt_ids)
    svc.first_token("r2")
    clock.advance(0.001)
    svc.finished("r2", turns[2].output_ids)
    st = svc.status().narrator
    assert st is not None
    assert len(got) == 2 and st.summaries == 2 and st.skipped == {"budget": 1} and st.waiting == 0


def test_narrator_off_writes_nothing(checkpoint: Path, tmp_path: Path, clock: FakeClock, turns: list[Turn]) -> None:
    c = make_container(make_settings(checkpoint, tmp_path, grid=GRID), clock)
    svc = c.service()
    svc.idle_step()
    got: list[Narration] = []
    svc.on_narration(got.append)
    feed_turn(svc, clock, "r0", "s", turns[0])
    assert got == [] and svc.status().narrator.summaries == 0


class Events:
    """A client of the event stream (``ShadowClient.narrations``) on its own thread: it reads
    ``expect`` narration events, then goes away (closes its connection)."""

    def __init__(self, url: str, expect: int, session: str | None = None) -> None:
        self.expect = expect
        self.got: list[Narration] = []
        self.subscribed = threading.Event()
        self.client = ShadowClient(url)
        self.thread = threading.Thread(target=self._read, args=(session,), daemon=True)
        self.thread.start()
        assert self.subscribed.wait(30), "the stream never said it subscribed"

    def _read(self, session: str | None) -> None:
        with contextlib.suppress(httpx.HTTPError):
            for event in self.client.narrations(session, on_open=self.subscribed.set):
                self.got.append(event)
                if len(self.got) == self.expect:
                    return

    def join(self) -> None:
        joined(self.thread, "an event stream reader")
        self.client.close()


@pytest.mark.parametrize("front", ["api", "proxy"])
def test_narration_streams_as_server_sent_events(checkpoint: Path, tmp_path: Path, turns: list[Turn],
                                                 front: str) -> None:
    settings = make_settings(checkpoint, tmp_path, grid=GRID, narrator="on", narrator_max_tokens=MAX_TOKENS,
                             idle_poll_s=0.05)
    clock = FakeClock()  # the budget's clock; the host's calls advance it from this thread
    c = make_container(settings, clock)
    app = create_app(c) if front == "api" else create_proxy_app("http://127.0.0.1:9", c)
    with BackgroundServer(app) as server, ShadowClient(server.url) as host:
        wait_until(lambda: host.status().slot.state == "loaded", "the model to load", 60)
        mine = Events(server.url, 2, "s")
        other = Events(server.url, 1, "other")
        assert host.status().narrator.subscribers == 2
        feed_turn(host, clock, "r0", "s", turns[0])
        feed_turn(host, clock, "o0", "other", turns[0])
        feed_turn(host, clock, "r1", "s", turns[1])
        mine.join()
        other.join()
        # a client that went away is unsubscribed
        wait_until(lambda: host.status().narrator.subscribers == 0, "the streams to unsubscribe", 30)
        summaries = [n for n in host.status().narrator.last if n.session == "s"]
    # (the client checks each event's name and id: "narration", "s/1")
    assert [(e.session, e.thought) for e in mine.got] == [("s", 1), ("s", 2)]
    assert mine.got == summaries
    assert all("\n" not in e.text and len(e.text) <= MAX_CHARS for e in mine.got)
    assert [(e.session, e.request_id) for e in other.got] == [("other", "o0")]


def test_decode_at_a_thoughts_end_is_decoding_a_session_that_ends_there(checkpoint: Path, tmp_path: Path,
                                                                        clock: FakeClock, turns: list[Turn]) -> None:
    c, svc = loaded(checkpoint, tmp_path, clock)
    shadow = c.shadow()
    whole = turns[0].prompt_ids + turns[0].output_ids
    at = len(turns[0].prompt_ids) + turns[0].output_ids.index(THINK_END) + 1
    shadow.feed_prompt("whole", whole)
    shadow.feed_prompt("cut", whole[:at])
    prompt = svc.narrator.prompt_ids()
    assert shadow.decode("whole", prompt, MAX_TOKENS, at=at) == shadow.decode("cut", prompt, MAX_TOKENS)
    assert shadow.position("whole").committed == shadow.position("cut").committed  # the tail read stops there
    shadow.read(ReadPlan("whole"))
    passed = shadow.position("whole").committed - 1
    with pytest.raises(ShadowError, match=f"cannot decode at {passed}"):  # the reader is past it
        shadow.decode("whole", prompt, MAX_TOKENS, at=passed)


def test_an_open_stream_does_not_hold_the_servers_stop(checkpoint: Path, tmp_path: Path) -> None:
    c = make_container(make_settings(checkpoint, tmp_path, grid=GRID, narrator="on"))
    server = BackgroundServer(create_app(c), on_exit=c.service().closing)
    server.start()
    stream = Events(server.url, 1)
    t0 = time.monotonic()
    server.stop()
    assert not server.thread.is_alive() and time.monotonic() - t0 < KEEP_ALIVE_S  # no keep-alive needed
    stream.join()  # the stream ended with the server
    assert stream.got == []
