"""The proxy's session index: what ``sessions.Sessions`` needs to find a conversation's session,
kept where it outlives the process.

An entry per session: its ids (int32), the hash chain of their whole grid blocks, where its first
and last prompts' generation prompts fall, the client that owns it and whether a header named it.
Two lookups serve the rules: sessions by the chain hash at their last prompt (``keyed``) and by any
of their blocks (``held``, ``holders``: most recently used first).

Two implementations behind ``SessionIndex``, chosen by ``QWEN38_SHADOW_STORE`` (``indexes.open_index``):

- ``LocalIndex``: in memory, each entry also written to a file of its own under the disk folder
  (fsync and atomic rename) when its turn starts and when it ends, and read back at start, so a
  restarted proxy finds every conversation it knew under the same name.
- ``RedisIndex`` (``redis_index.py``): the same entries in Redis, so several proxies agree on which
  session a request without ``X-Session-Id`` joins.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("shadow.proxy")

ROOT = b"shadow-proxy-root"
SUFFIX = ".idx"


def chain(ids: Sequence[int], grid: int, start: bytes = ROOT, skip: int = 0) -> list[bytes]:
    """The hash of each whole grid block of ``ids`` chained to all before it (block ``skip`` on,
    ``start`` being the chain before it)."""
    part = ids[skip * grid: len(ids) // grid * grid]
    # a known session's int32 ids hash as their uint32 array would, without an int object per id
    # (the proxy takes no negative id)
    raw = memoryview(part if isinstance(part, array) and part.typecode == "i" else array("I", part)).cast("B")
    step = 4 * grid
    out, h = [], start
    for at in range(0, len(raw), step):
        d = hashlib.blake2b(h, digest_size=16)
        d.update(raw[at: at + step])
        h = d.digest()
        out.append(h)
    return out


@dataclass
class Meta:
    """A session's entry less its ids and blocks."""

    first_prompt: int  # ids before the first prompt's generation prompt
    last_prompt: int  # ids before the last prompt's generation prompt
    owner: str  # the client's digest ("" for a client without ``Authorization``)
    named: bool  # named by ``X-Session-Id``: never joined by a request without one
    n: int = 0  # ids held
    last_block: bytes = ROOT  # the chain's hash at the last whole block
    used: int = 0  # when last recorded or extended, on the index's own clock

    def key(self, blocks: Sequence[bytes], grid: int) -> bytes:
        """The chain's hash at the block where the last prompt's generation prompt falls (rule 1)."""
        j = self.last_prompt // grid
        return blocks[j - 1] if j else ROOT

    def as_json(self) -> dict[str, Any]:
        return {"first_prompt": self.first_prompt, "last_prompt": self.last_prompt, "owner": self.owner,
                "named": self.named, "n": self.n, "last_block": self.last_block.hex(), "used": self.used}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Meta:
        return cls(int(d["first_prompt"]), int(d["last_prompt"]), str(d["owner"]), bool(d["named"]), int(d["n"]),
                   bytes.fromhex(d["last_block"]), int(d["used"]))


class SessionIndex(Protocol):
    """Where the proxy keeps its sessions. Every method is safe from any thread."""

    grid: int
    limit: int

    def keyed(self, keys: Sequence[bytes]) -> list[list[str]]:
        """For each key, the sessions whose last prompt's generation prompt falls at it."""
        ...

    def held(self, blocks: Sequence[bytes]) -> list[int]:
        """For each block hash, how many sessions hold it."""
        ...

    def holders(self, block: bytes, count: int, skip: int = 0) -> list[str]:
        """Up to ``count`` sessions holding ``block``, most recently used first, past the ``skip`` most recent."""
        ...

    def meta(self, name: str) -> Meta | None: ...

    def metas(self, names: Sequence[str]) -> list[Meta | None]:
        """``meta`` of each name, in one look."""
        ...

    def ids(self, name: str, start: int = 0, stop: int | None = None) -> array[int]: ...

    def ids_of(self, names: Sequence[str], start: int, stops: Sequence[int]) -> list[array[int]]:
        """``ids(name, start, stop)`` of each name with its stop, in one look."""
        ...

    def put(self, name: str, meta: Meta, ids: array[int], blocks: list[bytes]) -> None:
        """``name`` now holds ``ids`` (replacing what it held); the least recently used beyond
        ``limit`` are dropped."""
        ...

    def append(self, name: str, ids: array[int], blocks: list[bytes]) -> None:
        """More ids (and the whole blocks they complete) for ``name``; nothing when it is gone."""
        ...

    def settle(self, name: str) -> None:
        """The session's turn ended: what it holds is kept for a restart."""
        ...

    def drop(self, name: str) -> bool: ...

    def names(self) -> list[str]:
        """Least recently used first."""
        ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass
class _Entry:
    meta: Meta
    ids: array[int] = field(default_factory=lambda: array("i"))
    blocks: list[bytes] = field(default_factory=list)


