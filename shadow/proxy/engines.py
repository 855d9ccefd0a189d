"""How each engine gives back the token ids it read and generated (``shadow proxy --engine``).

- ``vllm``: the request's ``return_token_ids: true`` adds ``prompt_token_ids`` to the response
  (streamed: to its first chunk) and ``token_ids`` to each choice (streamed: each chunk's new ids).
- ``sglang``: ``return_prompt_token_ids`` and ``return_token_ids`` add ``prompt_token_ids`` and
  ``token_ids`` to each choice of a whole (non-streamed) response; its streamed chunks carry none,
  so a stream is asked nothing.
- ``llamacpp``, ``transformers``: their chat completions return no ids; the proxy renders the
  messages with the Qwen3.5 template and compares the render's length with ``usage.prompt_tokens``.
- ``auto``: read from the engine's ``GET /v1/models`` (``owned_by``: vLLM says ``vllm``, SGLang
  ``sglang``, llama.cpp ``llamacpp``); anything else is asked nothing.

The fields are added only where the client did not set them, and what the proxy added is removed
from what the client receives (its events are then re-serialised; all others pass byte for byte).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ENGINES = ("auto", "vllm", "sglang", "llamacpp", "transformers")


@dataclass(frozen=True)
class Engine:
    name: str
    stream_fields: tuple[str, ...] = ()  # request fields that make a stream carry ids
    whole_fields: tuple[str, ...] = ()  # ... a whole response
    top_strip: tuple[str, ...] = ()  # response fields the fields add at the top
    choice_strip: tuple[str, ...] = ()  # ... on each choice

    def ask(self, body: dict[str, Any], stream: bool) -> list[str]:
        """Adds the fields that make the engine return ids; returns those it added (none the client set)."""
        added = [f for f in (self.stream_fields if stream else self.whole_fields) if f not in body]
        for f in added:
            body[f] = True
        return added

    def strip(self, obj: Any) -> Any:
        """``obj`` without what the added fields put in it."""
        if not isinstance(obj, dict):
            return obj
        out = {k: v for k, v in obj.items() if k not in self.top_strip}
        if isinstance(out.get("choices"), list):
            out["choices"] = [{k: v for k, v in c.items() if k not in self.choice_strip} if isinstance(c, dict)
                              else c for c in out["choices"]]
        return out


BY_NAME = {
    "vllm": Engine("vllm", ("return_token_ids",), ("return_token_ids",), ("prompt_token_ids",), ("token_ids",)),
    "sglang": Engine("sglang", (), ("return_prompt_token_ids", "return_token_ids"), (),
                     ("prompt_token_ids", "token_ids")),
    "llamacpp": Engine("llamacpp"),
    "transformers": Engine("transformers"),
}


def from_models(body: bytes) -> Engine:
    """The engine a ``GET /v1/models`` answer names (``auto``)."""
    try:
        data = json.loads(body).get("data") or []
        owners = {str(m.get("owned_by", "")).lower() for m in data if isinstance(m, dict)}
    except (ValueError, AttributeError, RecursionError):
        owners = set()
    for name in ("vllm", "sglang", "llamacpp"):
        if name in owners:
            return BY_NAME[name]
    return BY_NAME["transformers"]


def prompt_ids(obj: dict[str, Any]) -> list[int] | None:
    """The engine's prompt ids in a response or its first chunk (vLLM: top level; SGLang: the choice)."""
    ids = obj.get("prompt_token_ids")
    if ids is None:
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            ids = choices[0].get("prompt_token_ids")
    if isinstance(ids, list) and ids and all(type(i) is int and i >= 0 for i in ids):
        return ids
    return None


def usage_prompt_tokens(obj: dict[str, Any]) -> int | None:
    usage = obj.get("usage")
    n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return n if type(n) is int else None
