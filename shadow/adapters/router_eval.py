"""``shadow router-eval``: the router's question asked again, offline, at the journaled insertion points.

Each session's turns are fed in the journal's order as prompts (the ids up to each insertion point,
rebuilt from the journal and checked against its SHA-256), and the question is asked at the end of
each; the state is the one a fresh prefill of those ids on the grid gives, bit for bit, as the live
shadow's was, so the live model on the live grid answers what the journal says. Turns whose ids
cannot be rebuilt, or whose question fails, are counted apart with the reason, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shadow.core.errors import ShadowError
from shadow.core.shadow import Shadow

from .router_journal import Asked, JournalLine, figures, rebuild_ids

Progress = Callable[[int, int, str], None]


@dataclass
class Evaluation:
    asked: list[Asked] = field(default_factory=list)
    skipped: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


def evaluate(lines: list[JournalLine], shadow_for: Callable[[int], Shadow], question: str | None = None,
             progress: Progress | None = None) -> Evaluation:
    """Ask each journaled turn again. ``shadow_for(grid)`` gives the shadow that reads on that grid;
    ``question``: another wording (the journaled one otherwise; the choices stay the journal's)."""
    ids, why = rebuild_ids(lines)
    ev = Evaluation()
    order: dict[str, list[JournalLine]] = {}
    for ln in lines:
        order.setdefault(ln.session, []).append(ln)
    done = 0
    for session, turns in order.items():
        used: set[Shadow] = set()
        for ln in turns:
            done += 1
            if progress is not None:
                progress(done, len(lines), session)
            if ln.line in why:
                ev.skipped.setdefault(session, []).append((ln.line, why[ln.line]))
                continue
            sh = shadow_for(ln.grid)
            used.add(sh)
            try:
                sh.feed_prompt(session, ids[ln.line])
                answer = sh.ask(session, ln.question if question is None else question, ln.choices)
            except ShadowError as err:
                ev.skipped.setdefault(session, []).append((ln.line, f"line {ln.line}: the question failed: {err}"))
                continue
            ev.asked.append(Asked(ln.line, session, ln.request_id, ln.router_label, ln.fresh, ln.live_label,
                                  answer.label, answer.probs))
        for sh in used:
            sh.forget(session)  # one session resident at a time
    return ev


def report(lines: list[JournalLine], ev: Evaluation, same_question: bool) -> dict[str, Any]:
    sessions = list(dict.fromkeys(ln.session for ln in lines))
    fig = figures(ev.asked, len(lines), sessions, ev.skipped, same_question)
    fig["turns_asked"] = [{"line": a.line, "session": a.session, "request_id": a.request_id, "host": a.host,
                           "fresh": a.fresh, "live": a.live, "shadow": a.shadow, "probs": a.probs}
                          for a in ev.asked]
    return fig
