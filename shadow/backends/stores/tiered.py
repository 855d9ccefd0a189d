"""The local disk in front of a shared Redis: a ``StateStore`` for a fleet (STORE set).

A park writes the local file (DiskStore, as without a store), then sends the same bytes to Redis
under the session's lease epoch (redis_parks.py); a park the store refuses as stale (a newer holder)
raises ``LeaseLost`` and its local file goes too. A store that cannot be reached leaves the park on
the local disk only (counted, the status says so). A session held with no lease (unshared: taken while the
store was down) parks locally only.

A restore takes the local file when it is the store's current park, or when no other instance
parked the session since this one last held it (the store's park is this instance's own, of an
epoch it held: a store restarted empty hands out epochs again, so the epoch alone does not say),
or when the store holds nothing or cannot be reached; otherwise it assembles the store's parts
into a temporary file in the disk's folder, renames it in and loads it through DiskStore's own
checks, so that whatever guards a local file (identity, checksum, bounds, the session's name)
guards what came from Redis as well. A park refused on reading is counted by reason,
deleted from the store (under the lease: the reader holds the session), and the session read again.
"""

from __future__ import annotations

import logging
from typing import Any

from shadow.core.errors import LeaseLost
from shadow.core.protocols import Stored, Telemetry
from shadow.core.session import SessionBook

from .disk import DiskStore
from .redis_leases import RedisLeases
from .redis_parks import Manifest, PartRefused, RedisParks

log = logging.getLogger(__name__)


class TieredStore:
    def __init__(self, disk: DiskStore, parks: RedisParks, leases: RedisLeases,
                 telemetry: Telemetry | None = None) -> None:
        self.disk = disk
        self.parks = parks
        self.leases = leases
        self.telemetry = telemetry
        # what a person looking at a refusal reads (DiskStore's are in disk.refused)
        self.refused: list[tuple[str, str]] = []

    def _count(self, name: str, labels: dict[str, str] | None = None) -> None:
        if self.telemetry is not None:
            self.telemetry.count(name, 1, labels)

    # ---- StateStore --------------------------------------------------------------------------

    def put(self, name: str, book: SessionBook, tensors: Any) -> int:
        size = self.disk.put(name, book, tensors)  # StoreError when the local disk fails: nothing shared either
        epoch = self.leases.epoch(name)
        park = self.disk.park_of(name)
        if epoch is None or park is None:  # unshared: followed here only
            return size
        if not self.leases.may_try():  # down a moment ago: local only, without a timeout's wait
            self._count("store_park_failures")
            return size
        path, checksum = park
        try:
            self.parks.put(name, path, checksum, self.disk.identity, epoch, f"{self.leases.instance}:{epoch}",
                           self.leases.lease_ms)
        except LeaseLost:
            self.leases.refused(stale=True)
            self._count("stale_parks_refused")
            self.disk.remove(name)  # stale: never restored from here
            raise
        except Exception as e:  # the store is down: the park stays local (a later park or restore tries again)
            self.leases.trouble(e)
            self._count("store_park_failures")
            return size
        self.leases.fine()
        self._count("store_parks")
        return size

    def peek(self, name: str) -> tuple[SessionBook, Any] | None:
        local = self.disk.park_of(name)
        if not self.leases.may_try():
            return self.disk.peek(name) if local is not None else None
        try:
            m = self.parks.manifest(name)
        except PartRefused as e:
            self._refuse(name, e)
            m = None
        except Exception as e:  # down: the local park, if any (followed unshared)
            self.leases.trouble(e)
            return self.disk.peek(name) if local is not None else None
        if local is not None and (m is None or m.checksum == local[1] or self._ours(m, name)):
            got = self.disk.peek(name)
            if got is not None or m is None:
                return got
        return self._from_store(name, m) if m is not None else None

    def take(self, name: str) -> tuple[SessionBook, Any] | None:
        got = self.peek(name)
        self.disk.remove(name)  # the local file only: the store's park stays what a crash falls back to
        return got

    def remove(self, name: str) -> None:
        self.disk.remove(name)
        if not self.leases.may_try():  # its park in the store expires with the TTL
            return
        try:
            self.parks.remove(name, self.leases.instance)
        except Exception as e:
            self.leases.trouble(e)

    def names(self) -> list[str]:
        return self.disk.names()

    def info(self, name: str) -> Stored | None:
        return self.disk.info(name)

    def close(self) -> None:
        self.disk.close()

    def _ours(self, m: Manifest, name: str) -> bool:
        """The store's park is this instance's own, made under an epoch it held: nobody parked the
        session since, so the local file (the last park made here, sent or not) is at least as new."""
        instance = m.holder.rpartition(":")[0]
        return instance == self.leases.instance and m.epoch <= self.leases.last_epoch(name)

    # ---- from the store ----------------------------------------------------------------------

    def _from_store(self, name: str, m: Manifest) -> tuple[SessionBook, Any] | None:
        if m.identity != self.disk.identity:
            why = f"parked under {m.identity}, this reader has {self.disk.identity}"
            self._refuse(name, PartRefused("identity", why))
            return None
        tmp = self.disk.incoming(name)
        try:
            self.parks.fetch(m, tmp)
        except PartRefused as e:
            self._refuse(name, e)
            return None
        except Exception as e:  # down while reading: read again (a local park, if any, is older than the store's)
            self.leases.trouble(e)
            return None
        if not self.disk.adopt(name, tmp, m.checksum):
            self._refuse(name, PartRefused("file", "the assembled file was refused on opening"))
            return None
        got = self.disk.peek(name)
        if got is None:
            self._refuse(name, PartRefused("file", "the assembled file was refused on loading"))
            return None
        self._count("store_restores")
        return got

    def _refuse(self, name: str, err: PartRefused) -> None:
        log.warning("session %r: the store's park is refused (%s): %s; the session is read again", name,
                    err.reason, err)
        self.refused.append((name, f"{err.reason}: {err}"))
        del self.refused[:-64]
        self.leases.refused(stale=False)
        self._count("store_parks_refused", {"reason": err.reason})
        try:
            self.parks.remove(name, self.leases.instance)
        except Exception as e:
            self.leases.trouble(e)
