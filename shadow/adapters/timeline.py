"""Replaying a real session's timeline against the service, as its host would have driven it.

Each turn: ``arrived`` and ``started`` (the prompt ids) at the request's real start, compressed by
``speed``; the first token after ``ttft_share`` of the request's duration (the logs have no TTFT);
then the output in rounds of ``round_ids`` ids spread evenly over the rest of the request, one
``round_ended`` call each (the ration reads there); ``finished`` at the request's end. Between requests
the host is idle and the service's idle window may read. Sleeps are injected (``sleep``, ``now``),
so a test can run it on a simulated clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shadow.core.host import Host
from shadow.core.records import TurnTimeline

from .transcripts import Turn


@dataclass
class TurnReport:
    index: int
    start_s: float  # compressed, from the session's first request
    duration_s: float  # compressed
    prompt_ids: int
    output_ids: int
    behind_at_start: int  # ids held before this turn and not read when it began
    fresh: bool  # less than one grid chunk behind
    rollback: bool
    rounds: int = 0
    ration_chunks: int = 0
    ration_spent_ms: float = 0.0
    rounds_detail: list[dict[str, Any]] = field(default_factory=list)
    turn: TurnTimeline | None = None  # the host's view at the end (first token, spent)


def durations(turns: Sequence[Turn], speed: float) -> list[tuple[float, float]]:
    """(start, duration) per turn, compressed, from the first start; turns without times follow on."""
    t0 = next((t.start_s for t in turns if t.start_s is not None), None)
    out: list[tuple[float, float]] = []
    at = 0.0
    for t in turns:
        if t0 is not None and t.start_s is not None:
            at = max(at, (t.start_s - t0) / speed)
        dur = ((t.end_s - t.start_s) / speed) if (t.start_s is not None and t.end_s is not None) else 1.0 / speed
        out.append((at, max(dur, 0.0)))
        at += max(dur, 0.0)
    return out


def replay_timeline(host: Host, session: str, turns: Sequence[Turn], grid: int, speed: float = 5.0,
                    round_ids: int = 8, ttft_share: float = 0.2, sleep: Callable[[float], None] = time.sleep,
                    now: Callable[[], float] = time.monotonic) -> list[TurnReport]:
    reports: list[TurnReport] = []
    origin = now()

    def wait_until(t: float) -> None:
        left = origin + t - now()
        if left > 0:
            sleep(left)

    for i, (turn, (start, dur)) in enumerate(zip(turns, durations(turns, speed), strict=True)):
        rid = f"{session}-{i}"
        wait_until(start)
        host.arrived(rid)
        _, fed = host.started(rid, session, ids=turn.prompt_ids)
        behind = fed.behind_at_start or 0
        rep = TurnReport(i, start, dur, len(turn.prompt_ids), len(turn.output_ids), behind, behind < grid,
                         fed.rollback)
        wait_until(start + ttft_share * dur)
        host.first_token(rid)
        pieces = [turn.output_ids[j:j + round_ids] for j in range(0, len(turn.output_ids), round_ids)] or [[]]
        step = (1 - ttft_share) * dur / len(pieces)
        for k, piece in enumerate(pieces):
            wait_until(start + ttft_share * dur + (k + 1) * step)
            r = host.round_ended(rid, piece)
            rep.rounds += 1
            rep.rounds_detail.append(asdict(r))
        rep.turn = host.finished(rid)
        # the turn's own account: a slice read on the ration's thread is charged to it when it ends,
        # not in the round that decided it
        rep.ration_chunks, rep.ration_spent_ms = rep.turn.chunks, rep.turn.spent_s * 1e3
        reports.append(rep)
    return reports


# What a user's chunk costs: the 0.8B, bf16, on an H200, a 512-row chunk at depth 0
# (benchmarks/results/read_rate-2026-12-01_ce5f57a.json: 2.80 ms).
USER_CHUNK_S = 0.0028


def demo_stretch(chunk_s: float, session_s: float, within_s: float, user_chunk_s: float = USER_CHUNK_S) -> float:
    """How much slower than its real pace to replay a session so that the reader keeps up with it
    as it would for a user: the chunk cost measured here over the user's, never faster than the
    real pace, and at most what keeps the replay within ``within_s``."""
    most = max(1.0, within_s / session_s) if session_s > 0 else 1.0
    return min(max(1.0, chunk_s / user_chunk_s), most)
