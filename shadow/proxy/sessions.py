"""Which session a chat request belongs to, when the client does not say, found in O(prompt).

The rule (also in the README): the ``X-Session-Id`` header names the session when the client sends
it. Otherwise, in this order:

1. **A continuation.** The request joins the known session whose last prompt it contains, up to
   that prompt's generation prompt (the final ``<|im_start|>assistant``: the reply after it is
   rendered again in the next prompt, where a template may drop its thinking), whatever its
   length. A short chat's turns are therefore one session. Of several, the one with the longest
   such prompt, then the most recently used.
2. **A rollback.** Else it joins the most recently used session that shares at least one chunk
   (the grid) with it, and whose whole first prompt (system, tools, first user message) it shares
   too: a conversation whose history was cut or edited. A new conversation that only shares a
   system prompt and tool list with another starts its own session.
3. Else a new session ``proxy-N`` starts.

How it is found without scanning every session, as engines index prefix blocks: each session is
indexed by the hash chain of its grid-aligned prefixes (block ``j``'s hash covers the first
``(j+1) * grid`` ids), and by the chain at the block where its last prompt's generation prompt falls
(rule 1's key). A prompt's chain is hashed once (O(prompt)); rule 1 looks up the prompt's chain at
each block and checks the few candidates' last partial block id for id; rule 2 looks up the
deepest block the prompt shares with any session. The table is bounded (``QWEN38_SHADOW_PROXY_MAX_SESSIONS``),
least recently used first out; ``forget`` drops a session (the proxy calls it on ``DELETE``).

Nothing here changes until ``record``: a request the engine refuses leaves the table as it was.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from shadow.adapters.tokens import IM_START
from shadow.core.session import first_difference, int32_ids, int32_or_none

SESSION_HEADER = "x-session-id"
ROOT = b"shadow-proxy-root"
ROLLBACK_CANDIDATES = 4  # sessions of the deepest shared block whose first prompt is checked


def chain(ids: Sequence[int], grid: int, start: bytes = ROOT, skip: int = 0) -> list[bytes]:
    """The hash of each whole grid block of ``ids`` chained to all before it (block ``skip`` on,
    ``start`` being the chain before it)."""
    part = ids[skip * grid: len(ids) // grid * grid]
    # a known session's int32 ids hash as their uint32 array would, without an int object per id
    # (the proxy takes no negative id)
    raw = memoryview(part if isinstance(part, array) and part.typecode == "i" else array("I", part)).cast("B")
    step = 4 * grid
    out, h = [], start
    for at in range(0, len(raw), step):
        d = hashlib.blake2b(h, digest_size=16)
        d.update(raw[at: at + step])
        h = d.digest()
        out.append(h)
    return out


def before_generation(prompt: Sequence[int]) -> int:
    """How many ids come before the prompt's last ``<|im_start|>`` (its generation prompt)."""
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == IM_START:
            return i
    return len(prompt)


@dataclass
class _Known:
    first_prompt: int  # ids before the first prompt's generation prompt
    last_prompt: int  # ids before the last prompt's generation prompt
    ids: array[int] = field(default_factory=lambda: array("i"))  # int32: held as long as the session is known
    blocks: list[bytes] = field(default_factory=list)  # chain of ids' whole blocks
    used: int = 0  # when last recorded or extended, on the table's own counter

    def key(self, grid: int) -> bytes:
        j = self.last_prompt // grid
        return self.blocks[j - 1] if j else ROOT


@dataclass(frozen=True)
class Found:
    """Where a prompt goes: ``name`` None for a new session; ``how`` says which rule."""

    name: str | None
    how: str  # "header", "continued", "rolled back", "new"
    blocks: list[bytes]


