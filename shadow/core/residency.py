"""Where each session's state lives: resident in ``memory``, parked in ``disk``, or dropped.

Resident bytes are counted from what the memory store reports (KV capacity and checkpoints
included). Past ``cap_bytes`` the least recently used session not in use is parked, or dropped
and later read again from the start when there is no disk or the write fails. A parked session
comes back on its next use; its file stays until a newer park replaces it or it is forgotten, so a
crash costs the reading since the last park, never the session. A dropped session waits for its
next use (fed, asked, read by name) before the background reads it again: over the cap with no
disk, reading one session must not drop another only to read that one again, without end. One
re-entrant lock serialises every call, so the session a call uses is never evicted under it; it
counts the threads waiting for it, so a background read can step aside (``Shadow.read``'s
``yields``). A session larger than the cap is resident while in use and parked as soon as the use ends.
Torch-free: the tensors are the stores' and the reader's.

Every byte held for a session is counted or bounded. A parked session keeps its position here
(through the disk's index) and its ids in its file only, reloaded on restore; a file refused then
leaves the session empty, to be fed again by the host's next prompt (a whole prompt, as always).
A dropped session keeps its ids to be read again, and they count against the cap: past it, once
no resident session is left to evict, the least recently used dropped sessions are forgotten.
Beyond ``max_sessions`` the least recently used session not in use is forgotten. Both are logged
and counted in ``forgotten``.

With a shared store (``leases``, docs/scale-out.md), a session is held while resident: its lease is
taken before it is brought back (``HeldElsewhere`` when another instance holds it, and nothing of it
is kept here), let go when it is parked, dropped or forgotten; a session new here is first looked
for in the store. A lease found lost, or a park the store refuses as stale (``LeaseLost``), drops the
session here without parking it, counted in ``lost``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from .errors import BadInput, HeldElsewhere, LeaseLost, StoreError, UnknownSession
from .leases import Leases
from .protocols import StateStore, Telemetry
from .records import Bounds
from .session import Position, SessionBook

Where = Literal["resident", "parked", "dropped"]
log = logging.getLogger(__name__)


def process_rss() -> int | None:
    """The process's resident memory in bytes (Linux ``/proc/self/statm``), None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class _Entry:
    where: Where
    book: SessionBook | None  # None while parked: the book and ids are in its file
    awaits_use: bool = False  # dropped and not used since: the background leaves it alone
    last_used: float = 0.0  # for forgetting the least recently used (parked ones have no book here)


