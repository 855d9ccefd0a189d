"""Leases in Redis: one holder per session, fenced by an epoch (the rules: docs/scale-out.md).

A take is one Lua script: when no other instance holds the lease, ``INCR`` the session's epoch and
``SET lease "<instance>:<epoch>" PX ttl``; otherwise it answers the holder (``HeldElsewhere``). One
background thread renews every lease held, three times a lease: a renewal finds the lease its own
(``PEXPIRE``), or gone with no newer epoch handed out (the store restarted empty, or the lease ran
out untaken: set again under the same epoch), or another's (lost: every listener drops the session,
unparked). A store that cannot be reached makes a take answer "unshared" (followed here, parked
locally), and a lease not renewed within its TTL unshared too; the next renewal that reaches the
store again finds each such lease its own again, or lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from shadow.core.errors import HeldElsewhere
from shadow.core.protocols import Telemetry
from shadow.core.records import Sharing

from .redis_parks import Keys

log = logging.getLogger(__name__)

# KEYS: lease, epoch. ARGV: instance, lease ms, epoch's TTL ms. {1, epoch} or {0, holder's value}.
TAKE = """
local cur = redis.call('GET', KEYS[1])
if cur and string.match(cur, '^(.*):%d+$') ~= ARGV[1] then return {0, cur} end
local e = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. e, 'PX', ARGV[2])
return {1, tostring(e)}
"""
# KEYS: lease, epoch. ARGV: "<instance>:<epoch>", epoch, lease ms, epoch's TTL ms. 1: held, 0: lost.
RENEW = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[3]) return 1 end
if cur then return 0 end
local stored = tonumber(redis.call('GET', KEYS[2]) or '0')
if stored > tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
if stored < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4]) end
return 1
"""
# KEYS: lease. ARGV: "<instance>:<epoch>".
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
return 0
"""


class RedisLeases:
    def __init__(self, client: Any, keys: Keys, instance: str, *, lease_s: float, url: str,
                 epoch_ttl_s: float = 48 * 3600, telemetry: Telemetry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.keys = keys
        self.instance = instance
        self.lease_ms = int(lease_s * 1000)
        self.epoch_ttl_ms = int(epoch_ttl_s * 1000)
        self.url = url  # masked
        self.telemetry = telemetry
        self.clock = clock
        self._take = client.register_script(TAKE)
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # session -> epoch of the lease held
        self._until: dict[str, float] = {}  # session -> when its lease runs out, by the last renewal
        self._unshared: set[str] = set()  # resident here without a lease held in the store
        self._last: dict[str, int] = {}  # session -> the last epoch this instance held it under
        self._listeners: list[Callable[[str], None]] = []
        self.up = True
        self._retry_at = 0.0  # while down, the store is not asked again before this (a dead host costs a timeout)
        self.last_error = ""
        self.lost = 0
        self.stale_parks_refused = 0
        self.parks_refused = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- Leases ------------------------------------------------------------------------------

    def take(self, session: str) -> bool:
        with self._lock:
            if session in self._held:
                return True
        if not self.may_try():  # down a moment ago: followed here without waiting on the store again
            with self._lock:
                self._unshared.add(session)
            return False
        k = self.keys
        try:
            ok, value = self._take(keys=[k.lease(session), k.epoch(session)],
                                   args=[self.instance, self.lease_ms, self.epoch_ttl_ms])
        except Exception as e:  # redis' ConnectionError, TimeoutError, ...: the store is down
            self.trouble(e)
            with self._lock:
                self._unshared.add(session)
            return False
        self.fine()
        text = value.decode() if isinstance(value, bytes) else str(value)
        if not int(ok):
            raise HeldElsewhere(session, text.rsplit(":", 1)[0])
        with self._lock:
            self._held[session] = self._last[session] = int(text)
            self._until[session] = self.clock() + self.lease_ms / 1000
            self._unshared.discard(session)
        self._start()
        return True

    def release(self, session: str) -> None:
        with self._lock:
            epoch = self._held.pop(session, None)
            self._until.pop(session, None)
            self._unshared.discard(session)
        if epoch is None:
            return
        try:
            self._release(keys=[self.keys.lease(session)], args=[f"{self.instance}:{epoch}"])
        except Exception as e:  # the lease runs out by itself
            self.trouble(e)

    def watch(self, on_lost: Callable[[str], None]) -> None:
        self._listeners.append(on_lost)

    def sharing(self) -> Sharing:
        with self._lock:
            return Sharing("up" if self.up else "down", self.instance, self.url, len(self._held), len(self._unshared),
                           self.lost, self.stale_parks_refused, self.parks_refused, self.last_error)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for session in list(self._held):
            self.release(session)

    # ---- what the tiered store asks ----------------------------------------------------------

    def epoch(self, session: str) -> int | None:
        """The epoch of the lease held on ``session``; None when none is held (unshared, or not resident)."""
        with self._lock:
            return self._held.get(session)

    def held(self) -> dict[str, int]:
        """Each session this instance holds a lease on, with its epoch (a copy)."""
        with self._lock:
            return dict(self._held)

    def last_epoch(self, session: str) -> int:
        """The newest epoch this instance held ``session`` under (0: never)."""
        with self._lock:
            return self._last.get(session, 0)

    def holder(self, session: str) -> str:
        return f"{self.instance}:{self.epoch(session)}"

    def may_try(self) -> bool:
        """Whether to ask the store now: up, or down for at least a lease since it last failed (a
        host that drops packets costs each call its timeout; the renewals keep trying meanwhile)."""
        return self.up or self.clock() >= self._retry_at

    def trouble(self, err: BaseException) -> None:
        """The store could not be reached (or answered an error): the status says so."""
        if self.up:
            log.warning("the shared store %s is unreachable: %s", self.url, err)
        self.up, self.last_error = False, f"{type(err).__name__}: {str(err)[:200]}"
        self._retry_at = self.clock() + self.lease_ms / 1000

    def fine(self) -> None:
        if not self.up:
            log.warning("the shared store %s answers again", self.url)
        self.up = True

    def count(self, name: str, labels: dict[str, str] | None = None) -> None:
        if self.telemetry is not None:
            self.telemetry.count(name, 1, labels)

    def refused(self, stale: bool) -> None:
        """A park refused: by the store's fencing (``stale``), or on reading it."""
        with self._lock:
            if stale:
                self.stale_parks_refused += 1
            else:
                self.parks_refused += 1

    # ---- renewing ----------------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="shadow-leases", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_ms / 3000):
            self.renew()

    def renew(self) -> list[str]:
        """Renew every lease held; returns the sessions found lost (their listeners already told)."""
        with self._lock:
            held = dict(self._held)
        lost: list[str] = []
        for session, epoch in held.items():
            try:
                ok = self._renew(keys=[self.keys.lease(session), self.keys.epoch(session)],
                                 args=[f"{self.instance}:{epoch}", epoch, self.lease_ms, self.epoch_ttl_ms])
            except Exception as e:
                self.trouble(e)
                self._overdue()
                return lost
            self.fine()
            with self._lock:
                if self._held.get(session) != epoch:  # released meanwhile
                    continue
                if int(ok):
                    self._until[session] = self.clock() + self.lease_ms / 1000
                    self._unshared.discard(session)
                    continue
                del self._held[session]
                self._until.pop(session, None)
                self.lost += 1
            lost.append(session)
        for session in lost:
            log.warning("lost the lease on session %r: another instance holds it now", session)
            self.count("leases_lost")
            for on_lost in self._listeners:
                on_lost(session)
        return lost

    def _overdue(self) -> None:
        """Leases not renewed within their TTL while the store is unreachable: the sessions are
        followed here unshared (no park of theirs goes to the store) until a renewal reaches it."""
        now = self.clock()
        with self._lock:
            for session, until in list(self._until.items()):
                if until < now:
                    self._unshared.add(session)