class Sessions:
    def __init__(self, grid: int, limit: int = 1024) -> None:
        self.grid = grid
        self.limit = limit
        self.evicted = 0
        self._known: OrderedDict[str, _Known] = OrderedDict()  # least recently used first
        self._by_block: dict[bytes, dict[str, None]] = {}
        self._by_key: dict[bytes, dict[str, None]] = {}
        self._mu = threading.Lock()
        self._n = itertools.count(1)
        self._clock = itertools.count(1)

    # ---- finding (nothing changes) ---------------------------------------------------------------

    def find(self, prompt: Sequence[int], header: str | None) -> Found:
        blocks = chain(prompt, self.grid)
        if header is not None:
            return Found(header, "header", blocks)
        ids = int32_or_none(prompt)  # compared with the sessions' ids, array to array
        if ids is None:  # past int32: no session holds such ids (``record`` takes int32 only)
            return Found(None, "new", blocks)
        with self._mu:
            name = self._continued(ids, blocks)
            if name is not None:
                return Found(name, "continued", blocks)
            name = self._rolled_back(ids, blocks)
        return Found(name, "rolled back" if name is not None else "new", blocks)

    def _continued(self, prompt: array[int], blocks: list[bytes]) -> str | None:
        g = self.grid
        for j in range(len(blocks), -1, -1):
            names = self._by_key.get(blocks[j - 1] if j else ROOT)
            if not names:
                continue
            best, best_m = None, -1
            for name in names:
                k = self._known[name]
                m = k.last_prompt
                newer = m > best_m or best is None or k.used > self._known[best].used
                if m <= len(prompt) and m >= best_m and newer and prompt[j * g: m] == k.ids[j * g: m]:
                    best, best_m = name, m
            if best is not None:
                return best
        return None

    def _rolled_back(self, ids: array[int], blocks: list[bytes]) -> str | None:
        for j in range(len(blocks), 0, -1):
            names = self._by_block.get(blocks[j - 1])
            if not names:
                continue
            # a session's blocks are indexed anew each time a turn of it is recorded: the last
            # names of a block are its most recently recorded sessions
            for name in itertools.islice(reversed(names), ROLLBACK_CANDIDATES):
                k = self._known[name]
                n = first_difference(k.ids, ids)
                if n >= max(self.grid, k.first_prompt):
                    return name
            return None
        return None

    # ---- recording (the engine accepted the request) -------------------------------------------

    def new_name(self) -> str:
        """A name no known session has (``proxy-N``)."""
        with self._mu:
            name = f"proxy-{next(self._n)}"
            while name in self._known:
                name = f"proxy-{next(self._n)}"
            return name

    def record(self, name: str, found: Found, prompt: Sequence[int]) -> str:
        """The turn started: session ``name`` now holds ``prompt`` (``found``: its blocks)."""
        ids = int32_ids(prompt)  # ValueError before anything changes
        with self._mu:
            old = self._known.pop(name, None)
            if old is not None:
                self._unindex(name, old)
            known = _Known(old.first_prompt if old is not None else before_generation(prompt),
                           before_generation(prompt), ids, list(found.blocks), next(self._clock))
            self._known[name] = known
            self._index(name, known, 0)
            self._by_key.setdefault(known.key(self.grid), {})[name] = None
            while len(self._known) > self.limit:
                gone, k = self._known.popitem(last=False)
                self._unindex(gone, k)
                self.evicted += 1
            return name

    def extend(self, name: str, ids: Sequence[int]) -> None:
        """Output ids fed to ``name``: the next prompt of the conversation starts with them."""
        more = int32_ids(ids)  # ValueError before anything changes
        with self._mu:
            known = self._known.get(name)
            if known is None:  # evicted or forgotten meanwhile
                return
            self._known.move_to_end(name)
            known.used = next(self._clock)
            had = len(known.blocks)
            known.ids.extend(more)
            start = known.blocks[-1] if known.blocks else ROOT
            known.blocks.extend(chain(known.ids, self.grid, start, skip=had))
            self._index(name, known, had)

    def forget(self, name: str) -> bool:
        with self._mu:
            known = self._known.pop(name, None)
            if known is not None:
                self._unindex(name, known)
            return known is not None

    def _index(self, name: str, known: _Known, start: int) -> None:
        for h in known.blocks[start:]:
            self._by_block.setdefault(h, {})[name] = None

    def _unindex(self, name: str, known: _Known) -> None:
        for table, keys in ((self._by_block, known.blocks), (self._by_key, [known.key(self.grid)])):
            for h in keys:
                names = table.get(h)
                if names is not None:
                    names.pop(name, None)
                    if not names:
                        del table[h]

    # ---- reading ---------------------------------------------------------------------------------

    def ids(self, name: str) -> list[int]:
        with self._mu:
            return list(self._known[name].ids)

    def knows(self, name: str) -> bool:
        with self._mu:
            return name in self._known

    def names(self) -> list[str]:
        with self._mu:
            return list(self._known)

    def status(self) -> dict[str, int]:
        with self._mu:
            return {"known": len(self._known), "limit": self.limit, "evicted": self.evicted}
