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
from dataclasses import dataclass
from typing import Literal, Protocol

StoreState = Literal["off", "up", "down"]


@dataclass(frozen=True, slots=True)
class Sharing:
    """What the status and ``/ready`` say of the shared store."""

    store: StoreState  # off: no STORE; up: reachable at the last look; down: not
    instance: str  # this instance's name in leases
    url: str  # the store's URL, the password masked
    held: int  # sessions this instance holds a lease on
    unshared: int  # resident sessions followed without a lease (taken while the store was down)
    lost: int  # sessions dropped because another instance took their lease
    stale_parks_refused: int  # parks the store refused because a newer holder had the session
    parks_refused: int  # parks in the store refused on reading (a part missing or wrong, another identity)
    last_error: str  # the last error talking to the store ("" when none)


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
