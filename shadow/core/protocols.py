"""The seams between the domain and what does the work. Implementations live in ``shadow.backends``
and ``shadow.adapters``; ``shadow.container`` picks them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .records import Answer, ChunkRead, TurnTimeline
from .session import Position, SessionBook

Window = Literal["idle", "ration", "narrator", "ask"]  # who read a chunk (the last two: a fork's tail)


class Reader(Protocol):
    """Advances sessions' model state in whole grid chunks and answers forks on top of it."""

    grid: int

    @property
    def max_batch(self) -> int:
        """The most sessions one ``read_chunks`` pass takes (1: no batching)."""
        ...

    @property
    def attention(self) -> str:
        """The attention kernel that makes this reader's bits, by name."""
        ...

    def batch_sizes(self) -> dict[int, str]:
        """Each batch size a pass may take: "ok" (its warm-up check passed, or no check is needed),
        "unchecked" (before the check), or why it is not used (a refused size)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def weights_hash(self) -> str:
        """A digest of the weights: state read by other weights must never be loaded."""
        ...

    @property
    def dtype(self) -> str:
        """The state's dtype by name (``float32``, ``bfloat16``)."""
        ...

    @property
    def fingerprint(self) -> str:
        """A digest of the bits this reader makes (kernels, library versions, device): a park made
        under another fingerprint must never be restored here. Computed once, on first use."""
        ...

    def new_session(self) -> Any: ...

    def warm_up(self) -> float:
        """Prepare what the first chunk would otherwise prepare (captures, compiles); seconds taken."""
        ...

    def state_specs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Each tensor ``serialise`` writes for a session with no rows and no checkpoint, by name:
        its dtype's safetensors name (``BF16``, ``F32``) and its shape (a KV tensor's with 0 rows).
        What a parked file's header is checked against before its data is read."""
        ...

    def serialise(self, book: SessionBook, tensors: Any) -> dict[str, Any]:
        """The session's state as host tensors, one stable name each (committed rows only): what a
        parked file holds. Raises ValueError when ``tensors`` do not hold ``book.committed`` rows."""
        ...

    def deserialise(self, book: SessionBook, data: Mapping[str, Any]) -> Any:
        """``serialise``'s inverse, on the reader's device. Raises KeyError or ValueError when
        ``data`` does not fit this model."""
        ...

    def read_chunk(self, book: SessionBook, tensors: Any) -> float: ...

    def read_chunks(self, batch: Sequence[tuple[SessionBook, Any]]) -> float:
        """Commit the next whole chunk of each (book, tensors) in one pass, each at its own depth;
        returns the measured cost of the whole pass in seconds (device synchronised). Each session's
        resulting tensors are bit-identical to read_chunk on it alone, whatever it is batched with.
        Checkpoints are taken as read_chunk takes them."""
        ...

    @property
    def spans(self) -> tuple[int, ...]:
        """The chunk counts ``read_span`` takes (its warm-up check passed); () when it takes none."""
        ...

    def read_span(self, book: SessionBook, tensors: Any, chunks: int) -> float:
        """Commit the next ``chunks`` whole chunks of one session in one pass; its measured cost in
        seconds. The tensors end bit-identical to ``chunks`` calls of read_chunk. A wanted checkpoint
        line may end the span, never fall inside it (ValueError)."""
        ...

    def checkpoint_if_due(self, book: SessionBook, tensors: Any) -> None: ...

    def roll_back(self, tensors: Any, resume_at: int) -> None: ...

    def fork_logits(self, book: SessionBook, tensors: Any, extra: list[int], upto: int | None = None) -> Any: ...

    def sync(self) -> None: ...

    def fork_decode(self, book: SessionBook, tensors: Any, prompt: list[int], max_new: int,
                    stop: set[int], upto: int | None = None) -> list[int]: ...

    def export(self, tensors: Any) -> dict[str, Any]: ...

    def fresh(self, ids: list[int]) -> dict[str, Any]: ...

    def probabilities(self, logits: Any, token_ids: Sequence[int]) -> list[float]: ...


class Prompter(Protocol):
    """Turns a question's text into ids, and a choice label into its one token."""

    def question_ids(self, text: str) -> list[int]: ...

    def single_token(self, label: str) -> int | None: ...

    @property
    def stop_ids(self) -> set[int]: ...


