"""Issue 53 point 5: the store down. Redis unreachable, then restarted empty: no wrong load, no
crash; parks fall back to the local disk, new sessions are followed here unshared, and the status,
``/metrics`` and ``/ready`` say so; once it answers again, sessions it lost are read again."""

from __future__ import annotations

import time

import pytest

from shadow.adapters.metrics import Metrics
from shadow.backends.stores.redis_parks import Keys

from .fleet import exact, make
from .test_store import ids_for


def gauge(metrics: Metrics, name: str) -> float:
    got = metrics.registry.get_sample_value(name)
    assert got is not None, name
    return got


@pytest.mark.slow
def test_redis_killed_then_restarted_empty_no_wrong_load_sessions_read_again(ckpt, tmp_path, redis_node):
    a = make(ckpt, tmp_path / "a", redis_node.url, "A")
    metrics = Metrics(64)
    metrics.watch(lambda: a)
    keys = Keys(a.reader.weights_hash)
    one = ids_for(1, 300)
    a.feed_prompt("s1", one)
    a.read()
    a.park("s1")  # in the store and on A's disk
    assert a.sharing().store == "up", a.sharing().last_error
    assert redis_node.cli("EXISTS", keys.manifest("s1")) == "1"
    assert gauge(metrics, "shadow_store_up") == 1

    redis_node.kill()
    two = ids_for(2, 200)
    a.feed_prompt("s2", two)  # the lease cannot be taken: followed here, unshared
    a.read()
    st = a.status().store.sharing
    assert st is not None and st.store == "down" and st.unshared == 1 and "Connection" in st.last_error
    assert gauge(metrics, "shadow_store_up") == 0 and gauge(metrics, "shadow_sessions_unshared") == 1
    a.park("s2")  # to the local disk only
    assert a.status().store.park_failures == 0 and a.status().sessions["s2"].where == "parked"
    for name, ids in (("s1", one), ("s2", two)):  # both back from A's own disk, exact
        a.feed_prompt(name, ids + ids_for(3, 70))
        assert a.position(name).committed > 0
        assert exact(a, name)

    redis_node.start()  # the same port, empty
    time.sleep(1.0)  # A asks a store that failed it again after a lease (LEASE_S=1): at least that long
    b = make(ckpt, tmp_path / "b", redis_node.url, "B")
    b.feed_prompt("s1", one + ids_for(3, 70) + ids_for(4, 10))  # nothing in the store: read again
    assert b.position("s1").committed == 0 and b.sharing().store == "up"
    assert exact(b, "s1")
    a.feed_prompt("s3", ids_for(5, 100))  # the store answers again: A takes leases again
    assert a.sharing().store == "up" and a.sharing().held == 1
    assert gauge(metrics, "shadow_store_up") == 1
    a.read("s3")
    a.park("s3")
    b.park("s1")
    b.feed_prompt("s3", ids_for(5, 100))  # A's park of s3, from the store
    assert b.position("s3").committed == 64 and exact(b, "s3")
    a.close()
    b.close()
