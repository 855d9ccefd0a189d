"""Parked sessions in Redis: the same bytes as the local parked file (parked.py's format), in parts.

Keys (docs/scale-out.md): every key of a session carries the hash tag of its digest, so that a Redis
Cluster keeps them in one slot (one Lua script may touch them all):

    <prefix>:{<digest>}:manifest        JSON: the park (below), expires with DISK's TTL
    <prefix>:{<digest>}:part:<gen>:<i>  bytes: part i of generation gen, at most 8 MiB
    <prefix>:{<digest>}:gen             the last generation handed out (INCR)
    <prefix>:{<digest>}:epoch           the session's epoch: +1 on each take of its lease (INCR)
    <prefix>:{<digest>}:lease           "<instance>:<epoch>" while an instance holds it (PX = LEASE_S)

``<prefix>`` is ``shadow:<the weights hash's first 16 hex>``: models never share a key; ``<digest>`` the
first 40 hex of the SHA-256 of the session's name (the local file's name).

A park writes its parts under a new generation, then switches the manifest in one Lua script that
refuses it when a newer holder has the session (its epoch below the stored one, or the lease
another's): the stale park's parts are deleted and ``LeaseLost`` raised. After a switch the old
generation's parts go. A reader checks the manifest, each part's length and SHA-256, and the whole
file's size; anything missing or wrong refuses the whole park (``PartRefused``, with a bounded
reason): it never loads parts of two generations, since each part is checked against the manifest
that names it. What the parts assemble into is then checked as any local file is (DiskStore).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from shadow.core.errors import LeaseLost

PART_BYTES = 8 * 2**20  # Redis caps a value at 512 MB, and one large value blocks its one thread
BATCH = 8  # parts a pipeline carries at once: one round trip per 64 MiB, its hashes on threads meanwhile
HASHERS = 4  # SHA-256 threads (hashlib lets go of the GIL on large buffers)
MANIFEST_VERSION = "shadow-manifest-1"
MAX_MANIFEST_CHARS = 1_000_000  # 8 MiB parts: about 13,000 parts, 100 GB of park

# KEYS: manifest, epoch, lease. ARGV: new manifest, park's epoch, "<instance>:<epoch>", the parks' TTL
# and the lease's, in ms.
# A park is taken only from the holder of the newest epoch: the lease its own, or free and no
# newer epoch handed out since (a store restarted empty, a lease that ran out untaken).
SWITCH = """
local stored = tonumber(redis.call('GET', KEYS[2]) or '0')
local epoch = tonumber(ARGV[2])
if epoch < stored then return {0, 'stale'} end
local lease = redis.call('GET', KEYS[3])
if lease and lease ~= ARGV[3] then return {0, 'holder'} end
if not lease then redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[5]) end
if epoch > stored then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4]) end
local old = redis.call('GET', KEYS[1]) or ''
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
return {1, old}
"""
# KEYS: manifest, lease. ARGV: this instance's name. Deletes the manifest unless another holds the lease.
REMOVE = """
local lease = redis.call('GET', KEYS[2])
if lease and string.match(lease, '^(.*):%d+$') ~= ARGV[1] then return {0, ''} end
local old = redis.call('GET', KEYS[1]) or ''
redis.call('DEL', KEYS[1])
return {1, old}
"""


def _sha256(data: bytes | None) -> str:
    return "" if data is None else hashlib.sha256(data).hexdigest()


class PartRefused(Exception):
    """A park in the store that must not load; ``reason`` is a bounded label, the message says more."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: what logs and the status show."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    user = parts.username or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def connect(url: str, password: str = "", cluster: bool = False, timeout_s: float = 2.0) -> Any:
    """A redis-py client for ``url`` (``redis://`` or ``rediss://``): one node, or with ``cluster``
    the cluster that node belongs to. ``password`` (STORE_PASSWORD) wins over the URL's."""
    import redis
    import redis.cluster

    kw: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if password:
        kw["password"] = password
    if cluster:
        return redis.cluster.RedisCluster.from_url(url, **kw)
    return redis.Redis.from_url(url, **kw)


