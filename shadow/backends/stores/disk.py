"""Parked sessions: one safetensors file per session, written so that a crash never leaves a file
that loads wrong, and bound to its session so that no session ever loads another's.

A file holds the committed KV rows (not the spare capacity), the conv and recurrent state, the
checkpoints, the ids read, and in its metadata: format version, the model's weights hash, the
grid, the dtype, the layout of each tensor kind, the session's name and bookkeeping, when it was
parked, and a BLAKE2b checksum over every tensor and every other metadata field. Its name is a
digest of the session's name. Writing goes to a temporary name in the same folder, is fsynced,
renamed over the final name, and the folder is fsynced. Opening checks every metadata field (the
book against the grid and the tensors' shapes, the time not in the future, the name against the
file's); loading re-computes the checksum and checks the session asked for. A file that is cut,
altered, misnamed, written for other weights, another grid, dtype or format is refused and
removed, and the session is read again. Files older than the TTL go, and the oldest go first while
the folder holds more than its cap.

A file stays after its session is restored: until a newer park replaces it or the session is
forgotten, it is what a crash falls back to. One process owns a folder at a time (an ``flock`` on
``.lock``, let go when the process ends, however it ends); a second process on the same folder
takes the first free subfolder ``also-1``, ``also-2``, ... of its own instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from shadow.core.errors import StoreError
from shadow.core.protocols import Reader, Stored, Telemetry
from shadow.core.session import Position, SessionBook, checked_meta

FORMAT_VERSION = "shadow-session-2"  # 2: the checksum covers the metadata; files of 1 are refused
LAYOUT = {
    "k": "[rows, kv_heads, head_dim] per full-attention layer, committed rows only",
    "v": "[rows, kv_heads, head_dim] per full-attention layer, committed rows only",
    "conv": "[conv_dim, kernel] per GDN layer: the last `kernel` pre-conv inputs",
    "recurrent": "[value_heads, key_dim, value_dim] fp32 per GDN layer (S, keys first)",
    "ids": "[n] int32: every id the session holds",
}
SUFFIX = ".safetensors"
LOCK = ".lock"
MAX_SHARERS = 16  # processes on one folder at once: the folder itself and 15 subfolders
FUTURE_SLACK_S = 60.0  # a wall clock stepped back (NTP) must not refuse a file parked just before
META_KEYS = {"format", "weights_hash", "grid", "dtype", "session", "parked_at", "book", "layout", "checksum"}


def _checksum(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """BLAKE2b of each tensor (name, dtype, shape, bytes) on a thread pool (hashlib lets go of the
    GIL on large buffers), then BLAKE2b over those digests in name order and every metadata field
    but the checksum itself: the session's name, its book and its ids are covered as its tensors are."""

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
    top.update(json.dumps({k: v for k, v in meta.items() if k != "checksum"}, sort_keys=True).encode())
    return top.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _claim(root: Path) -> tuple[Path, int]:
    """The first of ``root``, ``root/also-1``, ... that no other process holds, locked for this one
    (the lock goes with the process, even a killed one): two processes never share a folder."""
    for i in range(MAX_SHARERS):
        folder = root if i == 0 else root / f"also-{i}"
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking
        return folder, fd
    raise StoreError(f"{root} and its subfolders also-1 to also-{MAX_SHARERS - 1} are each held by another "
                     f"process: set QWEN38_SHADOW_DISK to a folder of this process's own, or to off")


# a refusal's message -> its bounded reason (a metric's label): the messages below start so
REASONS = (("unreadable", "unreadable"), ("format is", "format"), ("weights_hash is", "weights"),
           ("grid is", "grid"), ("dtype is", "dtype"), ("bad metadata", "metadata"), ("checksum", "checksum"),
           ("holds session", "session"), ("ids outside", "vocabulary"), ("does not fit", "model"))


def refusal_reason(why: str) -> str:
    return next((reason for start, reason in REASONS if why.startswith(start)), "other")