class WaitedLock:
    """A re-entrant lock that knows how many other threads wait for it.

    What lets a background read holding the facade stop after its pass in flight, however a caller
    reached the facade (a request announced or not, a question, a status look): without the count,
    a caller that came in between two of a slice's passes waited for the whole slice."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self._waiting = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):  # free, or already this thread's: nobody waits
            return True
        if not blocking:
            return False
        with self._count:
            self._waiting += 1
        try:
            return self._lock.acquire(True, timeout)
        finally:
            with self._count:
                self._waiting -= 1

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def waiting(self) -> int:
        """Threads blocked in ``acquire`` now (a snapshot: one may arrive or leave right after)."""
        return self._waiting


class Residency:
    def __init__(self, grid: int, new_tensors: Callable[[], Any], clock: Callable[[], float], *,
                 memory: StateStore, disk: StateStore | None = None, cap_bytes: int | None = None,
                 max_sessions: int | None = None, telemetry: Telemetry | None = None,
                 leases: Leases | None = None) -> None:
        self.grid = grid
        self.telemetry = telemetry  # parks and restores, counted and timed
        self.new_tensors = new_tensors
        self.clock = clock
        self.memory = memory
        self.disk = disk
        self.cap_bytes = cap_bytes
        self.max_sessions = max_sessions
        self.forgotten = 0  # sessions forgotten to stay within the cap or max_sessions
        self.last_forgotten = ""  # the last one, and why
        self.park_failures = 0
        self.last_store_error = ""
        self.lock = WaitedLock()
        # A shared store's leases (STORE): a session is held while resident, let go when parked,
        # dropped or forgotten; one found lost (taken by another instance) is dropped here unparked.
        self.leases = leases
        self.lost = 0  # sessions dropped because another instance took their lease
        if leases is not None:
            leases.watch(self._lost)
        # called with a session's name once it is forgotten, however (a DELETE, the cap, MAX_SESSIONS):
        # what others keep per session (a chunk's cost, a profile) goes with it
        self.on_forget: list[Callable[[str], None]] = []
        self._known: dict[str, _Entry] = {}
        self._in_use: set[str] = set()
        if disk is not None:  # sessions a planned stop parked, found again
            for name in disk.names():
                info = disk.info(name)
                seen = info.position.last_used if info is not None and info.position is not None else 0.0
                self._known[name] = _Entry("parked", None, last_used=seen)

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

    def counts(self, session: str, settled: bool = False) -> tuple[int, int]:
        """``(ids held, ids committed)``: ``position``'s two numbers without its copy of the rest
        (the host asks on every decode round). With ``settled``, the settled end in place of the ids
        held (``SessionBook.settled_end``)."""
        held, end, committed = self.ends(session)
        return end if settled else held, committed

    def ends(self, session: str) -> tuple[int, int, int]:
        """``(ids held, settled end, ids committed)`` in one look (the facade's after every feed)."""
        with self.lock:
            book = self._entry(session).book
            if book is not None:
                return len(book.ids), book.settled_end, book.committed
        p = self.position(session)
        return p.length, p.settled, p.committed

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
        """A use that needs no state (output ids appended): the session may be read again. The ids
        it now holds count against the cap as any use's do."""
        with self.lock:
            entry = self._entry(session)
            entry.awaits_use = False
            entry.last_used = self.clock()
            self._enforce_cap()

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
            created = entry is None
            if entry is None:
                if not create:
                    raise UnknownSession(f"unknown session {session!r}")
                # with a shared store, a session new here may be one another instance parked: looked for there
                shared = self.leases is not None and self.disk is not None
                entry = self._known[session] = _Entry("parked", None) if shared else _Entry("resident",
                                                                                            SessionBook(self.grid))
                self._limit_sessions(session)
            if not background:
                entry.awaits_use = False
            self._in_use.add(session)
            try:
                try:
                    book, tensors = self._make_resident(session, entry)
                except HeldElsewhere:
                    if created:  # nothing of it is kept here: the holder follows it
                        del self._known[session]
                    raise
                yield book, tensors
                book.last_used = entry.last_used = self.clock()
            finally:
                self._in_use.discard(session)
                self._enforce_cap()

    def _make_resident(self, name: str, entry: _Entry) -> tuple[SessionBook, Any]:
        held = self.memory.peek(name)
        if held is not None:
            return held
        if self.leases is not None:  # before the state is looked for: another holder raises HeldElsewhere
            self.leases.take(name)
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
                entry.where, entry.book = "parked", None  # the ids live in the file until restored
                self._release(name)
                return
            except LeaseLost as err:  # a newer holder has it: this copy is stale, parked nowhere
                self.last_store_error = str(err)
                self._lost(name)
                return
            except StoreError as err:
                self.park_failures += 1
                self.last_store_error = str(err)
        book.reset_for_reread()
        entry.where, entry.awaits_use = "dropped", True
        self._release(name)

    def _release(self, name: str) -> None:
        if self.leases is not None:
            self.leases.release(name)

    def _lost(self, name: str) -> None:
        """Another instance took ``name``'s lease: drop everything of it here, park nothing, count it."""
        with self.lock:
            entry = self._known.pop(name, None)
            if entry is None:
                return
            self.memory.remove(name)
            entry.where, entry.book = "dropped", None
            self.lost += 1
            log.warning("session %r: its lease was taken by another instance; the copy here is dropped", name)
            for hook in self.on_forget:
                hook(name)

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

    @staticmethod
    def _ids_kept(entry: _Entry) -> int:
        return entry.book.ids_nbytes() if entry.where == "dropped" and entry.book is not None else 0

    def dropped_bytes(self) -> int:
        """The ids dropped sessions keep to be read again: counted against the cap."""
        with self.lock:
            return sum(self._ids_kept(e) for e in self._known.values())

    def bounds(self) -> Bounds:
        """What status shows beside the cap: the ids dropped sessions keep (counted in it), the
        process's resident memory, the session limit and what was forgotten to keep within them."""
        with self.lock:
            return Bounds(self.dropped_bytes(), process_rss(), self.max_sessions, self.forgotten,
                          self.last_forgotten)

    def _idle_by_age(self, names: Iterator[str] | list[str]) -> list[str]:
        return sorted((n for n in names if n not in self._in_use), key=lambda n: self._known[n].last_used)

    def _enforce_cap(self) -> None:
        """Least recently used first: a resident session is parked (or dropped), a dropped one is
        forgotten; then, if its ids still do not fit, each session just dropped, oldest first."""
        if self.cap_bytes is None:
            return
        total = self.resident_bytes() + self.dropped_bytes()
        for final in (False, True):
            held = [n for n, e in self._known.items() if e.where == "dropped" or (not final and e.where == "resident")]
            for name in self._idle_by_age(held):
                if total <= self.cap_bytes:
                    return
                entry = self._known[name]
                if entry.where == "resident":
                    total -= self.bytes_resident(name)
                    self._evict(name)
                    total += self._ids_kept(entry)
                else:
                    total -= entry.book.ids_nbytes() if entry.book else 0
                    self._forget_for(name, f"its ids to read again would take the cap past {self.cap_bytes} bytes")

    def _limit_sessions(self, new: str) -> None:
        if self.max_sessions is None or len(self._known) <= self.max_sessions:
            return
        for name in self._idle_by_age([n for n in self._known if n != new]):
            if len(self._known) <= self.max_sessions:
                return
            self._forget_for(name, f"more than MAX_SESSIONS={self.max_sessions} sessions")

    def _forget_for(self, name: str, why: str) -> None:
        self.forget(name)
        self.forgotten += 1
        self.last_forgotten = f"{name}: {why}"
        log.warning("forgot session %r, the least recently used: %s", name, why)

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
            self._release(session)
            for hook in self.on_forget:
                hook(session)

    def close(self) -> None:
        """A planned stop: after the call in flight (the lock), park every resident session, then
        let go of the stores (the disk's folder, for the next process)."""
        with self.lock:
            for name in list(self.memory.names()):
                self._evict(name)
            self.memory.close()
            if self.leases is not None:
                self.leases.close()
            if self.disk is not None:
                self.disk.close()
