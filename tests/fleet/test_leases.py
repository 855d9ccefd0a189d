"""Issue 53 point 2: one holder per session, fenced by an epoch. A second instance is refused with
the holder's name; a holder killed (-9) or paused (SIGSTOP) past its lease loses its sessions to the
other, which serves them exactly; the paused one, resumed, parks nothing over the newer state."""

from __future__ import annotations

import json
import signal
import time

import pytest

from shadow.backends.stores.redis_parks import Keys
from shadow.core.errors import HeldElsewhere, LeaseLost
from tests.conftest import wait_until

from .fleet import Instance, exact, make
from .test_store import ids_for


def served(sh, session: str, prompt: list[int], timeout_s: float = 30.0) -> None:
    """Feed ``prompt`` as the router would retry it: refused while another instance's lease lives."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sh.feed_prompt(session, prompt)
            return
        except HeldElsewhere:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_session_held_by_another_live_instance_is_refused_naming_it(ckpt, tmp_path, redis_node):
    a = make(ckpt, tmp_path / "a", redis_node.url, "A", lease_s=2.0)
    b = make(ckpt, tmp_path / "b", redis_node.url, "B", lease_s=2.0)
    a.feed_prompt("s", ids_for(1, 100))
    a.read()
    time.sleep(2.5)  # past one lease: held on by A's renewals, not by the first take
    with pytest.raises(HeldElsewhere, match="held by instance 'A'") as err:
        b.feed_prompt("s", ids_for(1, 150))
    assert err.value.holder == "A" and "s" not in b.sessions()  # B keeps nothing of it
    a.park("s")  # A lets go: B takes it over, from the store
    b.feed_prompt("s", ids_for(1, 150))
    assert b.position("s").committed == 64 and exact(b, "s")
    a.close()
    b.close()


def test_a_stale_park_is_refused_in_the_same_atomic_step(ckpt, tmp_path, redis_node):
    a = make(ckpt, tmp_path / "a", redis_node.url, "A", lease_s=10.0)
    keys = Keys(a.reader.weights_hash)
    a.feed_prompt("s", ids_for(1, 200))
    a.read()
    # another instance's take, as its Lua script would make it: A's lease gone, the epoch moved on
    redis_node.cli("SET", keys.lease("s"), "B:7")
    redis_node.cli("SET", keys.epoch("s"), "7")
    a.park("s")  # refused by the store: A drops its copy, parks nothing
    assert redis_node.cli("EXISTS", keys.manifest("s")) == "0"
    assert a.sharing().stale_parks_refused == 1 and a.status().store.lost == 1
    assert "s" not in a.sessions() and a.disk.disk.park_of("s") is None
    parts = redis_node.cli("KEYS", keys.tag("s") + ":part:*")
    assert parts == ""  # the refused park's parts are gone too
    (tmp_path / "park").write_bytes(b"x" * 1000)
    with pytest.raises(LeaseLost):  # any epoch below the stored one, whatever its bytes
        a.disk.parks.put("s", tmp_path / "park", "0" * 64, {}, 6, "A:6", 1000)
    assert redis_node.cli("KEYS", keys.tag("s") + ":part:*") == ""
    a.close()


@pytest.mark.slow
def test_kill_9_of_a_holder_of_20_sessions_every_next_turn_exact_on_the_other(ckpt, tmp_path, redis_node):
    a = Instance(ckpt, tmp_path / "a", redis_node.url, "A", lease_s=1.0)
    prompts = {f"s{i}": ids_for(i, 70 + 5 * i) for i in range(20)}
    for name, prompt in prompts.items():
        a.call("feed", s=name, ids=prompt)
    a.call("read")
    for i, name in enumerate(prompts):  # mid-conversation: half parked (in the store), half resident on A
        out = ids_for(100 + i, 10)
        a.call("output", s=name, ids=out)
        prompts[name] = prompts[name] + out
        if i % 2:
            a.call("park", s=name)
    a.kill()
    b = make(ckpt, tmp_path / "b", redis_node.url, "B", lease_s=1.0)
    for i, (name, prompt) in enumerate(prompts.items()):
        nxt = prompt + ids_for(200 + i, 20)
        served(b, name, nxt)
        committed = b.position(name).committed
        if i % 2:  # restored from the store: what A had read, not read again
            assert committed == (70 + 5 * i) // 64 * 64, name
        assert list(b.session_ids(name)) == nxt
        assert exact(b, name), name
    assert b.sharing().held == 20
    b.close()


@pytest.mark.slow
def test_sigstop_past_the_lease_then_sigcont_parks_nothing_stale(ckpt, tmp_path, redis_node):
    a = Instance(ckpt, tmp_path / "a", redis_node.url, "A", lease_s=1.0)
    b = make(ckpt, tmp_path / "b", redis_node.url, "B", lease_s=1.0)
    keys = Keys(b.reader.weights_hash)
    first = ids_for(1, 300)
    a.call("feed", s="s", ids=first)
    a.call("read")
    assert redis_node.cli("GET", keys.lease("s")) == "A:1"
    a.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: redis_node.cli("EXISTS", keys.lease("s")) == "0", "A's lease to run out", 30)
        longer = first + ids_for(2, 200)
        b.feed_prompt("s", longer)  # taken over (epoch 2) and advanced
        b.read()
        b.park("s")  # the store's park is B's, and the lease is free again
        m = json.loads(redis_node.cli("GET", keys.manifest("s")))
        assert m["epoch"] == 2
    finally:
        a.signal(signal.SIGCONT)
    got = a.call("park", s="s")  # the renewal may have found it lost first: then A knows it no more
    assert got == {"ok": True} or got["error"] == "UnknownSession"
    st = a.call("status")
    assert st["lost"] == 1 and "s" not in st["sessions"]
    assert json.loads(redis_node.cli("GET", keys.manifest("s"))) == m  # 0 stale parks accepted
    a.close()
    c = make(ckpt, tmp_path / "c", redis_node.url, "C", lease_s=1.0)
    c.feed_prompt("s", longer)
    assert c.position("s").committed == 448 and exact(c, "s")  # B's park, exact
    b.close()
    c.close()
