"""Which session a chat request belongs to, when the client does not say, found in O(prompt).

The rule (docs/proxy.md): the ``X-Session-Id`` header names the session when the client sends it.
Otherwise, among the sessions found without a header *for the same client* (its ``Authorization``,
as a digest: another engine key never joins them), in this order:

1. **A continuation.** The request joins the known session whose last prompt it contains, up to
   that prompt's generation prompt (the final ``<|im_start|>assistant``: the reply after it is
   rendered again in the next prompt, where a template may drop its thinking), whatever its
   length. A short chat's turns are therefore one session. Of several, the one with the longest
   such prompt, then the most recently used.
2. **A branch.** Else, when it shares at least one chunk (the grid) and the whole first prompt
   (system, tools, first user message) with a known session, it is that conversation parted
   before the session's latest prompt: parallel rollouts of one task, or a history cut or edited.
   It starts a session of its own (``branched``) rather than rolling the other one back, so two
   conversations that part never take turns on one state.
3. Else a new session starts.

A new session's name is derived from its first prompt and its client (``proxy-`` and a digest),
with ``-2``, ``-3``... where conversations with the same first prompt part: so it never collides
with a name another conversation left parked before a restart, and a restarted proxy reading its
index again (``index.py``) gives each conversation the name it had.

How it is found without scanning every session, as engines index prefix blocks: each session is
indexed by the hash chain of its grid-aligned prefixes (block ``j``'s hash covers the first
``(j+1) * grid`` ids), and by the chain at the block where its last prompt's generation prompt falls
(rule 1's key). A prompt's chain is hashed once (O(prompt)); rule 1 looks up the prompt's chain at
each block and checks the few candidates' last partial block id for id; rule 2 counts the holders
of each of the prompt's blocks and checks the most recent few of the deepest held one. The index is bounded
(``QWEN38_SHADOW_PROXY_MAX_SESSIONS``), least recently used first out; ``forget`` drops a session
(the proxy calls it on ``DELETE``).

Nothing here changes until ``record``: a request the engine refuses leaves the index as it was.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from shadow.adapters.tokens import IM_START
from shadow.core.session import first_difference, int32_ids, int32_or_none

from .index import ROOT, LocalIndex, Meta, SessionIndex, chain

SESSION_HEADER = "x-session-id"
BRANCH_CANDIDATES = 4  # sessions of the deepest shared block whose first prompt is checked
MAX_SUFFIX = 10_000

__all__ = ["SESSION_HEADER", "Found", "Sessions", "before_generation", "client_of"]


def before_generation(prompt: Sequence[int]) -> int:
    """How many ids come before the prompt's last ``<|im_start|>`` (its generation prompt)."""
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == IM_START:
            return i
    return len(prompt)


def client_of(authorization: bytes | None) -> str:
    """A client's digest: of its ``Authorization`` (the engine key), "" without one."""
    if not authorization:
        return ""
    return hashlib.blake2b(authorization, digest_size=8, person=b"shadow-client").hexdigest()


@dataclass(frozen=True)
class Found:
    """Where a prompt goes: ``name`` None for a new session; ``how`` says which rule."""

    name: str | None
    how: str  # "header", "continued", "branched", "new" (the proxy adds "retried")
    blocks: list[bytes]
    parent: str | None = None  # a branch: the session it parted from


