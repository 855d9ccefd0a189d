"""The service's records, as the host receives them: a summary (``Narration``, ``Narrated``), the
router's answers, and the status (``Status``) assembled from the parts' records (``status.py``).

Here, beside the core's records, so that the HTTP client (``shadow.api.client``) decodes the same
types as the server encodes without importing the service, the narrator or the router: this module
imports the core's records and profiles and msgspec only."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from msgspec import UNSET, UnsetType

from shadow.core.profiles import ShadowBlock
from shadow.core.records import Answer, HostStatus, SessionStatus, SlotStatus, StoreStatus, WindowStatus


@dataclass
class Narration:
    """One summary, as the host receives it."""

    session: str
    request_id: str
    thought: int  # the thought's number in the session, from 1
    at: int  # the session's position just past the thought's ``</think>``
    text: str  # one line, at most MAX_CHARS characters
    ids: list[int]  # what the fork decoded
    extra_ids: int  # ids past ``at`` the fork saw (the reader had committed rows past it), else 0
    committed: int  # rows committed when the fork ran
    chunks: int  # whole chunks it read first (committed: the reader's work, done in the narrator's slice)
    cost_ms: float  # measured: those chunks and the fork, device synchronised on both sides
    estimate_ms: float | None  # the cost it was admitted with (None: nothing measured yet)
    budget_ms: float  # what the turn's share left when it started
    turn_spent_ms: float  # the turn's summaries before this one
    since_first_token_ms: float
    waited_rounds: int


@dataclass(frozen=True, slots=True)
class NarratorStatus:
    """The narrator's slices: summaries written, skipped (``budget``: still waiting when the turn
    finished; ``not_loaded``; ``request_gone``: its request never finished, dropped), waiting, the
    time they used, the last one's cost."""

    share: float
    max_tokens: int
    summaries: int
    failed: int
    skipped: dict[str, int]
    waiting: int
    spent_ms: float
    last_cost_ms: float | None
    subscribers: int
    last: list[Narration]
    errors: list[str]



@dataclass(slots=True)
class RouterRecord:
    """One router question: its answer, or the error that stopped it (the fields of the other are
    ``UNSET``, left out of the JSON). A journal line is this record and the question's ids."""

    session: str
    request_id: str
    router_label: str | None
    fresh: bool | None
    behind_at_start: int
    insertion: int
    prompt_len: int
    grid: int
    choices: list[str]
    error: str | UnsetType = UNSET
    label: str | UnsetType = UNSET
    probability: float | UnsetType = UNSET
    probs: dict[str, float] | UnsetType = UNSET
    agree: bool | UnsetType | None = UNSET
    behind: int | UnsetType = UNSET
    at_insertion: bool | UnsetType = UNSET
    extra_ids: int | UnsetType = UNSET
    lag_s: float | UnsetType = UNSET
    latency_ms: float | UnsetType = UNSET


@dataclass(frozen=True, slots=True)
class RouterStatus:
    asked: int
    compared: int
    agreed: int
    agreement: float | None
    failed: int
    waiting: int
    journal: str | None
    last: list[RouterRecord]



@dataclass(frozen=True, slots=True)
class Narrated:
    """A summary asked for on top of a session (``narrate``): the decoded text, its ids."""

    session: str
    text: str
    ids: list[int]
    latency_ms: float



@dataclass(frozen=True, slots=True)
class WhereStatus:
    pid: int
    host: str
    port: int
    dir: str
    disk: str
    trace: list[str]
    trace_file: str | None


@dataclass(frozen=True, slots=True)
class ProfilesStatus:
    source: str  # the profiles file, or "(built in)"
    profiles: dict[str, ShadowBlock]


@dataclass(frozen=True, slots=True)
class WindowsStatus:
    idle: WindowStatus
    ration: WindowStatus


@dataclass(frozen=True, slots=True)
class IdleLoopStatus:
    running: bool
    ticks: int


@dataclass(frozen=True, slots=True)
class AnswerRecord:
    """A host's question and its ``Answer`` (the same fields), as the service keeps the last ones."""

    session: str
    question: str  # the text (at most 200 characters), or ``<N ids>``
    choices: list[str]
    label: str
    probs: dict[str, float]
    behind: int
    latency_ms: float
    at: float  # wall-clock seconds since the epoch

    @classmethod
    def of(cls, answer: Answer, question: str | Sequence[int], choices: Sequence[str]) -> AnswerRecord:
        q = question if isinstance(question, str) else f"<{len(question)} ids>"
        return cls(answer.session, q[:200], list(choices), answer.label, answer.probs, answer.behind,
                   answer.latency_ms, time.time())


@dataclass(frozen=True, slots=True)
class Status:
    slot: SlotStatus
    where: WhereStatus
    profiles: ProfilesStatus
    host: HostStatus
    windows: WindowsStatus
    idle_loop: IdleLoopStatus
    sessions: dict[str, SessionStatus]  # resident, parked, dropped, and queued (fed before the model loaded)
    backlog: int
    bytes: int  # resident and parked, every session
    checkpoints: int
    store: StoreStatus | None  # the facade's residency; None until the model is loaded
    router: RouterStatus | None
    narrator: NarratorStatus | None
    answers: list[AnswerRecord]
    errors: list[str]
