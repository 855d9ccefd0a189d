"""What ``GET /status`` answers, assembled from the parts' own typed records: the facade's
(``Shadow.status``), the host's activity (``HostActivity.status``), the router's and the narrator's.
The HTTP route returns this record as it is (msgspec encodes the dataclasses and derives the schema),
and ``ShadowClient.status`` decodes the same record."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from shadow.core.records import SessionStatus, SlotStatus

from .records import IdleLoopStatus, ProfilesStatus, Status, WhereStatus, WindowsStatus

if TYPE_CHECKING:

    from .service import ShadowService


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
                        max_batch=shadow.reader.max_batch if shadow is not None else 1),
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