@dataclass(frozen=True, slots=True)
class Stored:
    """What a store says of one session it holds."""

    bytes: int  # held by the store: device bytes (KV capacity and checkpoints included), or the file's size
    parked_at: float | None = None  # (disk) when it was written
    position: Position | None = None  # (disk) the bookkeeping kept beside the state


class StateStore(Protocol):
    """Where a session's state lives when it is not in use: ``memory`` (resident on the reader's
    device) or ``disk`` (parked files). ``peek`` returns what the store holds and keeps it; ``take``
    returns it and lets go of it. Both return None for a session the store does not hold, or holds
    in a form it refuses (corrupt, other weights, other grid, other format), which it then removes;
    ``put`` raises ``StoreError`` when it cannot store, leaving nothing half-written. The facade
    restores with ``peek``: a parked file stays until a newer ``put`` replaces it or ``remove``.
    A park that is whole but was made under another reader's fingerprint comes back as
    ``(book, None)``: the session's ids and bookkeeping without its state, to be read again."""

    def put(self, name: str, book: SessionBook, tensors: Any) -> int: ...

    def peek(self, name: str) -> tuple[SessionBook, Any] | None: ...

    def take(self, name: str) -> tuple[SessionBook, Any] | None: ...

    def remove(self, name: str) -> None: ...

    def names(self) -> list[str]: ...

    def info(self, name: str) -> Stored | None: ...

    def close(self) -> None:
        """Let go of what the store holds open (the disk's folder lock); no more ``put`` after it."""
        ...


class Scheduler(Protocol):
    """Grants the reader a window and reads in it. ``step`` is one grant: it reads what the window
    allows now (possibly nothing) and returns the chunks read; it never sleeps."""

    window: Window

    def step(self, turn: TurnTimeline | None = None) -> list[ChunkRead]: ...


class Ration(Scheduler, Protocol):
    """The scheduler that reads between a request's decode rounds. ``may_read`` is its ``step``'s
    own test, without reading: whether a step now could read a chunk, given a bound on the turn's
    session's backlog (per turn: of that session; device-wide: of it or of any session the device's
    ration reads, within the device's budget). The service leaves a round quiet when it could not.
    A ration that reads on a thread of its own reports what it read through ``on_read`` and its
    failures through ``on_error`` (the service sets both), and ``close`` ends that thread."""

    on_read: Callable[[list[ChunkRead]], None] | None
    on_error: Callable[[BaseException], None] | None

    def may_read(self, turn: TurnTimeline, backlog: int, grid: int, budget: float | None = None) -> bool: ...

    def close(self, timeout: float = 10.0) -> None: ...


class Asker(Protocol):
    """What a ``Questioner`` needs of the facade: where sessions are read to, and a question at a
    position (``shadow.core.shadow.Shadow`` is one)."""

    @property
    def grid(self) -> int: ...

    def committed_rows(self) -> dict[str, int]: ...

    def position(self, session: str) -> Position: ...

    def ask(self, session: str, question: str | Sequence[int], choices: Sequence[str],
            at: int | None = None) -> Answer: ...


class Questioner(Protocol):
    """Questions that wait for the reader to reach a position, answered in the idle window (the
    router's, in shadow mode). ``answer`` asks the ready ones and stops as soon as ``busy()``."""

    def pending(self, shadow: Asker) -> bool: ...

    def answer(self, shadow: Asker, busy: Callable[[], bool]) -> None: ...


class Span(Protocol):
    def set(self, key: str, value: Any) -> None: ...


class Telemetry(Protocol):
    """What the schedulers and the service report. Attributes come from what was measured anyway:
    nothing here may cost a device sync."""

    def span(self, name: str, attributes: Mapping[str, Any]) -> AbstractContextManager[Span]: ...

    def chunk(self, window: Window, chunk: ChunkRead, backlog_after: int, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None = None) -> None: ...

    def count(self, name: str, value: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        """Add ``value`` to the counter ``name`` (``shadow.adapters.metrics.COUNTERS``), where it happened."""
        ...

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        """One observation of the histogram ``name`` (``shadow.adapters.metrics.HISTOGRAMS``)."""
        ...
