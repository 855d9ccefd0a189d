"""The soak's sessions: real transcripts' first turns rendered to ids (or the shipped demo session),
each reused under other names when there are fewer than the soak feeds, and what the soak knows of
each (``Sess``: the next turn, the ids the server should hold)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Sess:
    name: str
    turns: list[tuple[list[int], list[int]]]  # (prompt ids, output ids)
    at: int = 0  # the next turn
    ids: list[int] = field(default_factory=list)  # what the server should hold ([] : nothing yet)
    lost: bool = True  # the server may not hold it (new, deleted, forgotten): the next feed is a whole prompt


def load_sessions(n: int, turns: int, data: Path, max_ids: int | None = None) -> tuple[list[Sess], str]:
    from shadow.adapters.transcripts import demo_transcript, discover, load_transcript, render_turns

    shared = data / "sessions"
    found = []
    if shared.is_dir():
        for path in discover(shared):
            found.extend(load_transcript(path))
        source = (f"{shared} ({len(found)} transcripts, the first {turns} turns of each"
                  f"{'' if max_ids is None else f' holding at most {max_ids} ids'})")
    if not found:
        found, max_ids = [demo_transcript()], None
        source = f"shadow/data/demo (no sessions under {data})"
    rendered = []
    for tr in found:
        if len(rendered) >= n:
            break
        tt = render_turns(tr, indices=range(min(turns, len(tr.requests))))
        kept = [(list(t.prompt_ids), list(t.output_ids)) for t in tt
                if max_ids is None or len(t.prompt_ids) + len(t.output_ids) <= max_ids]
        if kept:
            rendered.append(kept)
    if not rendered:
        raise SystemExit(f"no turn of {source} holds at most {max_ids} ids")
    return [Sess(f"soak-{i:02d}", rendered[i % len(rendered)]) for i in range(n)], source