class DiskStore:
    def __init__(self, root: str | Path, reader: Reader, weights_hash: str, *, max_bytes: int,
                 ttl_s: float = 48 * 3600, clock: Callable[[], float] = time.time,
                 telemetry: Telemetry | None = None) -> None:
        self.telemetry = telemetry  # refusals counted by reason
        self.asked_root = Path(root)
        self.root, fd = _claim(self.asked_root)
        self._unlock = weakref.finalize(self, os.close, fd)  # closing the descriptor lets go of the lock
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
        if self.telemetry is not None:
            self.telemetry.count("parked_files_refused", 1, {"reason": refusal_reason(why)})

    def _header(self, path: Path) -> dict[str, str] | None:
        """The file's metadata, every field checked, or None when it is refused (and removed)."""
        try:
            with safe_open(str(path), framework="pt") as f:
                meta: dict[str, str] = f.metadata() or {}
                shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118 (not a mapping)
                ids_dtype = f.get_slice("ids").get_dtype() if "ids" in shapes else None
        except (SafetensorError, OSError, ValueError) as e:
            self._refuse(path, f"unreadable: {e}")
            return None
        for key, want in self._identity.items():
            if meta.get(key) != want:
                self._refuse(path, f"{key} is {meta.get(key)!r}, this reader has {want!r}")
                return None
        try:
            self._check_meta(path, meta, shapes, ids_dtype)
        except (ValueError, TypeError) as e:  # json.loads raises ValueError too
            self._refuse(path, f"bad metadata: {e}")
            return None
        return meta

    def _check_meta(self, path: Path, meta: dict[str, str], shapes: dict[str, list[int]],
                    ids_dtype: str | None) -> None:
        if set(meta) != META_KEYS:
            raise ValueError(f"fields {sorted(meta)}, expected {sorted(META_KEYS)}")
        name = meta["session"]
        if not name or path.name != self._path(name).name:
            raise ValueError(f"holds session {name!r}, whose file is {self._path(name).name}, not {path.name}")
        if meta["layout"] != json.dumps(LAYOUT):
            raise ValueError("layout differs from this format's")
        if len(meta["checksum"]) != 64 or set(meta["checksum"]) - set("0123456789abcdef"):
            raise ValueError(f"checksum {meta['checksum']!r} is not a BLAKE2b-256 hex digest")
        parked_at = float(meta["parked_at"])
        if not math.isfinite(parked_at) or parked_at > self.clock() + FUTURE_SLACK_S:
            raise ValueError(f"parked_at {meta['parked_at']} is not a time at or before now ({self.clock()!r})")
        book = checked_meta(json.loads(meta["book"]), self.reader.grid)
        if shapes.get("ids") != [book["n_ids"]] or ids_dtype != "I32":
            raise ValueError(f"ids are {ids_dtype} {shapes.get('ids')}, the book holds {book['n_ids']} int32 ids")
        rows = {k: s[0] if s else None for k, s in shapes.items() if k.split(".")[0] in ("k", "v")}
        if not rows or set(rows.values()) != {book["committed"]}:
            raise ValueError(f"KV rows are {sorted(set(rows.values()), key=str)}, the book commits {book['committed']}")
        held = {int(k.split(".")[1]) for k in shapes if k.startswith("checkpoint.")}
        if held != set(book["checkpoints"]):
            raise ValueError(f"checkpoint tensors at {sorted(held)}, the book holds {book['checkpoints']}")

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

    def close(self) -> None:
        """Let go of the folder (another process may take it); no more parking here."""
        self._unlock()

    # ---- one session ----------------------------------------------------------------------

    def put(self, name: str, book: SessionBook, tensors: Any) -> int:
        """Park ``name``; returns the file's size. Raises StoreError, leaving no partial file."""
        if not self._unlock.alive:
            raise StoreError(f"could not park session {name!r}: the store at {self.root} is closed")
        data = {"ids": torch.tensor(book.ids, dtype=torch.int32), **self.reader.serialise(book, tensors)}
        now = self.clock()
        meta = {**self._identity, "session": name, "parked_at": repr(now), "book": json.dumps(book.meta()),
                "layout": json.dumps(LAYOUT)}
        meta["checksum"] = _checksum(data, meta)
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
        """A copy of the parked session on the reader's device; the file stays (what restoring uses:
        the file is what a crash falls back to). None if absent or refused."""
        return self._load(name, keep=True)

    def take(self, name: str) -> tuple[SessionBook, Any] | None:
        """The parked session on the reader's device; its file goes. None if absent or refused."""
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
        if _checksum(data, meta) != meta["checksum"]:
            self._refuse(path, "checksum mismatch")
            return None
        if meta["session"] != name:  # a file that is not this session's, whatever else it gets right
            self._refuse(path, f"holds session {meta['session']!r}, not {name!r}")
            return None
        ids = data["ids"]
        if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < self.reader.vocab_size):
            self._refuse(path, f"ids outside the vocabulary [0, {self.reader.vocab_size})")
            return None
        book = SessionBook.from_meta(json.loads(meta["book"]), ids.tolist())
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
