"""What ``GET /status`` answers, assembled from the parts' own typed records: the facade's
(``Shadow.status``), the host's activity (``HostActivity.status``), the router's and the narrator's.
The HTTP route returns this record as it is (msgspec encodes the dataclasses and derives the schema),
and ``ShadowClient.status`` decodes the same record."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from shadow.core.profiles import ShadowBlock
from shadow.core.records import HostStatus, SessionStatus, SlotStatus, StoreStatus, WindowStatus

from .narrator import NarratorStatus
from .router import RouterStatus

if TYPE_CHECKING:
    from shadow.core.records import Answer

    from .service import ShadowService


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


def assemble(service: ShadowService) -> Status:
    """The service's status: each part's record, the queued sessions' lines and the totals. The
    caller has settled the open rounds, so the counts include what quiet rounds kept."""
    shadow = service.live
    facade = shadow.status() if shadow is not None else None
    sessions = dict(facade.sessions) if facade is not None else {}
    profile_of, queued = service.bookkeeping()
    for name, n in queued.items():
        sessions[name] = SessionStatus(where="queued", ids=n, committed=0, backlog=n)
    sessions = {name: replace(line, profile=profile_of.get(name)) for name, line in sessions.items()}
    s, slot = service.settings, service.slot
    batches = shadow.reader.batch_sizes() if shadow is not None else {}
    return Status(
        slot=SlotStatus(state=slot.state, model=slot.model, shared_with=list(slot.shared_with), load_s=slot.load_s,
                        error=slot.error, device=s.device, dtype=s.dtype, grid=s.grid,
                        batches={str(b): why for b, why in batches.items()},
                        max_batch=shadow.reader.max_batch if shadow is not None else 1,
                        attention=shadow.reader.attention if shadow is not None else ""),
        where=WhereStatus(pid=os.getpid(), host=s.host, port=s.port, dir=str(s.home), disk=s.disk,
                          trace=list(s.trace_exporters),
                          trace_file=str(s.trace_path) if "jsonl" in s.trace_exporters else None),
        profiles=ProfilesStatus(service.profiles.source, dict(service.profiles.blocks)),
        host=service.activity.status(),
        windows=WindowsStatus(idle=service.stats["idle"].status(), ration=service.stats["ration"].status()),
        idle_loop=IdleLoopStatus(running=service.idle_loop.running, ticks=service.idle_loop.ticks),
        sessions=sessions,
        backlog=sum(v.backlog for v in sessions.values()),
        bytes=sum(v.bytes_resident + v.bytes_on_disk for v in sessions.values()),
        checkpoints=sum(len(v.checkpoints) for v in sessions.values()),
        store=facade.store if facade is not None else None,
        router=service.router.status() if service.router is not None else None,
        narrator=service.narrator.status() if service.narrator is not None else None,
        answers=list(service.answers),
        errors=list(service.errors),
    )
