"""The real sessions as timed turns: rendered ids per request and when the request ran.

Every session under ``sessions/raw`` goes through the project's converters, the Qwen3.5 chat
template and the real vocabulary (``shadow.adapters.transcripts``). Times, per source (see
``../shared/data/sessions/FORMATS.md``):

- Claude Code, OpenHands output and SDK logs carry each request's start and end: used as they are.
- mini-swe-agent carries only the start (``created``): the end is estimated as the start plus the
  output's ids at the decode rate, and never past the next request's start.
- SWE-agent carries no LLM times: nothing to replay, the session is skipped with that reason.

No source records the first token. It is estimated as the end less the output's ids at the
decode rate (the rest of the request is the prefill and the provider's queue), never before the
start. Requests of one session that overlap in the log follow one another in the replay.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from shadow.adapters.transcripts import Transcript, Turn, discover, load_transcript, render_turns
from shadow.core.session import first_difference

TIMING_BOTH = "start and end from the source"
TIMING_START = "start from the source; end estimated from the output at the decode rate"
FIRST_TOKEN = "estimated: the end less the output at the decode rate (no source records it)"


@dataclass
class TimedTurn:
    prompt_ids: list[int]
    output_ids: list[int]
    start_s: float  # from the session's first request
    first_token_s: float
    end_s: float
    keep: int = 0  # ids of what the host held before (the last prompt and its output) this prompt keeps


@dataclass
class SessionTimeline:
    name: str  # the source's path under sessions/raw, with #k when one file holds several sessions
    source_format: str
    timing: str
    turns: list[TimedTurn]

    @property
    def first_token(self) -> str:
        return FIRST_TOKEN


@dataclass
class Skipped:
    name: str
    reason: str


def timed(turns: Sequence[Turn], decode_tps: float) -> tuple[list[TimedTurn], str] | str:
    """The turns with start, first token and end (seconds from the first start), and how the
    times were got; or why they cannot be (a string)."""
    if decode_tps <= 0:
        raise ValueError(f"decode rate must be positive, got {decode_tps}")
    if not turns:
        return "no requests"
    starts = [t.start_s for t in turns]
    if any(s is None for s in starts):
        return "the source records no request start times (nothing real to replay)"
    has_end = all(t.end_s is not None for t in turns)
    t0 = min(s for s in starts if s is not None)
    out: list[TimedTurn] = []
    held: list[int] = []
    for i, t in enumerate(turns):
        assert t.start_s is not None
        start = t.start_s - t0
        decode = len(t.output_ids) / decode_tps
        if has_end:
            assert t.end_s is not None
            end = max(start, t.end_s - t0)
        else:
            nxt = turns[i + 1].start_s if i + 1 < len(turns) else None
            end = start + decode if nxt is None else min(start + decode, max(start, nxt - t0))
        keep = first_difference(held, t.prompt_ids)
        out.append(TimedTurn(t.prompt_ids, t.output_ids, start, max(start, end - decode), end, keep))
        held = t.prompt_ids + t.output_ids
    return out, TIMING_BOTH if has_end else TIMING_START


def _names(path: Path, raw: Path, transcripts: list[Transcript]) -> list[str]:
    base = str(path.relative_to(raw))
    return [base] if len(transcripts) == 1 else [f"{base}#{k}" for k in range(len(transcripts))]


def session_paths(raw: Path, only: Sequence[str] = ()) -> list[Path]:
    """The session sources under ``raw``, or those whose relative path contains one of ``only``."""
    paths = discover(raw)
    if only:
        paths = [p for p in paths if any(o in str(p.relative_to(raw)) for o in only)]
    return paths


def timelines(raw: Path, decode_tps: float, only: Sequence[str] = ()) -> Iterator[SessionTimeline | Skipped]:
    """One session at a time (a long session's rendered prompts take hundreds of MB as lists)."""
    for path in session_paths(raw, only):
        transcripts = load_transcript(path)
        for name, tr in zip(_names(path, raw, transcripts), transcripts, strict=True):
            if any(r.start_s is None for r in tr.requests) or not tr.requests:
                yield Skipped(name, "the source records no request start times (nothing real to replay)")
                continue
            got = timed(render_turns(tr), decode_tps)
            if isinstance(got, str):
                yield Skipped(name, got)
            else:
                yield SessionTimeline(name, tr.source_format, got[1], got[0])


def timeline_of(raw: Path, relpath: str, decode_tps: float, index: int = 0) -> SessionTimeline:
    """One session (the ``index``-th of its file), rendering only that one."""
    transcripts = load_transcript(raw / relpath)
    tr = transcripts[index]
    got = timed(render_turns(tr), decode_tps)
    if isinstance(got, str):
        raise ValueError(f"{relpath}#{index}: {got}")
    name = relpath if len(transcripts) == 1 else f"{relpath}#{index}"
    return SessionTimeline(name, tr.source_format, got[1], got[0])
