"""Parked sessions: one file per session (the format is parked.py's), written so that a crash
never leaves a file that loads wrong, and bound to its session so that no session ever loads another's.

A file's name is a digest of the session's name. Writing goes to a temporary name in the same
folder, is fsynced, renamed over the final name, and the folder is fsynced. Opening checks every
metadata field; loading re-computes the checksum and checks the session asked for. A file that is
cut, altered, misnamed, written for other weights, another grid, dtype or format is refused and
removed, and the session is read again; nothing a file holds raises out of the store. Files older
than the TTL go, and the oldest go first while the folder holds more than its cap.

A file stays after its session is restored: until a newer park replaces it or the session is
forgotten, it is what a crash falls back to. One process owns a folder at a time (an ``flock`` on
``.lock``, let go when the process ends, however it ends); a second process on the same folder
takes the first free subfolder ``also-1``, ``also-2``, ... of its own instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from shadow.core.errors import StoreError
from shadow.core.protocols import Reader, Stored, Telemetry
from shadow.core.session import Position, SessionBook

from . import parked
from .parked import Refused

LOCK = ".lock"
MAX_SHARERS = 16  # processes on one folder at once: the folder itself and 15 subfolders


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
REASONS = (("unreadable", "unreadable"), ("bad file", "unreadable"), ("format is", "format"),
           ("weights_hash is", "weights"), ("grid is", "grid"), ("dtype is", "dtype"), ("bad metadata", "metadata"),
           ("checksum", "checksum"), ("a valid file, but not the last park", "not_last_park"),
           ("holds session", "session"), ("ids outside", "vocabulary"), ("does not fit", "model"))


def refusal_reason(why: str) -> str:
    return next((reason for start, reason in REASONS if why.startswith(start)), "other")


REFUSED_KEPT = 64  # the newest refusals kept with their reasons (metrics count them all, by reason)


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
        # The checksum of each park this process made: restoring takes that park and no other valid
        # file put in its place (an older park of the same session would not match the bookkeeping).
        # Files found at the start have none: a new process takes what is on disk (crash recovery).
        self._made: dict[str, str] = {}
        self._scan()

    # ---- the folder ------------------------------------------------------------------------

    @property
    def _identity(self) -> dict[str, str]:
        return parked.identity(self.weights_hash, self.reader.grid, self.reader.dtype)

    def _path(self, name: str) -> Path:
        return self.root / parked.file_name(name)

    def _refuse(self, path: Path, why: str) -> None:
        self.refused.append((path.name, why))
        del self.refused[:-REFUSED_KEPT]  # a folder others keep writing bad files to grows nothing here
        path.unlink(missing_ok=True)
        if self.telemetry is not None:
            self.telemetry.count("parked_files_refused", 1, {"reason": refusal_reason(why)})

    def _header(self, path: Path) -> dict[str, str] | None:
        """The file's metadata, every field checked, or None when it is refused (and removed)."""
        try:
            return parked.open_header(path, self._identity, self.reader.grid, self.clock())
        except Refused as e:
            self._refuse(path, str(e))
            return None

    def _scan(self) -> None:
        for tmp in self.root.glob("*.tmp*"):  # a write that never reached its rename
            tmp.unlink(missing_ok=True)
        for path in sorted(self.root.glob("*" + parked.SUFFIX)):
            meta = self._header(path)
            if meta is not None:
                self._index[meta["session"]] = {"path": path, "bytes": path.stat().st_size,
                                                "parked_at": float(meta["parked_at"]),
                                                "book": json.loads(meta["book"]), "checksum": meta["checksum"]}
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

    def remove(self, name: str) -> None:
        self._made.pop(name, None)
        e = self._index.pop(name, None)
        if e is not None:
            e["path"].unlink(missing_ok=True)

    # ---- a park that came from elsewhere (the shared store's tier, tiered.py) -----------------

    @property
    def identity(self) -> dict[str, str]:
        """The fields a parked file must match to load here (what a shared store's manifest records)."""
        return self._identity

    def park_of(self, name: str) -> tuple[Path, str] | None:
        """The session's parked file and its checksum (the park's identity), None when none."""
        e = self._index.get(name)
        return None if e is None else (e["path"], e["checksum"])

    def incoming(self, name: str) -> Path:
        """Where a park arriving from elsewhere is assembled: a temporary name in this folder (a start
        removes what a crash left), then ``adopt``ed."""
        return self._path(name).with_name(parked.file_name(name) + f".tmp-in{os.getpid()}")

    def adopt(self, name: str, tmp: Path, checksum: str) -> bool:
        """Take the complete file ``tmp`` (``incoming``'s, fsynced) as ``name``'s park, renamed over
        its file: its header is checked as any file's on opening, and loading it later checks every
        byte against ``checksum``. False (the file refused, counted and removed) when it fails."""
        self._index.pop(name, None)
        self._made.pop(name, None)
        final = self._path(name)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        meta = self._header(final)
        if meta is None:
            return False
        self._index[name] = {"path": final, "bytes": final.stat().st_size, "parked_at": float(meta["parked_at"]),
                             "book": json.loads(meta["book"]), "checksum": meta["checksum"]}
        self._made[name] = checksum
        return True

    def close(self) -> None:
        """Let go of the folder (another process may take it); no more parking here."""
        self._unlock()

    # ---- one session ----------------------------------------------------------------------

    def put(self, name: str, book: SessionBook, tensors: Any) -> int:
        """Park ``name``; returns the file's size. Raises StoreError, leaving no partial file."""
        if not self._unlock.alive:
            raise StoreError(f"could not park session {name!r}: the store at {self.root} is closed")
        now = self.clock()
        data, meta = parked.encode(name, book, self.reader.serialise(book, tensors), self._identity, now)
        final = self._path(name)
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        try:
            parked.write(tmp, data, meta)
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
        self._index[name] = {"path": final, "bytes": size, "parked_at": now, "book": book.meta(),
                             "checksum": meta["checksum"]}
        self._made[name] = meta["checksum"]
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
        made = self._made.pop(name, None)
        if e is None:
            return None
        path: Path = e["path"]
        meta = self._header(path)
        if meta is None:
            return None
        try:
            book, data = parked.load(path, meta, name, self.reader.vocab_size, made)
            tensors = self.reader.deserialise(book, data)
        except Refused as err:
            self._refuse(path, str(err))
            return None
        except Exception as err:  # a file that passed every check and still does not fit
            self._refuse(path, f"does not fit this model: {type(err).__name__}: {str(err)[:200]}")
            return None
        if keep:
            self._index[name] = e
            if made is not None:
                self._made[name] = made
        else:
            path.unlink(missing_ok=True)  # the session lives on the device again; its file is stale from here
        return book, tensors