class Sessions:
    """The rules over an index (``index.SessionIndex``), which holds the sessions."""

    def __init__(self, grid: int, limit: int = 1024, index: SessionIndex | None = None) -> None:
        self.grid = grid
        self.index: SessionIndex = index if index is not None else LocalIndex(grid, limit)
        self.limit = self.index.limit

    # ---- finding (nothing changes) ---------------------------------------------------------------

    def find(self, prompt: Sequence[int], header: str | None, client: str = "") -> Found:
        blocks = chain(prompt, self.grid)
        if header is not None:
            return Found(header, "header", blocks)
        ids = int32_or_none(prompt)  # compared with the sessions' ids, array to array
        if ids is None:  # past int32: no session holds such ids (``record`` takes int32 only)
            return Found(None, "new", blocks)
        name = self._continued(ids, blocks, client)
        if name is not None:
            return Found(name, "continued", blocks)
        parent = self._parted(ids, blocks, client)
        return Found(None, "branched" if parent is not None else "new", blocks, parent)

    def _ours(self, names: list[str], client: str) -> list[tuple[str, Meta]]:
        """Those of ``names`` this client's requests may join: found without a header, by it."""
        return [(n, m) for n, m in zip(names, self.index.metas(names), strict=True)
                if m is not None and not m.named and m.owner == client]

    def _continued(self, prompt: array[int], blocks: list[bytes], client: str) -> str | None:
        g = self.grid
        keyed = self.index.keyed([ROOT, *blocks])
        for j in range(len(blocks), -1, -1):
            best, best_m, best_used = None, -1, -1
            ours = self._ours(keyed[j], client) if keyed[j] else []
            fit = [(n, k) for n, k in ours if k.last_prompt <= len(prompt)]
            held = self.index.ids_of([n for n, _ in fit], j * g, [k.last_prompt for _, k in fit])
            for (name, k), theirs in zip(fit, held, strict=True):
                m = k.last_prompt
                better = m > best_m or (m == best_m and k.used > best_used)
                if better and prompt[j * g: m] == theirs:
                    best, best_m, best_used = name, m, k.used
            if best is not None:
                return best
        return None

    def _parted(self, ids: array[int], blocks: list[bytes], client: str) -> str | None:
        held = self.index.held(blocks)
        for j in range(len(blocks) - 1, -1, -1):
            # the deepest block held by any session: this client's most recently used few of them
            # are checked, looked up a few at a time (a block may be held by a thousand)
            checked = 0
            for skip in range(0, held[j], BRANCH_CANDIDATES):
                for name, k in self._ours(self.index.holders(blocks[j], BRANCH_CANDIDATES, skip), client):
                    if first_difference(self.index.ids(name), ids) >= max(self.grid, k.first_prompt):
                        return name
                    checked += 1
                    if checked == BRANCH_CANDIDATES:
                        return None
            if checked:
                return None
        return None

    # ---- recording (the engine accepted the request) -------------------------------------------

    def new_name(self, prompt: Sequence[int], client: str = "", parent: str | None = None) -> str:
        """A name no known session has: ``proxy-`` and a digest of the first prompt (up to its
        generation prompt; a branch's: the one it shares with ``parent``) and the client, then
        ``-2``, ``-3``... where that one is taken."""
        meta = self.index.meta(parent) if parent is not None else None
        head = int32_ids(prompt[:meta.first_prompt if meta is not None else before_generation(prompt)])
        d = hashlib.blake2b(head.tobytes(), digest_size=10, person=b"shadow-proxy")
        d.update(client.encode())
        base = "proxy-" + d.hexdigest()
        for n in range(1, MAX_SUFFIX):
            name = base if n == 1 else f"{base}-{n}"
            if self.index.meta(name) is None:
                return name
        raise ValueError(f"{MAX_SUFFIX} conversations with one first prompt: no name left")

    def record(self, name: str, found: Found, prompt: Sequence[int], client: str = "") -> str:
        """The turn started: session ``name`` now holds ``prompt`` (``found``: its blocks)."""
        ids = int32_ids(prompt)  # ValueError before anything changes
        old = self.index.meta(name)
        first = old.first_prompt if old is not None else before_generation(prompt)
        owner = old.owner if old is not None else client
        meta = Meta(first, before_generation(prompt), owner, found.how == "header" or (old is not None and old.named))
        self.index.put(name, meta, ids, list(found.blocks))
        return name

    def extend(self, name: str, ids: Sequence[int]) -> None:
        """Output ids fed to ``name``: the next prompt of the conversation starts with them."""
        more = int32_ids(ids)  # ValueError before anything changes
        meta = self.index.meta(name)
        if meta is None:  # evicted or forgotten meanwhile
            return
        g = self.grid
        whole = meta.n // g * g
        tail = self.index.ids(name, whole) + more
        self.index.append(name, more, chain(tail, g, meta.last_block))

    def settle(self, name: str) -> None:
        """The session's turn ended: its entry is kept where a restart finds it."""
        self.index.settle(name)

    def forget(self, name: str) -> bool:
        return self.index.drop(name)

    # ---- reading ---------------------------------------------------------------------------------

    def ids(self, name: str) -> list[int]:
        return list(self.index.ids(name))

    def knows(self, name: str) -> bool:
        return self.index.meta(name) is not None

    def owner(self, name: str) -> tuple[bool, str] | None:
        """Whether a header named ``name`` and which client owns it; None when unknown."""
        meta = self.index.meta(name)
        return None if meta is None else (meta.named, meta.owner)

    def names(self) -> list[str]:
        return self.index.names()

    def status(self) -> dict[str, object]:
        return self.index.status()
