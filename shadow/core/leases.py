"""One holder per session across a fleet: the seam between the residency and a shared store's leases.

An instance holds a session's lease while the session is resident there (fed, restored, asked). A
take that finds another live holder raises ``HeldElsewhere``; a take while the store is unreachable
holds the session locally only ("unshared": followed here, parked to the local disk only). A lease
found lost (it ran out and another instance took it) is reported to every ``on_lost`` listener,
which drop the local copy without parking it. The Redis implementation is
``shadow.backends.stores.redis_leases``; the rules are docs/scale-out.md's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .records import Sharing


class Leases(Protocol):
    def take(self, session: str) -> bool:
        """Hold ``session``: True when its lease is held in the store, False when the store cannot be
        reached (the session is followed here, unshared). Raises ``HeldElsewhere`` naming the holder."""
        ...

    def release(self, session: str) -> None:
        """Let go of ``session``'s lease (parked, forgotten, dropped); a no-op when not held."""
        ...

    def watch(self, on_lost: Callable[[str], None]) -> None:
        """Call ``on_lost(session)`` (from the renewing thread, holding no lock of the leases') for each
        session whose lease is found taken by another instance."""
        ...

    def sharing(self) -> Sharing: ...

    def close(self) -> None:
        """Stop renewing and let go of every lease still held."""
        ...
