"""The value types the layers pass each other: one record per concept, the same fields from the core
to the JSON the HTTP API writes (msgspec encodes these dataclasses and derives their schema).

Only the standard library here, so every other core module may import it and none is imported back:
``protocols``, the facade, the host's bookkeeping, the schedulers and the adapters all name these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Where = Literal["resident", "parked", "dropped", "queued"]


StoreState = Literal["off", "up", "down"]


@dataclass(frozen=True, slots=True)
class Sharing:
    """What the status and ``/ready`` say of the shared store."""

    store: StoreState  # off: no STORE; up: reachable at the last look; down: not
    instance: str  # this instance's name in leases
    url: str  # the store's URL, the password masked
    held: int  # sessions this instance holds a lease on
    unshared: int  # resident sessions followed without a lease (taken while the store was down)
    lost: int  # sessions dropped because another instance took their lease
    stale_parks_refused: int  # parks the store refused because a newer holder had the session
    parks_refused: int  # parks in the store refused on reading (a part missing or wrong, another identity)
    last_error: str  # the last error talking to the store ("" when none)


@dataclass(frozen=True, slots=True)
class Answer:
    """The small model's choice among a question's labels, over the whole session."""

    session: str
    label: str
    probs: dict[str, float]  # label -> probability, over the choices only
    behind: int  # ids of the session not yet committed when asked (the fork read them)
    latency_ms: float  # the question's own time


@dataclass(frozen=True, slots=True)
class ChunkRead:
    """One grid chunk the reader committed."""

    session: str
    first_row: int
    rows: int
    cost_s: float  # measured, device synchronised: this chunk's share of the pass that read it
    batch: int = 1  # sessions in the pass that read this chunk (1: read alone)
    span: int = 1  # chunks of this session the pass read (``Reader.read_span``; 1: one)


@dataclass
class TurnTimeline:
    """One request's turn as the host reported it; the ration's arithmetic reads it. Written only by
    ``HostActivity`` (under its lock): the host's verbs, ``record_ration`` and ``record_host_time``."""

    request_id: str
    session: str | None = None
    profile: str | None = None
    arrived_s: float | None = None
    started_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    prompt_len: int = 0
    output_len: int = 0
    rounds: int = 0
    spent_s: float = 0.0  # ration used so far (measured device time of the chunks read)
    budget_s: float = 0.0  # the last ration slice's budget, as the rationed scheduler enforced it
    chunks: int = 0
    last_event_s: float = 0.0
    # wall time inside the shadow's calls from the first token on (round_ended, finished), chunks read
    # there included: what a host that waits on each call pays during its decode
    host_s: float = 0.0


@dataclass
class FeedResult:
    """What a feed did to a session (or why it was not followed)."""

    session: str
    followed: bool
    reason: str = ""  # why not followed: "off", "failed", "profile"
    queued: bool = False  # kept until the model is loaded
    ids: int = 0
    committed: int = 0
    backlog: int = 0
    behind_at_start: int | None = None  # the backlog when the turn began (before this prompt)
    rollback: bool = False


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What the ration read after a decode round: ``budget_ms`` is the budget the scheduler enforced
    (a quiet round, at which nothing could be read, reports its request's last look's)."""

    request_id: str
    chunks: int = 0
    spent_ms: float = 0.0
    budget_ms: float = 0.0
    turn_spent_ms: float = 0.0
    backlog: int = 0


@dataclass(frozen=True, slots=True)
class RouterAsk:
    """The question a host's router asks Qwen on a turn, and the router's own answer, for the shadow
    to ask too (a profile's ``router: shadow``; ``shadow.adapters.router``)."""

    question: str | list[int]  # the text, or its ids
    choices: list[str]  # one-token labels
    label: str | None = None  # the router's own answer
    fresh: bool | None = None  # the router decided the class on this turn (False: carried the session's forward)


@dataclass(frozen=True, slots=True)
class StartedTurn:
    """``started``'s answer over HTTP: the turn and what the prompt's feed did."""

    turn: TurnTimeline
    fed: FeedResult


# ---- status ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionStatus:
    """One session's line of status. A queued session (fed before the model loaded) has read
    nothing: no turns, checkpoints or bytes yet."""

    where: Where
    ids: int
    committed: int
    backlog: int
    turns: int = 0
    checkpoints: list[int] = field(default_factory=list)
    rollbacks: int = 0
    reread: int = 0
    bytes_resident: int = 0
    bytes_on_disk: int = 0
    last_used: float | None = None
    profile: str | None = None  # the service's: the facade knows no profiles


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """The facade's residency."""

    grid: int
    resident_bytes: int
    cap_bytes: int | None
    disk: bool
    park_failures: int
    last_store_error: str
    # the bounds beside the cap: ids dropped sessions keep (counted in it), the process's resident
    # memory, the session limit and what was forgotten to keep within it
    dropped_bytes: int = 0
    rss_bytes: int | None = None
    max_sessions: int | None = None
    forgotten: int = 0
    last_forgotten: str = ""
    # the shared store (STORE; None without one) and the sessions dropped because another instance took them
    sharing: Sharing | None = None
    lost: int = 0
    # the SHA-256 of the bits this instance's reader makes (``backends/fingerprint.py``): parks are
    # shared between instances whose fingerprints are equal, and read again elsewhere
    fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class Bounds:
    """What the residency bounds besides the cap (``Residency.bounds``)."""

    dropped_bytes: int
    rss_bytes: int | None
    max_sessions: int | None
    forgotten: int
    last_forgotten: str


@dataclass(frozen=True, slots=True)
class ShadowStatus:
    """The facade's status: its residency and every session's line."""

    store: StoreStatus
    sessions: dict[str, SessionStatus]


@dataclass(frozen=True, slots=True)
class HostStatus:
    """The host's activity now: who waits, who runs, who holds, and the running turns."""

    waiting: int
    running: int
    holds: int
    hold_ids: list[str]
    turns: list[TurnTimeline]
    finished_turns: int


@dataclass(frozen=True, slots=True)
class WindowStatus:
    windows: int
    chunks: int
    rows: int
    spent_ms: float


@dataclass(frozen=True, slots=True)
class SlotStatus:
    state: str  # off, empty, loading, loaded, failed
    model: str
    shared_with: list[str]
    load_s: float | None
    error: str
    device: str
    dtype: str
    grid: int
    # per batch size of the loaded reader: "ok", "unchecked", or why its warm-up check refused it
    batches: dict[str, str] = field(default_factory=dict)
    max_batch: int = 1  # the most sessions one pass reads (the largest size not refused)
    attention: str = ""  # the loaded reader's attention kernel (ATTENTION resolved; "torch": the torch forward)
