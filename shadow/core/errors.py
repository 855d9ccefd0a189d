"""The errors shadow raises. Each names what was wrong, so a caller can fix its input."""

from __future__ import annotations


class ShadowError(Exception):
    """Base of every error shadow raises on purpose."""


class CheckpointError(ShadowError):
    """A checkpoint folder that is not a usable Qwen3.5 text model (config or weights)."""


class BadInput(ShadowError, ValueError):
    """A request shadow refuses before touching any state (ids, choices, prompts)."""


class UnknownSession(ShadowError, KeyError):
    """A session id that shadow has never been fed."""

    def __str__(self) -> str:  # KeyError quotes its argument; a message reads better plain
        return str(self.args[0]) if self.args else "unknown session"


class StoreError(ShadowError):
    """A state store could not write a session (disk full, permission): nothing was half-written."""


class TooMany(ShadowError):
    """A client asked for more of a bounded thing (holds) than the service keeps at once."""


class HeldElsewhere(ShadowError):
    """Another live instance holds the session's lease in the shared store (STORE): it follows the
    session, and this one must not make a second copy. The API answers 409; the router's affinity
    (or the holder's lease running out) sends the request where it belongs."""

    def __init__(self, session: str, holder: str) -> None:
        super().__init__(f"session {session!r} is held by instance {holder!r} (its lease in the shared store); "
                         "send the request there, or again once that lease runs out")
        self.session = session
        self.holder = holder


class LeaseLost(StoreError):
    """This instance's lease on a session ran out and another instance took it (a pause past the
    lease, a split): its copy is stale and is dropped here, never parked over the newer one."""
