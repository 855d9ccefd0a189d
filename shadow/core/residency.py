"""Where each session's state lives: resident in ``memory``, parked in ``disk``, or dropped.

Resident bytes are counted from what the memory store reports (KV capacity and checkpoints
included). Past ``cap_bytes`` the least recently used session not in use is parked, or dropped
and later read again from the start when there is no disk or the write fails. A parked session
comes back on its next use; its file stays until a newer park replaces it or it is forgotten, so a
crash costs the reading since the last park, never the session. A dropped session waits for its
next use (fed, asked, read by name) before the background reads it again: over the cap with no
disk, reading one session must not drop another only to read that one again, without end. One
re-entrant lock serialises every call, so the session a call uses is never evicted under it; a
session larger than the cap is resident while in use and parked as soon as the use ends.
Torch-free: the tensors are the stores' and the reader's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from .errors import BadInput, StoreError, UnknownSession
from .protocols import StateStore, Telemetry
from .session import Position, SessionBook

Where = Literal["resident", "parked", "dropped"]


@dataclass
class _Entry:
    where: Where
    book: SessionBook | None  # None: parked by an earlier process; the book is in its file
    awaits_use: bool = False  # dropped and not used since: the background leaves it alone


class Residency:
    def __init__(self, grid: int, new_tensors: Callable[[], Any], clock: Callable[[], float], *,
                 memory: StateStore, disk: StateStore | None = None, cap_bytes: int | None = None,
                 telemetry: Telemetry | None = None) -> None:
        self.grid = grid
        self.telemetry = telemetry  # parks and restores, counted and timed
        self.new_tensors = new_tensors
        self.clock = clock
        self.memory = memory
        self.disk = disk
        self.cap_bytes = cap_bytes
        self.park_failures = 0
        self.last_store_error = ""
        self.lock = threading.RLock()
        self._known: dict[str, _Entry] = {}
        self._in_use: set[str] = set()
        if disk is not None:  # sessions a planned stop parked, found again
            for name in disk.names():
                self._known[name] = _Entry("parked", None)

    # ---- what is known -----------------------------------------------------------------------

    def _entry(self, session: str) -> _Entry:
        try:
            return self._known[session]
        except KeyError:
            raise UnknownSession(f"unknown session {session!r}") from None

    def check(self, session: str) -> None:
        """Raise UnknownSession for a session never fed (or forgotten)."""
        with self.lock:
            self._entry(session)

    def names(self) -> list[str]:
        with self.lock:
            return list(self._known)

    def where(self, session: str) -> Where:
        with self.lock:
            return self._entry(session).where

    def position(self, session: str) -> Position:
        """The session's bookkeeping as it stands, without bringing its state back."""
        with self.lock:
            entry = self._entry(session)
            if entry.book is not None:
                return entry.book.position()
            info = self.disk.info(session) if self.disk is not None else None
            if info is None or info.position is None:
                return Position()
            return info.position

    def counts(self, session: str) -> tuple[int, int]:
        """``(ids held, ids committed)``: ``position``'s two numbers without its copy of the rest
        (the host asks on every decode round)."""
        with self.lock:
            book = self._entry(session).book
            if book is not None:
                return len(book.ids), book.committed
        p = self.position(session)
        return p.length, p.committed

    def session_ids(self, session: str) -> tuple[int, ...]:
        """Every id the session holds. A session parked by an earlier process keeps its ids in its
        file only: that one is restored to read them (what using it next would do anyway)."""
        with self.lock:
            entry = self._entry(session)
            if entry.book is None:
                with self.using(session) as (book, _):
                    return tuple(book.ids)
            return tuple(entry.book.ids)

    def awaits_use(self, session: str) -> bool:
        """Dropped and not used since: the background (``read()`` of every session, the idle
        window) does not read it again until it is used."""
        with self.lock:
            return self._entry(session).awaits_use

    def used(self, session: str) -> None:
        """A use that needs no state (output ids appended): the session may be read again."""
        with self.lock:
            self._entry(session).awaits_use = False

    def held_book(self, session: str) -> SessionBook | None:
        """The book of a session whose bookkeeping is at hand (resident or dropped): what a change
        that needs no state (output ids appended) updates in place. None while it is parked."""
        with self.lock:
            entry = self._entry(session)
            return entry.book if entry.where != "parked" else None

    # ---- using a session ---------------------------------------------------------------------

    @contextmanager
    def using(self, session: str, create: bool = False, background: bool = False) -> Iterator[tuple[SessionBook, Any]]:
        """The session's book and tensors, resident for the duration (restored or made empty first).
        ``background``: the reader's own reading, which is not a use (see ``awaits_use``)."""
        with self.lock:
            entry = self._known.get(session)
            if entry is None:
                if not create:
                    raise UnknownSession(f"unknown session {session!r}")
                entry = self._known[session] = _Entry("resident", SessionBook(self.grid))
            if not background:
                entry.awaits_use = False
            self._in_use.add(session)
            try:
                book, tensors = self._make_resident(session, entry)
                yield book, tensors
                book.last_used = self.clock()
            finally:
                self._in_use.discard(session)
                self._enforce_cap()

    def _make_resident(self, name: str, entry: _Entry) -> tuple[SessionBook, Any]:
        held = self.memory.peek(name)
        if held is not None:
            return held
        # peek, not take: the file stays as what a crash falls back to, until a newer park replaces it
        t0 = time.perf_counter()
        got = self.disk.peek(name) if self.disk is not None and entry.where == "parked" else None
        if got is not None:
            self._timed("restore", t0)
            parked_book, tensors = got
            book = entry.book if entry.book is not None else parked_book
        else:
            book = entry.book if entry.book is not None else SessionBook(self.grid)
            if book.committed:  # dropped, or its parked file was refused: read the same ids again
                book.reset_for_reread()
            tensors = self.new_tensors()
        entry.book, entry.where = book, "resident"
        self.memory.put(name, book, tensors)
        return book, tensors

    # ---- evicting ----------------------------------------------------------------------------

    def _evict(self, name: str) -> None:
        held = self.memory.take(name)
        if held is None:
            return
        book, tensors = held
        entry = self._known[name]
        if self.disk is not None:
            try:
                t0 = time.perf_counter()
                self.disk.put(name, book, tensors)
                self._timed("park", t0)
                entry.where = "parked"
                return
            except StoreError as err:
                self.park_failures += 1
                self.last_store_error = str(err)
        book.reset_for_reread()
        entry.where, entry.awaits_use = "dropped", True

    def _timed(self, what: str, t0: float) -> None:
        if self.telemetry is not None:
            self.telemetry.count(what + "s")
            self.telemetry.observe(what + "_seconds", time.perf_counter() - t0)

    def bytes_resident(self, session: str) -> int:
        with self.lock:
            info = self.memory.info(session)
            return info.bytes if info is not None else 0

    def bytes_on_disk(self, session: str) -> int:
        with self.lock:
            self._entry(session)
            if self.disk is None:  # (a resident session's last park stays on disk: it is counted too)
                return 0
            info = self.disk.info(session)
            return info.bytes if info is not None else 0

    def resident_bytes(self) -> int:
        with self.lock:
            return sum(self.bytes_resident(n) for n in self.memory.names())

    def _enforce_cap(self) -> None:
        if self.cap_bytes is None:
            return
        total = self.resident_bytes()

        def last_used(name: str) -> float:
            book = self._known[name].book
            return book.last_used if book is not None else 0.0

        idle = sorted((n for n in self.memory.names() if n not in self._in_use), key=last_used)
        for name in idle:
            if total <= self.cap_bytes:
                break
            total -= self.bytes_resident(name)
            self._evict(name)

    def restore(self, session: str) -> None:
        """Bring ``session`` back now (from its parked file, or empty to be read again)."""
        with self.using(session):
            pass

    def park(self, session: str) -> None:
        """Park (or drop) ``session`` now, whatever the cap."""
        with self.lock:
            self._entry(session)
            if session in self._in_use:
                raise BadInput(f"session {session!r} is in use")
            self._evict(session)

    def forget(self, session: str) -> None:
        """Drop everything of ``session``: its resident state, its parked file, its bookkeeping."""
        with self.lock:
            self._entry(session)
            if session in self._in_use:
                raise BadInput(f"session {session!r} is in use")
            self.memory.remove(session)
            if self.disk is not None:
                self.disk.remove(session)
            del self._known[session]

    def close(self) -> None:
        """A planned stop: after the call in flight (the lock), park every resident session, then
        let go of the stores (the disk's folder, for the next process)."""
        with self.lock:
            for name in list(self.memory.names()):
                self._evict(name)
            self.memory.close()
            if self.disk is not None:
                self.disk.close()
