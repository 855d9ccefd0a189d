"""Which session a chat request belongs to, when the client does not say.

The rule (also in the README): the ``X-Session-Id`` header names the session when the client sends
it. Otherwise the request joins the known session whose ids (its last prompt and the output fed
after it) share the longest prefix with the new prompt, provided that prefix holds at least one
chunk (the grid) and the session's whole first prompt (system, tools, first user message) up to
its generation prompt, the final ``<|im_start|>assistant`` (BPE may merge the ``<think>`` it opens
with what the reply put after it, so the ids after it can change in the next prompt). A new
conversation that only shares a system prompt and tool list with another therefore starts its own
session; two conversations whose first prompts are identical are one session until they part (the
usual rollback then follows whichever spoke last). Otherwise a new session ``proxy-N`` starts.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from shadow.adapters.tokens import IM_START

SESSION_HEADER = "x-session-id"


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _before_generation(prompt: Sequence[int]) -> int:
    """How many ids come before the prompt's last ``<|im_start|>`` (its generation prompt)."""
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == IM_START:
            return i
    return len(prompt)


@dataclass
class _Known:
    first_prompt: int
    ids: list[int] = field(default_factory=list)


class Sessions:
    def __init__(self, grid: int) -> None:
        self.grid = grid
        self._known: dict[str, _Known] = {}
        self._mu = threading.Lock()
        self._n = 0

    def pick(self, prompt: Sequence[int], header: str | None) -> str:
        """The session for ``prompt`` (the rule in the module docstring); records the prompt."""
        with self._mu:
            name = header or self._by_prefix(prompt)
            if name is None:
                self._n += 1
                name = f"proxy-{self._n}"
                while name in self._known:
                    self._n += 1
                    name = f"proxy-{self._n}"
            known = self._known.setdefault(name, _Known(_before_generation(prompt)))
            known.ids = list(prompt)
            return name

    def _by_prefix(self, prompt: Sequence[int]) -> str | None:
        best, best_n = None, 0
        for name, known in self._known.items():
            n = shared_prefix(known.ids, prompt)
            if n >= max(self.grid, known.first_prompt) and n > best_n:
                best, best_n = name, n
        return best

    def extend(self, name: str, ids: Sequence[int]) -> None:
        """Output ids fed to ``name``: the next prompt of the conversation starts with them."""
        with self._mu:
            self._known[name].ids.extend(ids)

    def ids(self, name: str) -> list[int]:
        with self._mu:
            return list(self._known[name].ids)

    def names(self) -> list[str]:
        with self._mu:
            return list(self._known)
