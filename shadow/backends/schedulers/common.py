"""What both schedulers need: a session's backlog, and one chunk read with its wall-clock span."""

from __future__ import annotations

from shadow.core.errors import UnknownSession
from shadow.core.scheduling import epoch_ns
from shadow.core.shadow import ChunkRead, Shadow


def backlog_of(shadow: Shadow, session: str) -> int:
    """One session's backlog (0 for a session no longer known), without a pass over all of them:
    the ration asks on every decode round."""
    try:
        return shadow.backlog(session)
    except UnknownSession:
        return 0


def backlog_after(shadow: Shadow, chunk: ChunkRead) -> int:
    """The chunk's session's backlog once the chunk is read; 0 when it was forgotten since (a
    forget may come between the read and this look: not an error)."""
    try:
        return shadow.position(chunk.session).pending
    except UnknownSession:
        return 0


def read_one(shadow: Shadow, session: str | None) -> tuple[ChunkRead | None, int, int]:
    """One whole chunk of ``session`` (or of the longest backlog), with its span's start and end."""
    start = epoch_ns()
    got = shadow.read(session, max_chunks=1)
    end = epoch_ns()
    return (got[0] if got else None), start, end
