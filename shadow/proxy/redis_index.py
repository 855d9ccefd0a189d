"""The proxy's session index in Redis (``QWEN38_SHADOW_STORE=redis://host:port/db``), so that
several proxies agree on which session a request without ``X-Session-Id`` joins.

Keys, all under one hash tag (``shadow:{proxy-index}:g<grid>:``), so that a Redis Cluster keeps them
in one slot and a change is one ``MULTI``/``EXEC``:

- ``m:<name>``: a hash, the session's ``Meta`` (``index.py``) as strings;
- ``i:<name>``: its ids, int32 little-endian, appended to with ``APPEND``;
- ``b:<name>``: its block hashes, 16 bytes each, appended to likewise;
- ``B:<block>`` and ``K:<key>``: sorted sets of names scored by when each was last used (the two
  lookups, most recently used last);
- ``lru``: every name scored likewise (the bound, least recently used first out);
- ``clock``: the counter those scores come from.

Ids are written little-endian whatever the machine, so proxies on any host read one another's.
Where Redis cannot be reached, a look-up or change raises ``redis.RedisError``: the proxy's turn
then stops following (``shadow_error``) while its bytes flow on, and ``status`` says so.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

import redis

from .index import ROOT, Meta

BLOCK = 16  # bytes of one block hash (index.chain)
PREFIX = "shadow:{proxy-index}"


def _le(ids: array[int]) -> bytes:
    if sys.byteorder == "little":
        return ids.tobytes()
    out = array("i", ids)
    out.byteswap()
    return out.tobytes()


def _from_le(raw: bytes) -> array[int]:
    out = array("i")
    out.frombytes(raw[: len(raw) // 4 * 4])
    if sys.byteorder != "little":
        out.byteswap()
    return out


class RedisIndex:
    kind = "redis"

    def __init__(self, client: Any, grid: int, limit: int = 1024) -> None:
        self.r = client
        self.grid = grid
        self.limit = limit
        self.evicted = 0
        self.p = f"{PREFIX}:g{grid}:"

    @classmethod
    def from_url(cls, url: str, grid: int, limit: int = 1024) -> RedisIndex:
        return cls(redis.Redis.from_url(url, socket_timeout=10.0, socket_connect_timeout=5.0), grid, limit)

    def _k(self, kind: str, what: str | bytes) -> str:
        return self.p + kind + ":" + (what.hex() if isinstance(what, bytes) else what)

    # ---- lookups --------------------------------------------------------------------------------

    def _members(self, kind: str, hashes: Sequence[bytes]) -> list[list[str]]:
        pipe = self.r.pipeline(transaction=False)
        for h in hashes:
            pipe.zrange(self._k(kind, h), 0, -1)
        return [[n.decode() for n in names] for names in pipe.execute()]

    def keyed(self, keys: Sequence[bytes]) -> list[list[str]]:
        return self._members("K", keys)

    def held(self, blocks: Sequence[bytes]) -> list[int]:
        pipe = self.r.pipeline(transaction=False)
        for h in blocks:
            pipe.zcard(self._k("B", h))
        return [int(n) for n in pipe.execute()]

    def holders(self, block: bytes, count: int, skip: int = 0) -> list[str]:
        return [n.decode() for n in self.r.zrevrange(self._k("B", block), skip, skip + count - 1)]

    def meta(self, name: str) -> Meta | None:
        return self._meta(self.r.hgetall(self._k("m", name)))

    def metas(self, names: Sequence[str]) -> list[Meta | None]:
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self._k("m", name))
        return [self._meta(raw) for raw in pipe.execute()]

    @staticmethod
    def _meta(raw: dict[bytes, bytes]) -> Meta | None:
        if not raw:
            return None
        d = {k.decode(): v.decode() for k, v in raw.items()}
        return Meta(int(d["first_prompt"]), int(d["last_prompt"]), d["owner"], d["named"] == "1", int(d["n"]),
                    bytes.fromhex(d["last_block"]), int(d["used"]))

    def ids(self, name: str, start: int = 0, stop: int | None = None) -> array[int]:
        if stop is not None and stop <= start:
            return array("i")
        end = -1 if stop is None else 4 * stop - 1
        return _from_le(self.r.getrange(self._k("i", name), 4 * start, end))

    def ids_of(self, names: Sequence[str], start: int, stops: Sequence[int]) -> list[array[int]]:
        pipe = self.r.pipeline(transaction=False)
        for name, stop in zip(names, stops, strict=True):
            pipe.getrange(self._k("i", name), 4 * start, 4 * stop - 1)
        return [_from_le(raw) if stop > start else array("i")
                for raw, stop in zip(pipe.execute(), stops, strict=True)]

    # ---- changes -------------------------------------------------------------------------------

    def _unindex(self, pipe: Any, name: str, meta: Meta, blocks: bytes) -> None:
        hashes = [blocks[i: i + BLOCK] for i in range(0, len(blocks), BLOCK)]
        for h in hashes:
            pipe.zrem(self._k("B", h), name)
        j = meta.last_prompt // self.grid
        pipe.zrem(self._k("K", hashes[j - 1] if j and j <= len(hashes) else ROOT), name)

    def put(self, name: str, meta: Meta, ids: array[int], blocks: list[bytes]) -> None:
        old = self.meta(name)
        old_blocks = self.r.get(self._k("b", name)) or b""
        used = int(self.r.incr(self.p + "clock"))
        meta.n, meta.last_block, meta.used = len(ids), blocks[-1] if blocks else ROOT, used
        pipe = self.r.pipeline(transaction=True)
        if old is not None:
            self._unindex(pipe, name, old, old_blocks)
        pipe.hset(self._k("m", name), mapping={
            "first_prompt": meta.first_prompt, "last_prompt": meta.last_prompt, "owner": meta.owner,
            "named": int(meta.named), "n": meta.n, "last_block": meta.last_block.hex(), "used": used})
        pipe.set(self._k("i", name), _le(ids))
        pipe.set(self._k("b", name), b"".join(blocks))
        for h in blocks:
            pipe.zadd(self._k("B", h), {name: used})
        pipe.zadd(self._k("K", meta.key(blocks, self.grid)), {name: used})
        pipe.zadd(self.p + "lru", {name: used})
        pipe.execute()
        while int(self.r.zcard(self.p + "lru")) > self.limit:
            popped = self.r.zpopmin(self.p + "lru")
            if not popped:
                break
            self.drop(popped[0][0].decode())
            self.evicted += 1

    def append(self, name: str, ids: array[int], blocks: list[bytes]) -> None:
        meta = self.meta(name)
        if meta is None:
            return
        used = int(self.r.incr(self.p + "clock"))
        pipe = self.r.pipeline(transaction=True)
        pipe.append(self._k("i", name), _le(ids))
        pipe.append(self._k("b", name), b"".join(blocks))
        fields: dict[str, Any] = {"n": meta.n + len(ids), "used": used}
        if blocks:
            fields["last_block"] = blocks[-1].hex()
        pipe.hset(self._k("m", name), mapping=fields)
        for h in blocks:
            pipe.zadd(self._k("B", h), {name: used})
        pipe.zadd(self.p + "lru", {name: used})
        pipe.execute()

    def settle(self, name: str) -> None:
        """Nothing to do: every change is in Redis already."""

    def drop(self, name: str) -> bool:
        meta = self.meta(name)
        if meta is None:
            return False
        blocks = self.r.get(self._k("b", name)) or b""
        pipe = self.r.pipeline(transaction=True)
        self._unindex(pipe, name, meta, blocks)
        pipe.delete(self._k("m", name), self._k("i", name), self._k("b", name))
        pipe.zrem(self.p + "lru", name)
        pipe.execute()
        return True

    # ---- reading --------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return [n.decode() for n in self.r.zrange(self.p + "lru", 0, -1)]

    def status(self) -> dict[str, Any]:
        """What the index holds; where Redis cannot be reached, that (the status still answers)."""
        out: dict[str, Any] = {"index": self.kind, "limit": self.limit, "evicted": self.evicted}
        try:
            return {**out, "known": int(self.r.zcard(self.p + "lru")), "reachable": True}
        except redis.RedisError as err:
            return {**out, "known": None, "reachable": False, "error": f"{type(err).__name__}: {err}"}

    def close(self) -> None:
        self.r.close()
