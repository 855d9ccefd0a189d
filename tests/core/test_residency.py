"""Residency on its own: the cap, least-recently-used parking, dropping, positions read without a
restore. The stores here are pure-Python dicts with the ``StateStore`` shape; the tensors are a
byte count. (Parking real tensors on a real disk is tested in tests/backends/test_stores.py.)"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from shadow.core.errors import BadInput, StoreError, UnknownSession
from shadow.core.protocols import Stored
from shadow.core.residency import Residency, WaitedLock
from shadow.core.session import Position, SessionBook
from tests.conftest import FakeClock, wait_until

GRID = 64


@dataclass(eq=False)
class Tensors:
    nbytes: int


class Memory:
    def __init__(self) -> None:
        self.held: dict[str, tuple[SessionBook, Tensors]] = {}

    def put(self, name: str, book: SessionBook, tensors: Tensors) -> int:
        self.held[name] = (book, tensors)
        return tensors.nbytes

    def peek(self, name: str) -> tuple[SessionBook, Tensors] | None:
        return self.held.get(name)

    def take(self, name: str) -> tuple[SessionBook, Tensors] | None:
        return self.held.pop(name, None)

    def remove(self, name: str) -> None:
        self.held.pop(name, None)

    def names(self) -> list[str]:
        return list(self.held)

    def info(self, name: str) -> Stored | None:
        held = self.held.get(name)
        return None if held is None else Stored(held[1].nbytes)

    def close(self) -> None:
        pass


@dataclass
class Disk:
    files: dict[str, tuple[SessionBook, Tensors]] = field(default_factory=dict)
    full: bool = False
    closed: bool = False

    def put(self, name: str, book: SessionBook, tensors: Tensors) -> int:
        if self.full:
            raise StoreError(f"could not park session {name!r}: the disk is full")
        self.files[name] = (copy.deepcopy(book), tensors)  # a file holds a copy, not the live book
        return tensors.nbytes

    def peek(self, name: str) -> tuple[SessionBook, Tensors] | None:
        f = self.files.get(name)
        return None if f is None else (copy.deepcopy(f[0]), f[1])

    def take(self, name: str) -> tuple[SessionBook, Tensors] | None:
        return self.files.pop(name, None)

    def remove(self, name: str) -> None:
        self.files.pop(name, None)

    def names(self) -> list[str]:
        return list(self.files)

    def info(self, name: str) -> Stored | None:
        f = self.files.get(name)
        return None if f is None else Stored(f[1].nbytes, 0.0, f[0].position())

    def close(self) -> None:
        self.closed = True


def residency(disk: Disk | None, cap: int | None, size: int = 100) -> tuple[Residency, list[Tensors]]:
    made: list[Tensors] = []

    def new() -> Tensors:
        made.append(Tensors(size))
        return made[-1]

    return Residency(GRID, new, FakeClock(), memory=Memory(), disk=disk, cap_bytes=cap), made


def feed(r: Residency, name: str, n: int, committed: int = 0) -> None:
    r.clock.advance(1.0)  # every use later than the one before
    with r.using(name, create=True) as (book, _):
        book.feed_prompt(list(range(1, n + 1)))
        book.committed = committed


def test_past_the_cap_the_least_recently_used_is_parked():
    r, _ = residency(Disk(), cap=250)
    for name in "abc":
        feed(r, name, 10)
    assert [r.where(n) for n in "abc"] == ["parked", "resident", "resident"]
    assert r.resident_bytes() == 200
    r.clock.advance(1.0)
    r.restore("a")  # a comes back; b is now the least recently used
    assert [r.where(n) for n in "abc"] == ["resident", "parked", "resident"]


def test_a_session_in_use_is_never_evicted_and_an_oversized_one_parks_after_use():
    r, _ = residency(Disk(), cap=50)
    with r.using("big", create=True) as (book, _):
        book.feed_prompt([1, 2, 3])
        assert r.where("big") == "resident"
        with pytest.raises(BadInput, match="'big' is in use"):
            r.park("big")
        with pytest.raises(BadInput, match="'big' is in use"):
            r.forget("big")
    assert r.where("big") == "parked" and r.resident_bytes() == 0


def test_a_parked_session_comes_back_with_its_own_tensors_and_its_file_stays():
    disk = Disk()
    r, made = residency(disk, cap=None)
    feed(r, "s", 200, committed=128)
    r.park("s")
    assert r.where("s") == "parked" and "s" in disk.files
    with r.using("s") as (book, tensors):
        assert tensors is made[0] and book.committed == 128
        book.committed = 192  # read on after the restore
    # The last park stays, as what a crash falls back to, until a newer park replaces it.
    assert len(made) == 1 and disk.files["s"][0].committed == 128
    assert r.bytes_on_disk("s") == 100 and r.where("s") == "resident"
    r.park("s")
    assert disk.files["s"][0].committed == 192
    r.restore("s")
    r.forget("s")
    assert disk.files == {}


def test_a_dropped_session_waits_for_a_use_before_the_background_reads_it():
    disk = Disk(full=True)  # nothing can be parked: eviction drops
    r, _ = residency(disk, cap=18_000, size=10_000)  # room for one resident and a dropped one's ids
    feed(r, "a", 200, committed=192)
    feed(r, "b", 200, committed=192)
    assert r.where("a") == "dropped" and r.awaits_use("a") and not r.awaits_use("b")
    r.clock.advance(1.0)
    with r.using("a", background=True):  # the reader's own reading is not a use ...
        pass
    assert r.awaits_use("a") and r.where("b") == "dropped" and r.awaits_use("b")
    with r.using("a"):  # ... a feed, a question, a read by name are
        pass
    assert not r.awaits_use("a")
    r.used("b")  # (output ids appended to a dropped session: no state needed)
    assert not r.awaits_use("b")


def test_without_a_disk_an_evicted_session_is_dropped_and_read_again():
    r, made = residency(None, cap=18_000, size=10_000)
    feed(r, "a", 200, committed=192)
    feed(r, "b", 10)
    assert r.where("a") == "dropped"
    assert r.position("a") == Position(200, 0, 1, (), 0, 192, r.position("a").last_used, settled=192)
    with r.using("a") as (book, tensors):
        assert tensors is made[2] and book.committed == 0 and book.reread == 192


def test_a_failed_park_drops_the_session_and_says_why():
    r, _ = residency(Disk(full=True), cap=None)
    feed(r, "s", 100, committed=64)
    r.park("s")
    assert r.where("s") == "dropped" and r.park_failures == 1
    assert "could not park session 's': the disk is full" in r.last_store_error
    assert r.position("s").committed == 0 and r.position("s").reread == 64


def test_position_never_restores():
    disk = Disk()
    r, _ = residency(disk, cap=None)
    feed(r, "s", 300, committed=256)
    r.park("s")
    pos = r.position("s")
    assert (pos.length, pos.committed, pos.pending, pos.turns) == (300, 256, 44, 1)
    assert r.where("s") == "parked" and r.memory.names() == [] and "s" in disk.files
    # A session a planned stop parked, found by a new process: its position comes from the file.
    r2, made2 = residency(disk, cap=None)
    assert r2.names() == ["s"] and r2.position("s") == pos
    assert r2.where("s") == "parked" and made2 == [] and "s" in disk.files


def test_the_view_and_the_ids_are_copies():
    r, _ = residency(None, cap=None)
    feed(r, "s", 5)
    pos, ids = r.position("s"), r.session_ids("s")
    assert ids == (1, 2, 3, 4, 5)
    with pytest.raises(AttributeError):
        pos.committed = 64  # type: ignore[misc]
    feed(r, "s", 7)
    assert pos.length == 5 and ids == (1, 2, 3, 4, 5) and r.position("s").length == 7


def test_the_ids_of_a_session_parked_by_an_earlier_process():
    disk = Disk()
    r, _ = residency(disk, cap=None)
    feed(r, "s", 70, committed=64)
    r.close()
    assert r.where("s") == "parked"
    r2, _ = residency(disk, cap=None)
    assert r2.session_ids("s") == tuple(range(1, 71))


def test_unknown_and_forgotten_sessions():
    disk = Disk()
    r, _ = residency(disk, cap=None)
    for call in (r.position, r.where, r.check, r.park, r.session_ids):
        with pytest.raises(UnknownSession, match="unknown session 'x'"):
            call("x")
    with pytest.raises(UnknownSession), r.using("x"):
        pass
    feed(r, "s", 10)
    r.park("s")
    r.forget("s")
    assert r.names() == [] and disk.files == {}
    with pytest.raises(UnknownSession):
        r.position("s")


def test_close_parks_every_resident_session():
    disk = Disk()
    r, _ = residency(disk, cap=None)
    for name in "ab":
        feed(r, name, 10)
    r.close()
    assert sorted(disk.files) == ["a", "b"] and r.memory.names() == [] and disk.closed



def test_counts_are_positions_two_numbers_resident_parked_and_unknown():
    r, _ = residency(Disk(), cap=None)
    feed(r, "s", 200, committed=128)
    assert r.counts("s") == (200, 128) == (r.position("s").length, r.position("s").committed)
    r.park("s")
    assert r.counts("s") == (200, 128) and r.where("s") == "parked"  # read from the file's record
    with pytest.raises(UnknownSession):
        r.counts("nobody")


# ---- every byte held for a session is counted or bounded ---------------------------------------


def test_a_parked_session_keeps_its_position_here_and_its_ids_in_its_file():
    disk = Disk()
    r, _ = residency(disk, cap=None)
    feed(r, "s", 300, committed=256)
    r.park("s")
    assert r._known["s"].book is None and r.held_book("s") is None  # no ids held in the process
    assert r.counts("s") == (300, 256) and r.position("s").turns == 1
    assert r.session_ids("s") == tuple(range(1, 301))  # reloaded from the file
    r.park("s")
    disk.files.clear()  # the file gone (refused, swept): the session is empty until the host feeds it again
    assert r.counts("s") == (0, 0)
    with r.using("s") as (book, _):
        assert list(book.ids) == [] and book.committed == 0


def test_dropped_ids_count_against_the_cap_and_the_oldest_are_forgotten(caplog):
    r, _ = residency(None, cap=18_000, size=10_000)  # no disk: every eviction drops
    for name in "abcd":
        feed(r, name, 1_800)  # 7,200 bytes of ids each once dropped (4 bytes an id)
    assert r.names() == ["c", "d"] and r.forgotten == 2
    assert [r.where(n) for n in "cd"] == ["dropped", "resident"]
    assert r.dropped_bytes() == 7_200 and r.resident_bytes() + r.dropped_bytes() <= 18_000
    assert r.last_forgotten == "b: its ids to read again would take the cap past 18000 bytes"
    assert "forgot session 'a'" in caplog.text
    assert r.bounds().forgotten == 2 and r.bounds().dropped_bytes == 7_200


def test_beyond_max_sessions_the_least_recently_used_is_forgotten(caplog):
    disk = Disk()
    r = Residency(GRID, lambda: Tensors(10), FakeClock(), memory=Memory(), disk=disk, cap_bytes=None,
                  max_sessions=3)
    for name in "abc":
        feed(r, name, 10)
    r.park("a")
    r.clock.advance(1.0)
    r.restore("a")  # a used again: b is now the least recently used
    r.clock.advance(1.0)
    with r.using("d", create=True), r.using("c"):  # d in use, and c is used inside: neither may go
        pass
    assert sorted(r.names()) == ["a", "c", "d"] and r.forgotten == 1
    assert r.last_forgotten == "b: more than MAX_SESSIONS=3 sessions" and "forgot session 'b'" in caplog.text
    r.park("a")
    feed(r, "e", 10)  # a parked session is forgotten like any other: its file goes too
    assert sorted(r.names()) == ["c", "d", "e"] and "a" not in disk.files


def test_ids_appended_without_a_restore_count_against_the_cap():
    r, _ = residency(None, cap=18_000, size=10_000)
    feed(r, "a", 1_800)
    feed(r, "b", 90)  # a is dropped: 7,200 bytes of ids (4 bytes an id), b resident: 10,000
    assert r.where("a") == "dropped" and r.resident_bytes() + r.dropped_bytes() <= 18_000
    book = r.held_book("a")
    assert book is not None
    book.feed_output(list(range(900)))  # output appended to a dropped session: its bookkeeping only
    r.clock.advance(1.0)
    r.used("a")  # 10,800 bytes of ids now: b, the least recently used, is evicted (dropped: no disk)
    assert r.resident_bytes() + r.dropped_bytes() <= 18_000
    assert [r.where(n) for n in "ab"] == ["dropped", "dropped"] and r.dropped_bytes() == 10_800 + 360


def test_whoever_keeps_something_per_session_hears_of_every_forget():
    r = Residency(GRID, lambda: Tensors(10), FakeClock(), memory=Memory(), disk=None, cap_bytes=None,
                  max_sessions=2)
    heard: list[str] = []
    r.on_forget.append(heard.append)
    for name in "abc":
        feed(r, name, 10)  # c makes three: a, the least recently used, goes
    r.forget("b")  # a DELETE
    assert heard == ["a", "b"] and r.names() == ["c"]


def test_the_facade_lock_counts_who_waits_for_it_not_its_holder_coming_back() -> None:
    lock = WaitedLock()
    with lock:
        with lock:  # re-entrant: the holder comes back without waiting
            assert lock.waiting == 0
        took: list[bool] = []
        other = threading.Thread(target=lambda: took.append(lock.acquire(timeout=0.05)))
        other.start()
        other.join(5.0)
        assert took == [False] and lock.waiting == 0  # it gave up: no longer counted
        assert not _in_thread(lambda: lock.acquire(blocking=False))
        waiter = threading.Thread(target=lambda: (lock.acquire(), took.append(True), lock.release()))
        waiter.start()
        wait_until(lambda: lock.waiting == 1, "the second thread to wait")
    waiter.join(5.0)
    assert took == [False, True] and lock.waiting == 0


def _in_thread(call: Callable[[], bool]) -> bool:
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(call()))
    t.start()
    t.join(5.0)
    return out[0]
