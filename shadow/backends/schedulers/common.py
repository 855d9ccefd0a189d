"""What both schedulers need: a session's backlog from the facade's public status, one chunk read
with its wall-clock span, and the device sync the ration does first."""

from __future__ import annotations

import sys
from collections.abc import Callable

from shadow.core.scheduling import epoch_ns
from shadow.core.shadow import ChunkRead, Shadow


def backlogs(shadow: Shadow) -> dict[str, int]:
    """Ids not yet committed, per session (resident or parked), from ``status()``."""
    return {name: int(s.get("backlog", 0)) for name, s in shadow.status()["sessions"].items()}


def backlog_after(shadow: Shadow, chunk: ChunkRead) -> int:
    """The chunk's session's backlog once the chunk is read (the session is resident: it was just read)."""
    return shadow.book(chunk.session).pending


def read_one(shadow: Shadow, session: str | None) -> tuple[ChunkRead | None, int, int]:
    """One whole chunk of ``session`` (or of the longest backlog), with its span's start and end."""
    start = epoch_ns()
    got = shadow.read(session, max_chunks=1)
    end = epoch_ns()
    return (got[0] if got else None), start, end


def device_sync(device: str) -> Callable[[], None]:
    """Waits for the device's queued work, so nothing of the small model runs beside the host's.

    Touches torch only if it is loaded already (the shadow is on) and only on CUDA."""

    def sync() -> None:
        torch = sys.modules.get("torch")
        if torch is None or not device.startswith(("cuda", "auto")):
            return
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize(None if device == "auto" else device)

    return sync
