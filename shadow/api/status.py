"""The parts of ``GET /status``, typed (msgspec structs). The service builds plain dicts; the route
converts them here, so a key the service adds or drops without this schema is an error, not drift.
Fields that only some lines carry (a queued session has no checkpoints yet; a router record holds
an answer or an error) are ``UNSET`` when absent and left out of the JSON, as they always were."""

from __future__ import annotations

from msgspec import UNSET, Struct, UnsetType


class _Part(Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class SlotStatus(_Part):
    state: str
    model: str
    shared_with: list[str]
    load_s: float | None
    error: str
    device: str
    dtype: str
    grid: int


class WhereStatus(_Part):
    pid: int
    host: str
    port: int
    dir: str
    disk: str
    trace: list[str]
    trace_file: str | None


class ProfileStatus(_Part):
    mode: str
    narrator: str
    router: str
    router_min_tokens: int


class ProfilesStatus(_Part):
    source: str
    profiles: dict[str, ProfileStatus]


class Turn(_Part):
    """A request's timeline as the host reported it: the answer of the host verbs and a line of status."""

    request_id: str
    session: str | None
    profile: str | None
    arrived_s: float | None
    started_s: float | None
    first_token_s: float | None
    finished_s: float | None
    prompt_len: int
    output_len: int
    rounds: int
    spent_s: float
    budget_s: float
    chunks: int
    last_event_s: float
    host_s: float  # wall time inside the shadow's calls from the first token on


class HostStatus(_Part):
    waiting: int
    running: int
    holds: int
    hold_ids: list[str]
    turns: list[Turn]
    finished_turns: int


class WindowStatus(_Part):
    windows: int
    chunks: int
    rows: int
    spent_ms: float


class WindowsStatus(_Part):
    idle: WindowStatus
    ration: WindowStatus


class IdleLoopStatus(_Part):
    running: bool
    ticks: int


class SessionStatus(_Part):
    where: str  # resident, parked, dropped, or queued (fed before the model loaded)
    ids: int
    committed: int
    backlog: int
    profile: str | None
    turns: int | UnsetType = UNSET
    checkpoints: list[int] | UnsetType = UNSET
    rollbacks: int | UnsetType = UNSET
    reread: int | UnsetType = UNSET
    bytes_resident: int | UnsetType = UNSET
    bytes_on_disk: int | UnsetType = UNSET
    last_used: float | UnsetType = UNSET


class StoreStatus(_Part):
    """The facade's residency; empty until the model is loaded."""

    grid: int | UnsetType = UNSET
    resident_bytes: int | UnsetType = UNSET
    cap_bytes: int | UnsetType | None = UNSET
    disk: bool | UnsetType = UNSET
    park_failures: int | UnsetType = UNSET
    last_store_error: str | UnsetType = UNSET
    # bounds (issue 22): dropped sessions' ids (in the cap), the process's RSS, the session limit
    dropped_bytes: int | UnsetType = UNSET
    rss_bytes: int | UnsetType | None = UNSET
    max_sessions: int | UnsetType | None = UNSET
    forgotten: int | UnsetType = UNSET
    last_forgotten: str | UnsetType = UNSET


class RouterRecord(_Part):
    """One router question: its answer, or the error that stopped it."""

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


class RouterStatus(_Part):
    asked: int
    compared: int
    agreed: int
    agreement: float | None
    failed: int
    waiting: int
    journal: str | None
    last: list[RouterRecord]


class AnswerRecord(_Part):
    session: str
    question: str
    choices: list[str]
    label: str
    probs: dict[str, float]
    behind: int
    latency_ms: float
    at: float


class NarrationRecord(_Part):
    """One summary of a finished thought (``shadow.adapters.narrator.Narration``)."""

    session: str
    request_id: str
    thought: int
    at: int
    text: str
    ids: list[int]
    extra_ids: int
    committed: int
    chunks: int
    cost_ms: float
    estimate_ms: float | None
    budget_ms: float
    turn_spent_ms: float
    since_first_token_ms: float
    waited_rounds: int


class NarratorStatus(_Part):
    """The narrator's slices: summaries written, skipped (``budget``: still waiting when the turn
    finished; ``not_loaded``), waiting, the time they used, the last one's cost."""

    share: float
    max_tokens: int
    summaries: int
    failed: int
    skipped: dict[str, int]
    waiting: int
    spent_ms: float
    last_cost_ms: float | None
    subscribers: int
    last: list[NarrationRecord]
    errors: list[str]