class Keys:
    """The key names of one model's sessions (the module docstring)."""

    def __init__(self, weights_hash: str) -> None:
        self.prefix = f"shadow:{weights_hash[:16]}"

    def tag(self, session: str) -> str:
        return f"{self.prefix}:{{{hashlib.sha256(session.encode()).hexdigest()[:40]}}}"

    def manifest(self, session: str) -> str:
        return self.tag(session) + ":manifest"

    def gen(self, session: str) -> str:
        return self.tag(session) + ":gen"

    def epoch(self, session: str) -> str:
        return self.tag(session) + ":epoch"

    def lease(self, session: str) -> str:
        return self.tag(session) + ":lease"

    def part(self, session: str, gen: int, i: int) -> str:
        return f"{self.tag(session)}:part:{gen}:{i}"


@dataclass(frozen=True)
class Manifest:
    session: str
    gen: int
    epoch: int
    holder: str  # "<instance>:<epoch>" of the instance that made the park
    checksum: str  # the parked file's own checksum (parked.py): the park's identity
    identity: dict[str, str]  # format, weights hash, grid, dtype of the park
    size: int  # the file's bytes
    parts: tuple[tuple[int, str], ...]  # (bytes, SHA-256 hex) of each part, in order
    parked_at: float

    def dumps(self) -> str:
        return json.dumps({"version": MANIFEST_VERSION, "session": self.session, "gen": self.gen,
                           "epoch": self.epoch, "holder": self.holder, "checksum": self.checksum,
                           "identity": self.identity, "size": self.size, "parts": [list(p) for p in self.parts],
                           "parked_at": self.parked_at})

    @classmethod
    def loads(cls, raw: bytes | str, session: str) -> Manifest:
        """The manifest of ``session``, every field checked; PartRefused("manifest") when wrong."""
        try:
            if len(raw) > MAX_MANIFEST_CHARS:
                raise ValueError(f"{len(raw)} characters")
            d = json.loads(raw)
            if d.get("version") != MANIFEST_VERSION:
                raise ValueError(f"version {str(d.get('version'))[:40]!r}")
            parts = tuple((int(n), str(h)) for n, h in d["parts"])
            m = cls(str(d["session"]), int(d["gen"]), int(d["epoch"]), str(d["holder"]), str(d["checksum"]),
                    {str(k): str(v) for k, v in d["identity"].items()}, int(d["size"]), parts, float(d["parked_at"]))
            if m.session != session:
                raise ValueError(f"it names session {m.session[:80]!r}")
            if any(not 0 < n <= PART_BYTES or len(h) != 64 for n, h in parts) or sum(n for n, _ in parts) != m.size:
                raise ValueError("its parts do not add up to its size")
            return m
        except Exception as e:  # whatever is stored under the key refuses it, nothing raises out
            raise PartRefused("manifest", f"bad manifest: {type(e).__name__}: {str(e)[:200]}") from None


