"""Issue 53 point 1: parked sessions in a shared Redis, in parts under a manifest and generations,
restored by another instance exactly, and refused whole when a part is missing or wrong, the
manifest unreadable, or the park made under another identity."""

from __future__ import annotations

import json
import random

import pytest

from shadow.backends.stores.redis_parks import Keys

from .fleet import Instance, exact, make

VOCAB = 248320


def ids_for(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(VOCAB) for _ in range(n)]


def test_a_session_parked_by_one_process_is_restored_by_another_exactly(ckpt, tmp_path, redis_node):
    a = Instance(ckpt, tmp_path / "a", redis_node.url, "A", part_bytes=64 * 1024)
    try:
        assert a.call("feed", s="s", ids=ids_for(1, 300)) == {"ok": True}
        a.call("read")
        a.call("output", s="s", ids=ids_for(2, 40))
        assert a.call("park", s="s") == {"ok": True}
        st = a.call("status")["sharing"]
        assert st["store"] == "up" and st["held"] == 0  # parked: the lease let go
    finally:
        a.close()
    b = make(ckpt, tmp_path / "b", redis_node.url, "B", part_bytes=64 * 1024)
    keys = Keys(b.reader.weights_hash)
    manifest = json.loads(redis_node.cli("GET", keys.manifest("s")))
    assert len(manifest["parts"]) > 1 and manifest["epoch"] == 1  # several parts: the test means something
    b.feed_prompt("s", ids_for(1, 300) + ids_for(2, 40) + ids_for(3, 100))
    assert b.position("s").committed == 256 and b.position("s").rollbacks == 0  # restored, not read again
    assert exact(b, "s")
    assert redis_node.cli("GET", keys.lease("s")) == "B:2"  # B holds it, under the next epoch
    b.close()


@pytest.mark.parametrize("damage", ["deleted", "other_generation", "flipped", "identity", "manifest"])
def test_a_part_missing_or_wrong_refuses_the_whole_park(ckpt, tmp_path, redis_node, damage):
    a = make(ckpt, tmp_path / "a", redis_node.url, "A", part_bytes=64 * 1024)
    first = ids_for(1, 300)
    a.feed_prompt("s", first)
    a.read()
    a.park("s")  # generation 1
    a.feed_prompt("s", first + ids_for(2, 200))
    a.read()
    a.park("s")  # generation 2: generation 1's parts are gone
    keys = Keys(a.reader.weights_hash)
    m = json.loads(redis_node.cli("GET", keys.manifest("s")))
    assert m["gen"] == 2 and redis_node.cli("EXISTS", keys.part("s", 1, 0)) == "0"
    a.close()
    part = keys.part("s", 2, 1)
    if damage == "deleted":
        redis_node.cli("DEL", part)
    elif damage == "other_generation":  # generation 1's part 1, put back under generation 2's key
        b0 = make(ckpt, tmp_path / "a0", redis_node.url, "A0", part_bytes=64 * 1024)
        b0.feed_prompt("t", first)
        b0.read()
        b0.park("t")
        other = keys.part("t", int(json.loads(redis_node.cli("GET", keys.manifest("t")))["gen"]), 1)
        assert redis_node.cli("COPY", other, part, "REPLACE") == "1"
        b0.close()
    elif damage == "identity":  # a park made under another dtype (or any field of the identity)
        other = {**m, "identity": {**m["identity"], "dtype": "bfloat16"}}
        redis_node.client().set(keys.manifest("s"), json.dumps(other))
    elif damage == "manifest":
        redis_node.client().set(keys.manifest("s"), b'{"version": "shadow-manifest-1", "parts": [[1,')
    else:
        raw = bytearray(redis_node.client().get(part))
        raw[100] ^= 1
        redis_node.client().set(part, bytes(raw))
    b = make(ckpt, tmp_path / "b", redis_node.url, "B", part_bytes=64 * 1024)
    b.feed_prompt("s", first + ids_for(2, 200))
    assert b.position("s").committed == 0  # refused whole: read again from the start
    reason = {"deleted": "part_missing", "identity": "identity", "manifest": "manifest"}.get(damage, "part_wrong")
    assert [r.split(":")[0] for _, r in b.disk.refused] == [reason]
    assert b.sharing().parks_refused == 1
    assert redis_node.cli("EXISTS", keys.manifest("s")) == "0"  # the refused park is deleted
    assert exact(b, "s")
    b.close()
