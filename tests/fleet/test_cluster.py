"""Issue 53: the store on a 3-node Redis Cluster (three real ``redis-server --cluster-enabled yes`` on
loopback, made one by ``redis-cli --cluster create``), through redis-py's ``RedisCluster``: each
session's keys share one slot by their hash tag, so its Lua scripts run on one node."""

from __future__ import annotations

import json

import pytest

from shadow.backends.stores.redis_parks import Keys

from .fleet import exact, make
from .servers import make_cluster, need_redis
from .test_store import ids_for


@pytest.mark.slow
def test_parks_and_leases_on_a_three_node_cluster(ckpt, tmp_path):
    need_redis()
    nodes = make_cluster(tmp_path / "cluster")
    try:
        url = nodes[0].url
        a = make(ckpt, tmp_path / "a", url, "A", part_bytes=64 * 1024, cluster=True)
        keys = Keys(a.reader.weights_hash)
        sessions = {f"s{i}": ids_for(i, 100 + 30 * i) for i in range(5)}
        for name, ids in sessions.items():
            a.feed_prompt(name, ids)
        a.read()
        for name in sessions:
            a.park(name)
        slots = set()
        for name in sessions:  # every key of a session in one slot; the sessions spread over the nodes
            m = json.loads(nodes[0].cli("-c", "GET", keys.manifest(name)))
            named = [keys.manifest(name), keys.epoch(name), keys.lease(name), keys.gen(name),
                     *(keys.part(name, m["gen"], i) for i in range(len(m["parts"])))]
            got = {nodes[0].cli("CLUSTER", "KEYSLOT", k) for k in named}
            assert len(got) == 1, (name, got)
            slots |= got
        owners = {n.port for n in nodes for s in slots if nodes[0].cli("-c", "-p", str(n.port), "CLUSTER",
                                                                         "COUNTKEYSINSLOT", s) not in ("", "0")}
        assert len(owners) >= 2  # the test spans more than one node
        a.close()
        b = make(ckpt, tmp_path / "b", url, "B", part_bytes=64 * 1024, cluster=True)
        for name, ids in sessions.items():
            b.feed_prompt(name, ids + ids_for(99, 30))
            assert b.position(name).committed == len(ids) // 64 * 64, name  # from the store, not read again
            assert exact(b, name)
        assert b.sharing().held == len(sessions) and b.sharing().store == "up"
        b.close()
    finally:
        for n in nodes:
            n.kill()