class RedisParks:
    """Whole parks of sessions in Redis, in parts (the module docstring)."""

    def __init__(self, client: Any, keys: Keys, *, ttl_s: float = 48 * 3600, part_bytes: int = PART_BYTES) -> None:
        if not 0 < part_bytes <= PART_BYTES:
            raise ValueError(f"part_bytes must be in (0, {PART_BYTES}]")
        self.client = client
        self.keys = keys
        self.ttl_ms = int(ttl_s * 1000)
        self.part_bytes = part_bytes
        self._switch = client.register_script(SWITCH)
        self._remove = client.register_script(REMOVE)

    def put(self, session: str, path: Path, checksum: str, identity: dict[str, str], epoch: int, holder: str,
            lease_ms: int) -> Manifest:
        """Send the parked file at ``path`` as ``session``'s park made under ``epoch`` by ``holder``
        (``<instance>:<epoch>``). Raises LeaseLost when a newer holder has the session (nothing of
        this park stays), redis' errors when the store cannot be reached."""
        k = self.keys
        gen = int(self.client.incr(k.gen(session)))
        self.client.pexpire(k.gen(session), self.ttl_ms)
        parts: list[tuple[int, str]] = []
        try:
            with open(path, "rb") as f, ThreadPoolExecutor(HASHERS) as pool:
                while batch := [c for c in (f.read(self.part_bytes) for _ in range(BATCH)) if c]:
                    pipe = self.client.pipeline(transaction=False)
                    for i, chunk in enumerate(batch):
                        pipe.set(k.part(session, gen, len(parts) + i), chunk, px=self.ttl_ms)
                    digests = pool.map(_sha256, batch)
                    parts += [(len(c), d) for c, d in zip(batch, digests, strict=True)]
                    pipe.execute()
            m = Manifest(session, gen, epoch, holder, checksum, identity, sum(n for n, _ in parts), tuple(parts),
                         time.time())
            ok, old = self._switch(keys=[k.manifest(session), k.epoch(session), k.lease(session)],
                                   args=[m.dumps(), epoch, holder, self.ttl_ms, lease_ms])
        except BaseException:
            self._drop_parts(session, gen, len(parts) + BATCH)
            raise
        if not int(ok):
            self._drop_parts(session, gen, len(parts))
            why = old.decode() if isinstance(old, bytes) else str(old)
            raise LeaseLost(f"session {session!r}: the store refused this park of epoch {epoch} ({why}): "
                            "another instance took the session since")
        self._drop_old(session, old)
        return m

    def manifest(self, session: str) -> Manifest | None:
        """The session's current manifest, None when the store holds no park of it. PartRefused when
        what is stored is not a manifest of it."""
        raw = self.client.get(self.keys.manifest(session))
        return None if raw is None else Manifest.loads(raw, session)

    def fetch(self, m: Manifest, into: Path) -> None:
        """Assemble ``m``'s parts into the file ``into`` (fsynced). PartRefused when a part is missing
        or differs from the manifest (``into`` then removed)."""
        try:
            with open(into, "wb") as f, ThreadPoolExecutor(HASHERS) as pool:
                for start in range(0, len(m.parts), BATCH):
                    pipe = self.client.pipeline(transaction=False)
                    for i in range(start, min(start + BATCH, len(m.parts))):
                        pipe.get(self.keys.part(m.session, m.gen, i))
                    got = pipe.execute()
                    for i, (data, digest) in enumerate(zip(got, pool.map(_sha256, got), strict=True), start):
                        n, want = m.parts[i]
                        if data is None:
                            raise PartRefused("part_missing", f"part {i} of generation {m.gen} is missing")
                        if len(data) != n or digest != want:
                            raise PartRefused("part_wrong", f"part {i} of generation {m.gen} differs from its manifest")
                        f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            into.unlink(missing_ok=True)
            raise

    def remove(self, session: str, instance: str) -> bool:
        """Delete the session's park unless another instance holds its lease; whether it went."""
        ok, old = self._remove(keys=[self.keys.manifest(session), self.keys.lease(session)], args=[instance])
        if int(ok):
            self._drop_old(session, old)
        return bool(int(ok))

    def _drop_old(self, session: str, old: bytes | str | None) -> None:
        if not old:
            return
        try:
            prev = Manifest.loads(old, session)
        except PartRefused:
            return  # nothing to name its parts by: they expire with the TTL
        self._drop_parts(session, prev.gen, len(prev.parts))

    def _drop_parts(self, session: str, gen: int, n: int) -> None:
        keys = [self.keys.part(session, gen, i) for i in range(n)]
        if keys:  # a store gone meanwhile: parts left behind expire with the TTL, named by no manifest
            with contextlib.suppress(Exception):
                self.client.delete(*keys)