class LocalIndex:
    """The index in this process's memory, and with ``folder`` also on disk, one file a session.

    A file holds one JSON line (the name and ``Meta``) and the ids as int32; the blocks are hashed
    again when it is read. A file that cannot be read is left aside (``unreadable``)."""

    kind = "local"

    def __init__(self, grid: int, limit: int = 1024, folder: Path | None = None) -> None:
        self.grid = grid
        self.limit = limit
        self.folder = folder
        self.evicted = 0
        self.unreadable = 0
        self._known: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._by_block: dict[bytes, dict[str, None]] = {}
        self._by_key: dict[bytes, dict[str, None]] = {}
        self._dirty: set[str] = set()
        self._mu = threading.RLock()
        self._clock = itertools.count(1)
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            self._load(folder)

    # ---- lookups --------------------------------------------------------------------------------

    def keyed(self, keys: Sequence[bytes]) -> list[list[str]]:
        with self._mu:
            return [list(self._by_key.get(k, ())) for k in keys]

    def held(self, blocks: Sequence[bytes]) -> list[int]:
        with self._mu:
            return [len(self._by_block.get(b, ())) for b in blocks]

    def holders(self, block: bytes, count: int, skip: int = 0) -> list[str]:
        with self._mu:
            return list(itertools.islice(reversed(self._by_block.get(block, {})), skip, skip + count))

    def meta(self, name: str) -> Meta | None:
        with self._mu:
            e = self._known.get(name)
            return None if e is None else Meta(**{**e.meta.__dict__})

    def metas(self, names: Sequence[str]) -> list[Meta | None]:
        with self._mu:
            return [self.meta(n) for n in names]

    def ids(self, name: str, start: int = 0, stop: int | None = None) -> array[int]:
        with self._mu:
            e = self._known.get(name)
            return array("i") if e is None else e.ids[start:stop]

    def ids_of(self, names: Sequence[str], start: int, stops: Sequence[int]) -> list[array[int]]:
        with self._mu:
            return [self.ids(n, start, stop) for n, stop in zip(names, stops, strict=True)]

    # ---- changes -------------------------------------------------------------------------------

    def put(self, name: str, meta: Meta, ids: array[int], blocks: list[bytes]) -> None:
        with self._mu:
            old = self._known.pop(name, None)
            if old is not None:
                self._unindex(name, old)
            meta.n, meta.last_block, meta.used = len(ids), blocks[-1] if blocks else ROOT, next(self._clock)
            entry = _Entry(meta, array("i", ids), list(blocks))
            self._known[name] = entry
            self._index(name, entry, 0)
            while len(self._known) > self.limit:
                gone = next(iter(self._known))
                self._drop(gone)
                self.evicted += 1
            self._write(name)

    def append(self, name: str, ids: array[int], blocks: list[bytes]) -> None:
        with self._mu:
            e = self._known.get(name)
            if e is None:  # dropped meanwhile
                return
            self._known.move_to_end(name)
            had = len(e.blocks)
            e.ids.extend(ids)
            e.blocks.extend(blocks)
            e.meta.n, e.meta.used = len(e.ids), next(self._clock)
            e.meta.last_block = e.blocks[-1] if e.blocks else ROOT
            self._index(name, e, had)
            self._dirty.add(name)

    def settle(self, name: str) -> None:
        with self._mu:
            if name in self._dirty:
                self._write(name)

    def drop(self, name: str) -> bool:
        with self._mu:
            return self._drop(name)

    def _drop(self, name: str) -> bool:
        e = self._known.pop(name, None)
        if e is None:
            return False
        self._unindex(name, e)
        self._dirty.discard(name)
        if self.folder is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path(name).unlink()
        return True

    def _index(self, name: str, e: _Entry, start: int) -> None:
        for h in e.blocks[start:]:
            self._by_block.setdefault(h, {})[name] = None
        if start == 0:
            self._by_key.setdefault(e.meta.key(e.blocks, self.grid), {})[name] = None

    def _unindex(self, name: str, e: _Entry) -> None:
        for table, keys in ((self._by_block, e.blocks), (self._by_key, [e.meta.key(e.blocks, self.grid)])):
            for h in keys:
                names = table.get(h)
                if names is not None:
                    names.pop(name, None)
                    if not names:
                        del table[h]

    # ---- on disk ---------------------------------------------------------------------------------

    def _path(self, name: str) -> Path:
        assert self.folder is not None
        return self.folder / (hashlib.blake2b(name.encode(), digest_size=16).hexdigest() + SUFFIX)

    def _write(self, name: str) -> None:
        self._dirty.discard(name)
        if self.folder is None:
            return
        e = self._known[name]
        path = self._path(name)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(json.dumps({"name": name, **e.meta.as_json()}).encode() + b"\n")
            f.write(e.ids.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _load(self, folder: Path) -> None:
        for tmp in folder.glob("*.tmp*"):  # a write that never reached its rename
            tmp.unlink(missing_ok=True)
        read: list[tuple[int, str, Meta, array[int]]] = []
        for path in folder.glob("*" + SUFFIX):
            try:
                raw = path.read_bytes()
                head, _, body = raw.partition(b"\n")
                d = json.loads(head)
                name, meta = str(d["name"]), Meta.from_json(d)
                ids = array("i")
                ids.frombytes(body)
                if len(ids) != meta.n or path != self._path(name) or not 0 <= meta.first_prompt <= meta.n \
                        or not 0 <= meta.last_prompt <= meta.n or min(ids, default=0) < 0:
                    raise ValueError("its ids or name do not match its header")
            except (OSError, ValueError, KeyError, TypeError) as err:
                self.unreadable += 1
                log.warning("proxy index: %s left aside: %s: %s", path.name, type(err).__name__, err)
                continue
            read.append((meta.used, name, meta, ids))
        for _, name, meta, ids in sorted(read, key=lambda r: r[0]):
            blocks = chain(ids, self.grid)
            entry = _Entry(meta, ids, blocks)
            meta.last_block = blocks[-1] if blocks else ROOT
            self._known[name] = entry
            self._index(name, entry, 0)
        top = max((r[0] for r in read), default=0)
        self._clock = itertools.count(top + 1)

    # ---- reading --------------------------------------------------------------------------------

    def names(self) -> list[str]:
        with self._mu:
            return list(self._known)

    def status(self) -> dict[str, Any]:
        with self._mu:
            return {"index": self.kind, "known": len(self._known), "limit": self.limit, "evicted": self.evicted,
                    "unreadable": self.unreadable}

    def close(self) -> None:
        with self._mu:
            for name in list(self._dirty):
                self._write(name)
