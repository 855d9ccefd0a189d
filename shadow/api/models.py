"""Typed request and response bodies of the HTTP API (msgspec structs: validated on the way in,
described in the OpenAPI schema). Unknown fields are refused, so a typo is a 400, not a no-op."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from shadow.core.settings import MAX_HOLD_S

from .status import (
    AnswerRecord,
    HostStatus,
    IdleLoopStatus,
    NarratorStatus,
    ProfilesStatus,
    RouterStatus,
    SessionStatus,
    SlotStatus,
    StoreStatus,
    Turn,
    WhereStatus,
    WindowsStatus,
)

MAX_IDS = 1_000_000  # more ids than any prompt a served Qwen takes
QWEN35_VOCAB = 248_320  # the embedding rows of every Qwen3.5 size (248,077 ids in use, padded)

__all__ = ["Arrived", "AskBody", "Asked", "Chat", "Fed", "Hold", "HoldBody", "Message", "NarrateBody", "Narrated",
           "Output", "Problem", "Prompt", "Rationed", "RequestRef", "Round", "RouterAsk", "Started", "StartedTurn",
           "Status", "Turn"]

TokenId = Annotated[int, Meta(ge=0, lt=QWEN35_VOCAB, description="a Qwen3.5 token id")]
Ids = Annotated[list[TokenId], Meta(max_length=MAX_IDS, description="Qwen3.5 token ids")]
PromptIds = Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_IDS,
                                          description="the whole rendered prompt, Qwen3.5 token ids")]
Name = Annotated[str, Meta(min_length=1, max_length=256, pattern=r"^\S(.*\S)?$",
                           description="a session or request id (no leading or trailing blanks)")]
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


class Fed(Struct, kw_only=True):
    session: str
    followed: bool
    reason: str
    queued: bool
    ids: int
    committed: int
    backlog: int
    behind_at_start: int | None
    rollback: bool


class AskBody(Struct, forbid_unknown_fields=True, kw_only=True):
    session: Name
    question: Text | Ids
    choices: Labels


class Asked(Struct, kw_only=True):
    session: str
    label: str
    probabilities: dict[str, float]
    behind: int
    latency_ms: float


class NarrateBody(Struct, forbid_unknown_fields=True, kw_only=True):
    session: Name
    prompt: Text
    max_new: Annotated[int, Meta(ge=1, le=128)] = 64


class Narrated(Struct, kw_only=True):
    session: str
    text: str
    ids: list[int]
    latency_ms: float


class RouterAsk(Struct, forbid_unknown_fields=True, kw_only=True):
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
    router: RouterAsk | None = None


class RequestRef(Struct, forbid_unknown_fields=True, kw_only=True):
    request_id: Name


class Round(Struct, forbid_unknown_fields=True, kw_only=True):
    """A decode round ended: the output ids it produced (may be none)."""

    request_id: Name
    ids: Ids = []


class StartedTurn(Struct, kw_only=True):
    turn: Turn
    fed: Fed


class Rationed(Struct, kw_only=True):
    request_id: str
    chunks: int
    spent_ms: float
    budget_ms: float
    turn_spent_ms: float
    backlog: int


class HoldBody(Struct, forbid_unknown_fields=True, kw_only=True):
    ttl_s: Annotated[float, Meta(gt=0, le=MAX_HOLD_S, description=(
        f"seconds the hold lives; at most {MAX_HOLD_S:g}, or QWEN38_SHADOW_MAX_HOLD_S when that is lower"))] = 600.0


class Hold(Struct, kw_only=True):
    hold_id: str


class Status(Struct, kw_only=True, forbid_unknown_fields=True):
    slot: SlotStatus
    where: WhereStatus
    profiles: ProfilesStatus
    host: HostStatus
    windows: WindowsStatus
    idle_loop: IdleLoopStatus
    sessions: dict[str, SessionStatus]
    backlog: int
    bytes: int
    checkpoints: int
    store: StoreStatus
    router: RouterStatus | None
    narrator: NarratorStatus | None
    answers: list[AnswerRecord]
    errors: list[str]


class Problem(Struct, kw_only=True):
    status_code: int
    detail: str
