"""Qwen's output, as ids, from what an OpenAI-style server streams back.

Where the upstream returns the generated token ids (vLLM's ``return_token_ids``: ``token_ids`` on
each choice), those are fed as they come. Otherwise the assistant message is rebuilt from the deltas
(``reasoning_content`` / ``reasoning``, ``content``, ``tool_calls``) and rendered with the chat
template the way ``shadow.adapters.transcripts.render`` reads an output off it: the reply alone,
after a placeholder user message (a generation always follows the last user or tool message, so
the template renders it the same way), up to and including ``<|im_end|>``.

A partial reply renders with text the model has not generated yet (the template closes ``</think>``
and the message, and trims whitespace that more text would keep). So a round renders the reply with
a marker after the text still growing and keeps only the text before the marker; BPE may still merge
its last tokens with the next delta's text, so the last ``HOLD_BACK`` ids wait, and only ids two
successive rounds agree on are fed. While a tool call's arguments are partial JSON nothing is fed.
The finished reply feeds the rest.
Where a later render parts from what was fed (a rare BPE merge across a delta), nothing more is
fed: the next turn's prompt comparison settles the difference through the usual rollback.

An engine without a reasoning parser (llama.cpp, vLLM without ``--reasoning-parser``) streams
Qwen's thought as plain ``content``, its ``</think>`` included. Until that ``</think>`` comes, the
template would render the text as an answer after an empty ``<think></think>`` that the engine
never generated: so nothing is fed while such a reply is still in its thought, and a reply cut
there by ``max_tokens`` is fed as exactly its text.
"""

from __future__ import annotations

import json
from typing import Any

from shadow.adapters.chat import render
from shadow.adapters.tokens import Tokens, get_tokens
from shadow.core.session import first_difference

IM_END_TEXT = "<|im_end|>"
_PLACEHOLDER_USER = {"role": "user", "content": "."}
MARKER = "\ue000"  # a private-use character: no reply holds it, no BPE merge crosses it
HOLD_BACK = 2


class OutputIds:
    """Accumulates one reply's deltas; ``round()`` and ``final()`` give the ids to feed next."""

    def __init__(self, enable_thinking: bool | None, tokens: Tokens | None = None) -> None:
        self.enable_thinking = enable_thinking
        self.tokens = tokens or get_tokens()
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.upstream_ids: list[int] | None = None
        self.fed: list[int] = []
        self.parted = False
        self._last: list[int] | None = None
        self._growing: str | None = None
        self._head: str | None = None

    # ---- what arrives ----------------------------------------------------------------------------

    def add_choice(self, choice: dict[str, Any], key: str) -> None:
        """One choice of a stream chunk (``key="delta"``) or of a whole response (``"message"``)."""
        ids = choice.get("token_ids")
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            self.upstream_ids = (self.upstream_ids or []) + ids
        part = choice.get(key) or {}
        for k in ("reasoning_content", "reasoning"):
            if isinstance(part.get(k), str):
                self.reasoning.append(part[k])
                self._growing = "reasoning" if part[k] else self._growing
                break
        if isinstance(part.get("content"), str):
            self.content.append(part["content"])
            self._growing = "content" if part["content"] else self._growing
        for j, call in enumerate(part.get("tool_calls") or []):
            idx = call.get("index", j) if isinstance(call, dict) else j
            have = self.calls.setdefault(idx, {"type": "function", "function": {"name": "", "arguments": ""}})
            fn = call.get("function") or {}
            if call.get("id"):
                have["id"] = call["id"]
            self._growing = "tool_calls"
            if isinstance(fn.get("name"), str):
                have["function"]["name"] += fn["name"]
            if isinstance(fn.get("arguments"), str):
                have["function"]["arguments"] += fn["arguments"]
            elif isinstance(fn.get("arguments"), dict):
                have["function"]["arguments"] = json.dumps(fn["arguments"], ensure_ascii=False)

    # ---- what is fed -----------------------------------------------------------------------------

    def _message(self, marker: str = "") -> dict[str, Any]:
        content = "".join(self.content) + (marker if self._growing == "content" else "")
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning and self.enable_thinking is not False:
            msg["reasoning_content"] = "".join(self.reasoning) + (marker if self._growing == "reasoning" else "")
        if self.calls:
            msg["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return msg

    def _generation_prompt(self) -> str:
        if self._head is None:
            self._head = render([_PLACEHOLDER_USER], None, True, self.enable_thinking)
        return self._head

    def _thought_in_content(self) -> bool:
        """The reply so far is thought the engine streams as ``content`` (no reasoning field, the
        generation prompt opens ``<think>`` and no ``</think>`` came yet)."""
        return (not self.reasoning and self.enable_thinking is not False and bool(self.content)
                and self._generation_prompt().endswith("<think>\n") and "</think>" not in "".join(self.content))

    def _render(self, marker: str = "", hold: int = HOLD_BACK) -> list[int] | None:
        try:
            head = self._generation_prompt()
            alone = render([_PLACEHOLDER_USER, self._message(marker)], None, False, self.enable_thinking)
        except Exception:  # a tool call's arguments still partial JSON: wait for more
            return None
        if not alone.startswith(head):
            return None
        tail = alone[len(head):]
        if marker:
            cut = tail.find(marker)
            ids = self.tokens.encode(tail[:cut]) if cut >= 0 else None
            return ids[: len(ids) - hold] if ids is not None else None
        end = tail.rfind(IM_END_TEXT)
        return self.tokens.encode(tail[: end + len(IM_END_TEXT)] if end >= 0 else tail)

    def _take(self, ids: list[int]) -> list[int]:
        if self.parted or ids[: len(self.fed)] != self.fed:
            self.parted = True
            return []
        new = ids[len(self.fed):]
        self.fed.extend(new)
        return new

    def round(self) -> list[int]:
        """The ids this round adds that no later delta can change."""
        if self.upstream_ids is not None:
            return self._take(list(self.upstream_ids))
        if self._growing not in ("reasoning", "content") or self._thought_in_content():
            return []
        now = self._render(MARKER)
        if now is None:
            return []
        last, self._last = self._last, now
        if last is None:
            return []
        return self._take(now[: first_difference(last, now)])

    def final(self, cut: bool = False) -> list[int]:
        """The rest of the reply, once the upstream is done. ``cut``: the engine stopped it at
        ``max_tokens``, so it is fed as the text it holds: no ``</think>`` or ``<|im_end|>`` the
        engine did not generate (a reply cut inside a tool call's arguments feeds no more)."""
        if self.upstream_ids is not None:
            return self._take(list(self.upstream_ids))
        if not (self.reasoning or self.content or self.calls):
            return []  # nothing generated (an error, a disconnect before the first token)
        if cut:
            if self._growing not in ("reasoning", "content"):
                return []
            if self._thought_in_content():  # the text as it came: no ``</think>`` closes it
                return self._take(self.tokens.encode("".join(self.content)))
            now = self._render(MARKER, hold=0)
            return self._take(now) if now is not None else []
        now = self._render()
        return self._take(now) if now is not None else []
