"""What ``GET /status`` answers (``Status``, in ``records.py``), assembled from the parts' own typed
records: the facade's (``Shadow.status``), the host's activity (``HostActivity.status``), the
router's, the narrator's, and the service's ``Turns`` (each session's profile, the kept feeds).
``assemble`` takes those records, not the service, so this module imports no part of the service.
The HTTP route returns the record as it is (msgspec encodes the dataclasses and derives the schema),
and ``ShadowClient.status`` decodes the same record."""

from __future__ import annotations

import os
from dataclasses import replace

from shadow.core.records import HostStatus, SessionStatus, ShadowStatus, SlotStatus
from shadow.core.settings import ShadowSettings
from shadow.core.shadow import Shadow
from shadow.core.slot import ModelSlot

from .records import (
    AnswerRecord,
    IdleLoopStatus,
    NarratorStatus,
    ProfilesStatus,
    RouterStatus,
    Status,
    WhereStatus,
    WindowsStatus,
)


def slot_status(slot: ModelSlot, settings: ShadowSettings, shadow: Shadow | None) -> SlotStatus:
    """The model's slot, with the loaded reader's batch sizes (why a size was refused, if it was)."""
    batches = shadow.reader.batch_sizes() if shadow is not None else {}
    return SlotStatus(state=slot.state, model=slot.model, shared_with=list(slot.shared_with), load_s=slot.load_s,
                      error=slot.error, device=settings.device, dtype=settings.dtype, grid=settings.grid,
                      batches={str(b): why for b, why in batches.items()},
                      max_batch=shadow.reader.max_batch if shadow is not None else 1,
                      attention=shadow.reader.attention if shadow is not None else "")


def where_status(settings: ShadowSettings) -> WhereStatus:
    """Where this service runs and writes."""
    s = settings
    return WhereStatus(pid=os.getpid(), host=s.host, port=s.port, dir=str(s.home), disk=s.disk,
                       trace=list(s.trace_exporters),
                       trace_file=str(s.trace_path) if "jsonl" in s.trace_exporters else None)


def assemble(facade: ShadowStatus | None, queued: dict[str, int], profile_of: dict[str, str], *,
             slot: SlotStatus, where: WhereStatus, profiles: ProfilesStatus, host: HostStatus,
             windows: WindowsStatus, idle_loop: IdleLoopStatus, router: RouterStatus | None,
             narrator: NarratorStatus | None, answers: list[AnswerRecord], errors: list[str]) -> Status:
    """The status from the parts' records: the facade's session lines (``None`` before the model is
    loaded), a line for each session whose feeds are kept (``queued``: its ids), each line's profile
    (``profile_of``), and the totals over the lines."""
    sessions = dict(facade.sessions) if facade is not None else {}
    for name, n in queued.items():
        sessions[name] = SessionStatus(where="queued", ids=n, committed=0, backlog=n)
    sessions = {name: replace(line, profile=profile_of.get(name)) for name, line in sessions.items()}
    return Status(
        slot=slot, where=where, profiles=profiles, host=host, windows=windows, idle_loop=idle_loop,
        sessions=sessions,
        backlog=sum(v.backlog for v in sessions.values()),
        bytes=sum(v.bytes_resident + v.bytes_on_disk for v in sessions.values()),
        checkpoints=sum(len(v.checkpoints) for v in sessions.values()),
        store=facade.store if facade is not None else None,
        router=router, narrator=narrator, answers=answers, errors=errors,
    )
