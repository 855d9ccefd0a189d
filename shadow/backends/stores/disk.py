"""Parked sessions: one safetensors file per session, written so that a crash never leaves a file
that loads wrong.

A file holds the committed KV rows (not the spare capacity), the conv and recurrent state, the
checkpoints, the ids read, and in its metadata: format version, the model's weights hash, the
grid, the dtype, the layout of each tensor kind, the session's bookkeeping, when it was parked,
and a BLAKE2b checksum over every tensor. Writing goes to a temporary name in the same folder,
is fsynced, renamed over the final name, and the folder is fsynced. Loading re-computes the
checksum; a file that is cut, altered, written for other weights, another grid, dtype or format
is refused and removed, and the session is read again. Files older than the TTL go, and the
oldest go first while the folder holds more than its cap.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from shadow.core.errors import StoreError
from shadow.core.protocols import Reader, Stored
from shadow.core.session import Position, SessionBook

FORMAT_VERSION = "shadow-session-1"
LAYOUT = {
    "k": "[rows, kv_heads, head_dim] per full-attention layer, committed rows only",
    "v": "[rows, kv_heads, head_dim] per full-attention layer, committed rows only",
    "conv": "[conv_dim, kernel] per GDN layer: the last `kernel` pre-conv inputs",
    "recurrent": "[value_heads, key_dim, value_dim] fp32 per GDN layer (S, keys first)",
    "ids": "[n] int32: every id the session holds",
}
SUFFIX = ".safetensors"


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    """BLAKE2b of each tensor (name, dtype, shape, bytes) on a thread pool (hashlib lets go of the
    GIL on large buffers), then BLAKE2b over those digests in name order."""

    def one(name: str) -> bytes:
        t = tensors[name].contiguous()
        h = hashlib.blake2b(digest_size=32)
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.view(torch.uint8).reshape(-1).numpy().data)
        return h.digest()

    names = sorted(tensors)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(one, names))
    top = hashlib.blake2b(digest_size=32)
    for d in digests:
        top.update(d)
    return top.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DiskStore:
    def __init__(self, root: str | Path, reader: Reader, weights_hash: str, *, max_bytes: int,
                 ttl_s: float = 48 * 3600, clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.reader = reader
        self.weights_hash = weights_hash
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.refused: list[tuple[str, str]] = []  # (file, why): what was removed instead of loaded
        self._index: dict[str, dict[str, Any]] = {}
        self._scan()

    # ---- the folder ------------------------------------------------------------------------

    @property
    def _identity(self) -> dict[str, str]:
        return {"format": FORMAT_VERSION, "weights_hash": self.weights_hash, "grid": str(self.reader.grid),
                "dtype": self.reader.dtype}

    def _path(self, name: str) -> Path:
        return self.root / (hashlib.sha256(name.encode()).hexdigest()[:40] + SUFFIX)

    def _refuse(self, path: Path, why: str) -> None:
        self.refused.append((path.name, why))
        path.unlink(missing_ok=True)

    def _header(self, path: Path) -> dict[str, str] | None:
        try:
            with safe_open(str(path), framework="pt") as f:
                meta: dict[str, str] = f.metadata() or {}
        except (SafetensorError, OSError, ValueError) as e:
            self._refuse(path, f"unreadable: {e}")
            return None
        for key, want in self._identity.items():
            if meta.get(key) != want:
                self._refuse(path, f"{key} is {meta.get(key)!r}, this reader has {want!r}")
                return None
        return meta

    def _scan(self) -> None:
        for tmp in self.root.glob("*.tmp*"):  # a write that never reached its rename
            tmp.unlink(missing_ok=True)
        for path in sorted(self.root.glob("*" + SUFFIX)):
            meta = self._header(path)
            if meta is not None:
                self._index[meta["session"]] = {"path": path, "bytes": path.stat().st_size,
                                                "parked_at": float(meta["parked_at"]),
                                                "book": json.loads(meta["book"])}
        self.sweep()

    def sweep(self) -> list[str]:
        """Remove files past the TTL, then the oldest while the total is over the cap."""
        now = self.clock()
        gone = [n for n, e in self._index.items() if now - e["parked_at"] > self.ttl_s]
        by_age = sorted((n for n in self._index if n not in gone), key=lambda n: self._index[n]["parked_at"])
        total = sum(self._index[n]["bytes"] for n in by_age)
        while by_age and total > self.max_bytes:
            oldest = by_age.pop(0)
            total -= self._index[oldest]["bytes"]
            gone.append(oldest)
        for name in gone:
            self.remove(name)
        return gone

    def names(self) -> list[str]:
        return list(self._index)

    def info(self, name: str) -> Stored | None:
        e = self._index.get(name)
        return None if e is None else Stored(e["bytes"], e["parked_at"], Position.from_meta(e["book"]))

    def total_bytes(self) -> int:
        return sum(e["bytes"] for e in self._index.values())

    def remove(self, name: str) -> None:
        e = self._index.pop(name, None)
        if e is not None:
            e["path"].unlink(missing_ok=True)

    # ---- one session ----------------------------------------------------------------------

    def put(self, name: str, book: SessionBook, tensors: Any) -> int:
        """Park ``name``; returns the file's size. Raises StoreError, leaving no partial file."""
        data = {"ids": torch.tensor(book.ids, dtype=torch.int32), **self.reader.serialise(book, tensors)}
        now = self.clock()
        meta = {**self._identity, "session": name, "parked_at": repr(now), "book": json.dumps(book.meta()),
                "layout": json.dumps(LAYOUT), "checksum": _checksum(data)}
        final = self._path(name)
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        try:
            save_file(data, str(tmp), metadata=meta)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            _fsync_dir(self.root)
        except (OSError, SafetensorError) as e:  # safetensors reports ENOSPC and EFBIG as its own error
            tmp.unlink(missing_ok=True)
            raise StoreError(f"could not park session {name!r} in {self.root}: {e}") from e
        size = final.stat().st_size
        self._index[name] = {"path": final, "bytes": size, "parked_at": now, "book": book.meta()}
        self.sweep()
        return size

    def peek(self, name: str) -> tuple[SessionBook, Any] | None:
        """A copy of the parked session on the reader's device; the file stays. None if absent or refused."""
        return self._load(name, keep=True)

    def take(self, name: str) -> tuple[SessionBook, Any] | None:
        """The parked session, restored to the reader's device; its file goes. None if absent or refused."""
        return self._load(name, keep=False)

    def _load(self, name: str, keep: bool) -> tuple[SessionBook, Any] | None:
        e = self._index.pop(name, None)
        if e is None:
            return None
        path: Path = e["path"]
        meta = self._header(path)
        if meta is None:
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                data = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            self._refuse(path, f"unreadable: {err}")
            return None
        if _checksum(data) != meta.get("checksum"):
            self._refuse(path, "checksum mismatch")
            return None
        book = SessionBook.from_meta(json.loads(meta["book"]), data["ids"].tolist())
        try:
            tensors = self.reader.deserialise(book, data)
        except (KeyError, RuntimeError, ValueError) as err:
            self._refuse(path, f"does not fit this model: {err}")
            return None
        if keep:
            self._index[name] = e
        else:
            path.unlink(missing_ok=True)  # the session lives on the device again; its file is stale from here
        return book, tensors
