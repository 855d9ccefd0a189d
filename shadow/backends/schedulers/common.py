"""What both schedulers need: a session's backlog and depth, a chunk's estimate, a chunk's backlog after."""

from __future__ import annotations

from shadow.core.errors import UnknownSession
from shadow.core.records import ChunkRead
from shadow.core.shadow import Shadow


def backlog_of(shadow: Shadow, session: str, settled: bool = False) -> int:
    """One session's backlog (0 for a session no longer known; ``settled``: ``Shadow.backlog``'s),
    without a pass over all of them: the ration asks on every decode round."""
    try:
        return shadow.backlog(session, settled)
    except UnknownSession:
        return 0


def depth_of(shadow: Shadow, session: str) -> int:
    """Rows of ``session`` read so far (0 for a session not known yet)."""
    try:
        return shadow.counts(session)[1]
    except UnknownSession:
        return 0


def chunk_estimate(shadow: Shadow, session: str) -> float | None:
    """The next chunk of ``session`` read alone, from the facade's one table of costs."""
    return shadow.costs.estimate([depth_of(shadow, session)])


def backlog_after(shadow: Shadow, chunk: ChunkRead) -> int:
    """The chunk's session's backlog once the chunk is read; 0 when it was forgotten since (a
    forget may come between the read and this look: not an error)."""
    try:
        return shadow.position(chunk.session).pending
    except UnknownSession:
        return 0
