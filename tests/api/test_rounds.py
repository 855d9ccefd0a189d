"""Quiet decode rounds (``shadow.adapters.rounds``): a round a look would read nothing at keeps its
ids for the next look. The real tiny model and the service from the container, on a fake clock.

What must hold: the ration reads at exactly the rounds where its own test says it may (checked at
every round against the session's true backlog), the session gets every id once and in order
whoever settles it, and a quiet round refuses what a feed would refuse."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from shadow.core.errors import BadInput
from tests.conftest import GRID, FakeClock, joined, make_container, make_settings, wait_until
from tests.conftest import ids as random_ids

ROUND = 4  # ids a decode round


def loaded(checkpoint: Path, tmp_path: Path, clock: FakeClock, **kw: Any) -> Any:
    c = make_container(make_settings(checkpoint, tmp_path, **kw), clock)
    svc = c.service()
    assert svc.idle_step() == [] and c.slot().state == "loaded"
    return c, svc


def backlog(c: Any, session: str, request_id: str) -> int:
    """The session's true backlog: what the facade counts, plus what quiet rounds keep."""
    held, committed = c.shadow().counts(session)
    open_ = c.service().rounds.get(request_id)
    return held - committed + (len(open_.pending) if open_ is not None else 0)


def test_the_ration_reads_at_the_rounds_its_test_allows_and_the_rest_stay_quiet(checkpoint, tmp_path, clock):
    c, svc = loaded(checkpoint, tmp_path, clock)
    ration, activity = c.ration(), c.activity()
    prompt = random_ids(6 * GRID + 5, 1)
    svc.started("r1", "s", prompt)
    svc.first_token("r1")
    out = random_ids(ROUND * 400, 2)
    quiet = looked = read = 0
    for k in range(400):
        clock.advance(0.05)
        new = out[ROUND * k: ROUND * k + ROUND]
        may = ration.may_read(activity.turn("r1"), backlog(c, "s", "r1") + len(new), GRID)
        r = svc.round_ended("r1", new)
        assert (r.chunks > 0) == may, f"round {k}: the ration's test said {may}, it read {r.chunks} chunks"
        assert r.backlog == backlog(c, "s", "r1")
        open_ = svc.rounds.get("r1")
        quiet += bool(open_.pending)
        looked += not open_.pending
        read += r.chunks
        if k % 97 == 0:  # a status settles: its counts include every id reported so far
            assert svc.status().sessions["s"].ids == len(prompt) + ROUND * (k + 1)
    assert read >= 6 and quiet > 300 and looked >= 6
    done = svc.finished("r1", [7, 8])
    assert done.output_len == len(out) + 2
    assert list(c.shadow().session_ids("s")) == prompt + out + [7, 8]


def test_a_quiet_round_refuses_what_a_feed_refuses_and_loses_nothing(checkpoint, tmp_path, clock):
    c, svc = loaded(checkpoint, tmp_path, clock, max_session_ids=3 * GRID)
    prompt = random_ids(2 * GRID, 3)
    svc.started("r1", "s", prompt)
    svc.first_token("r1")
    svc.round_ended("r1", [11, 12])  # a look: the next rounds may be quiet
    svc.round_ended("r1", [13])
    assert svc.rounds.get("r1").pending == [13]
    vocab = c.shadow().reader.vocab_size
    for bad, said in (([14, -1], r"output\[1\] = -1"), ([vocab], rf"output\[0\] = {vocab} is not a token id"),
                      (["x"], "is not a token id"), ([15] * GRID, "more than QWEN38_SHADOW_MAX_SESSION_IDS")):
        with pytest.raises(BadInput, match=said):
            svc.round_ended("r1", bad)
    svc.round_ended("r1", [16])
    assert svc.finished("r1").output_len == 4  # the refused rounds counted nothing
    assert list(c.shadow().session_ids("s")) == prompt + [11, 12, 13, 16]


def test_settles_from_other_threads_keep_the_order_of_the_rounds(checkpoint, tmp_path, clock):
    c, svc = loaded(checkpoint, tmp_path, clock)
    prompt = random_ids(GRID + 3, 4)
    svc.started("r1", "s", prompt)
    svc.first_token("r1")
    out = random_ids(ROUND * 600, 5)
    stop = threading.Event()
    seen: list[int] = []

    def watch() -> None:  # an HTTP client polling the status while the host decodes
        while not stop.is_set():
            seen.append(svc.status().sessions["s"].ids)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        wait_until(lambda: seen, "the first status")
        for k in range(600):
            svc.round_ended("r1", out[ROUND * k: ROUND * k + ROUND])
            time.sleep(0)  # the host waits on its device here: the GIL is the status thread's
    finally:
        stop.set()
        joined(watcher, "the status thread")
    svc.finished("r1")
    assert list(c.shadow().session_ids("s")) == prompt + out
    assert seen == sorted(seen) and len(set(seen)) > 1  # the counts only grew, and some settles fed


@pytest.mark.parametrize("call", ["feed_output", "feed_prompt", "ask", "narrate", "status", "forget", "stop"])
def test_every_session_call_feeds_the_quiet_rounds_ids_first(checkpoint, tmp_path, clock, call):
    """Each entry point reaches the facade through the one settling method: what the running request's
    quiet rounds kept is in the session before the call acts on it."""
    c, svc = loaded(checkpoint, tmp_path, clock, narrator="on")
    prompt = random_ids(GRID + 5, 4)
    svc.started("r1", "s", prompt)
    svc.first_token("r1")
    svc.round_ended("r1", [11, 12])  # a look
    svc.round_ended("r1", [13, 14])  # quiet: kept
    assert svc.rounds.get("r1").pending == [13, 14]
    sh = c.shadow()
    want = prompt + [11, 12, 13, 14]
    seen: list[tuple[int, ...]] = []
    original = sh.residency.using

    def using(session: str, *args: Any, **kw: Any) -> Any:  # what the session holds when the call uses it
        seen.append(sh.session_ids(session))
        return original(session, *args, **kw)

    sh.residency.using = using  # type: ignore[method-assign]
    if call == "feed_output":
        assert svc.feed_output("s", [15]).ids == len(want) + 1
    elif call == "feed_prompt":
        fed = svc.feed_prompt("s", want + [15])  # the kept ids first: this prompt extends them, no rollback
        assert fed.ids == len(want) + 1 and not fed.rollback
    elif call == "ask":
        committed = sh.position("s").committed
        assert svc.ask("s", "Done? A or B", ["A", "B"]).behind == len(want) - committed
        assert seen and seen[0] == tuple(want)
    elif call == "narrate":
        svc.narrate("s", "Say what happened.", 2)
        assert seen and seen[0] == tuple(want)
    elif call == "status":
        assert svc.status().sessions["s"].ids == len(want)
    elif call == "forget":
        kept = svc.rounds.get("r1")
        svc.forget("s")
        assert kept is not None and kept.closed and kept.pending == []  # fed, then forgotten with the session
        return
    elif call == "stop":
        svc.stop()
        assert sh.position("s").length == len(want)
        return
    assert tuple(sh.session_ids("s"))[:len(want)] == tuple(want)
    assert svc.rounds.get("r1") is None  # settled: the next round looks
