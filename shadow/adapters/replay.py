"""Replaying rendered sessions into a ``Shadow`` turn by turn, and checking the result bit for bit."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shadow.core.plan import ReadPlan
from shadow.core.shadow import Shadow

from .transcripts import Turn


@dataclass(frozen=True, slots=True)
class ReplayReport:
    session: str
    tokens: int
    turns: int
    rollbacks: int
    reread: int
    chunks: int
    tensors: int
    equal: bool
    largest_difference: float
    worst_tensor: str


def replay(
    shadow: Shadow,
    session: str,
    turns: Sequence[Turn],
    progress: Callable[[int, int, int], None] | None = None,
) -> int:
    """Feed each turn's prompt, read, feed its output, read. Returns chunks read."""
    chunks = 0
    for i, turn in enumerate(turns):
        shadow.feed_prompt(session, turn.prompt_ids)
        chunks += len(shadow.read(ReadPlan(session)))
        shadow.feed_output(session, turn.output_ids)
        chunks += len(shadow.read(ReadPlan(session)))
        if progress is not None:
            progress(i + 1, len(turns), shadow.position(session).committed)
    return chunks


def compare(got: dict[str, Any], want: dict[str, Any]) -> tuple[bool, float, str]:
    """(every tensor bit-equal, largest absolute difference, the tensor holding it)."""
    if got.keys() != want.keys():
        return False, float("inf"), "names differ"
    worst, where, equal = 0.0, "", True
    for name in sorted(want):
        a, b = got[name], want[name]
        if a.shape != b.shape:
            return False, float("inf"), name
        if a.equal(b):
            continue
        equal = False
        diff = float((a.float() - b.float()).abs().max())
        if diff >= worst:
            worst, where = diff, name
    return equal, worst, where


def verify(
    shadow: Shadow,
    session: str,
    turns: Sequence[Turn],
    progress: Callable[[int, int, int], None] | None = None,
) -> ReplayReport:
    chunks = replay(shadow, session, turns, progress)
    pos = shadow.position(session)
    state = shadow.export_state(session)
    equal, worst, where = compare(state, shadow.fresh_state(shadow.session_ids(session)))
    return ReplayReport(
        session,
        pos.length,
        len(turns),
        pos.rollbacks,
        pos.reread,
        chunks,
        len(state),
        equal,
        worst,
        where,
    )
