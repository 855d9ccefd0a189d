"""A followed request's quiet decode rounds: the ids a round reported, kept until the next look.

A host reports every decode round, every 5-6 ms on a 9B model. A full look at a round (feed the
ids, the narrator's slice, the ration's step, the counts) costs about 65 us of Python on the H200's
host when the host has just waited on the device (cold caches; 8 us back to back), which is 1.3 % of
the decode for a host that waits on its calls. Most rounds would change nothing but the session's
length: the ration reads nothing until its budget fits the next chunk and a whole chunk is held,
and the narrator waits for a ``</think>``. Such a round only checks its ids, as a feed would, and
keeps them here; the next look feeds them first.

Invariants:

- A round is quiet only when a look would have read nothing (the ration's ``may_read`` with the
  backlog counted here, and ``Narrator.wants``): chunks are read at the rounds they were before.
- Ids reach the session in the order the host gave them: a request's lock is held from taking its
  kept ids to their feed.
- Any other call on the session (a feed, ``forget``, a question, ``status``, ``finished``) feeds the
  kept ids first, through ``settle``: nothing reads a session short of ids the host reported.
- The counts kept are bounds the look refreshes: ``held`` is exact (only feeds add ids, and any
  other feed settles first); ``backlog`` can only be too high (a question may read in between), which
  makes a round look, never stay quiet wrongly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shadow.core.host import FeedResult, TurnTimeline


@dataclass(eq=False)
class OpenRound:
    """One running request's session as its last look left it, and the ids reported since."""

    turn: TurnTimeline
    session: str
    held: int  # ids the session held after the look
    backlog: int  # of those, not yet read
    pending: list[int] = field(default_factory=list)
    closed: bool = False  # taken by a look or a settle: a round may no longer add to it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def within(self, more: int, most: int) -> bool:
        """The session stays within ``most`` ids with ``more`` (a round past it looks, and the
        look's feed says why)."""
        return self.held + len(self.pending) + more <= most


class OpenRounds:
    """The open rounds of the followed requests that run, by request id. ``feed`` is the service's
    own feed of output ids (without a settle: it is called under a request's lock)."""

    def __init__(self, feed: Callable[[str, list[int]], FeedResult]) -> None:
        self._feed = feed
        self._open: dict[str, OpenRound] = {}
        self._mu = threading.Lock()  # the dict's changes; a round's lookup needs none

    def get(self, request_id: str) -> OpenRound | None:
        return self._open.get(request_id)

    def keep(self, turn: TurnTimeline, session: str, held: int, backlog: int) -> None:
        """After a look: the request's next rounds may be quiet."""
        with self._mu:
            self._open[turn.request_id] = OpenRound(turn, session, held, backlog)

    @staticmethod
    def add(round_: OpenRound, ids: Sequence[int]) -> bool:
        """A quiet round's ids kept; False when a look or a settle took the round meanwhile (then
        the round must look itself)."""
        with round_.lock:
            if round_.closed:
                return False
            round_.pending.extend(ids)
            return True

    def take(self, request_id: str, session: str, ids: Sequence[int],
             follows: bool) -> tuple[list[int], FeedResult | None]:
        """A look: the request's kept ids, then ``ids``, fed in order under the request's lock
        (dropped when the session is no longer followed). The request has no open round after it."""
        round_ = self._open.get(request_id)
        if round_ is None:
            return self._feed_after([], session, list(ids), follows)
        with round_.lock:  # a settle under way finishes first: its ids go before these
            kept = [] if round_.closed else round_.pending
            self._close(round_)
            return self._feed_after(kept, session, list(ids), follows)

    def settle(self, session: str | None = None) -> None:
        """Feed the ids kept for ``session`` (every session: ``None``) and close its open rounds:
        their next round looks, and counts afresh."""
        with self._mu:
            rounds = [r for r in self._open.values() if session is None or r.session == session]
        for round_ in rounds:
            with round_.lock:
                if round_.closed:
                    continue
                kept = round_.pending
                self._close(round_)
                if kept:
                    self._feed(round_.session, kept)

    def _close(self, round_: OpenRound) -> None:
        """Under the round's lock: no round adds to it any more, and it leaves the open ones (a
        round's own look may have kept a newer one under its id)."""
        round_.closed = True
        round_.pending = []
        with self._mu:
            if self._open.get(round_.turn.request_id) is round_:
                del self._open[round_.turn.request_id]

    def _feed_after(self, kept: list[int], session: str, ids: list[int],
                    follows: bool) -> tuple[list[int], FeedResult | None]:
        """``kept`` then ``ids``, each in a feed of its own (a refusal of ``ids`` costs nothing kept);
        the last feed's result."""
        fed = None
        if follows:
            for part in (kept, ids):
                if part:
                    fed = self._feed(session, part)
        return kept + ids, fed
