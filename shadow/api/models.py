"""Typed request bodies of the HTTP API (msgspec structs: validated on the way in, described in the
OpenAPI schema). Unknown fields are refused, so a typo is a 400, not a no-op. The answers are the
layers' own records (``shadow.core.records``, ``shadow.adapters.status``): no copy of them here."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from shadow.core.settings import MAX_HOLD_S

MAX_IDS = 1_000_000  # more ids than any prompt a served Qwen takes
QWEN35_VOCAB = 248_320  # the embedding rows of every Qwen3.5 size (248,077 ids in use, padded)

__all__ = ["Arrived", "AskBody", "Chat", "HoldBody", "Message", "NarrateBody", "Output", "Prompt", "RequestRef",
           "Round", "RouterBody", "Started"]

TokenId = Annotated[int, Meta(ge=0, lt=QWEN35_VOCAB, description="a Qwen3.5 token id")]
Ids = Annotated[list[TokenId], Meta(max_length=MAX_IDS, description="Qwen3.5 token ids")]
PromptIds = Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_IDS,
                                          description="the whole rendered prompt, Qwen3.5 token ids")]
# Blanks and line breaks spelled out: ``\s``, ``.`` and ``$`` mean different things to the decoder
# (Python's re) and to the schema's readers (ECMA-262 regexes): Python's ``\s`` holds \x1c-\x1f and
# \x85 and not \ufeff, its ``.`` takes \r, \u2028 and \u2029, its ``$`` matches before a final
# newline (``(?!\n)`` stops that; in ECMA-262 it is always true there). Blanks: both dialects' ``\s``.
BLANKS = r"\t-\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NAME_PATTERN = rf"^[^{BLANKS}](?:[^\n\r\u2028\u2029]*[^{BLANKS}])?$(?!\n)"
Name = Annotated[str, Meta(min_length=1, max_length=256, pattern=NAME_PATTERN,
                           description="a session or request id: one line, no leading or trailing blanks")]
Label = Annotated[str, Meta(min_length=1, max_length=32, description="a choice's label, one token (A, B, ...)")]
Labels = Annotated[list[Label], Meta(min_length=1, max_length=26)]
Text = Annotated[str, Meta(min_length=1, max_length=1_000_000)]


class Message(Struct, kw_only=True, omit_defaults=True):
    """An OpenAI-style chat message (other keys are dropped)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class Chat(Struct, forbid_unknown_fields=True, kw_only=True):
    """A prompt as messages (and tool schemas), rendered here with the Qwen3.5 chat template."""

    messages: Annotated[list[Message], Meta(min_length=1, max_length=100_000)]
    tools: Annotated[list[dict[str, Any]], Meta(max_length=1_000)] | None = None
    enable_thinking: bool | None = None


class Prompt(Struct, forbid_unknown_fields=True, kw_only=True):
    """A turn's whole prompt: token ids, or messages the service renders."""

    session: Name
    prompt: PromptIds | Chat
    profile: Name | None = None


class Output(Struct, forbid_unknown_fields=True, kw_only=True):
    session: Name
    ids: Ids


class AskBody(Struct, forbid_unknown_fields=True, kw_only=True):
    session: Name
    question: Text | Ids
    choices: Labels


class NarrateBody(Struct, forbid_unknown_fields=True, kw_only=True):
    session: Name
    prompt: Text
    max_new: Annotated[int, Meta(ge=1, le=128)] = 64


class RouterBody(Struct, forbid_unknown_fields=True, kw_only=True):
    """The router's class question for this turn (router shadow mode) and the router's own answer."""

    question: Text | Ids
    choices: Labels
    label: Label | None = None
    fresh: bool | None = None  # the router decided the class on this turn (false: carried the session's forward)


class Arrived(Struct, forbid_unknown_fields=True, kw_only=True):
    request_id: Name


class Started(Struct, forbid_unknown_fields=True, kw_only=True):
    request_id: Name
    session: Name
    prompt: PromptIds | Chat
    profile: Name | None = None
    router: RouterBody | None = None


class RequestRef(Struct, forbid_unknown_fields=True, kw_only=True):
    request_id: Name


class Round(Struct, forbid_unknown_fields=True, kw_only=True):
    """A decode round ended: the output ids it produced (may be none)."""

    request_id: Name
    ids: Ids = []


class HoldBody(Struct, forbid_unknown_fields=True, kw_only=True):
    ttl_s: Annotated[float, Meta(gt=0, le=MAX_HOLD_S, description=(
        f"seconds the hold lives; at most {MAX_HOLD_S:g}, or QWEN38_SHADOW_MAX_HOLD_S when that is lower"))] = 600.0
