"""The router journal's ids, written as differences and read back exactly (no model: the writer is
driven with a stand-in for the shadow's answer, the reader with the lines it wrote)."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

from shadow.adapters.router import RouterQuestion, RouterShadow, ids_sha256
from shadow.adapters.router_journal import read_journal, rebuild_ids
from shadow.core.records import Answer


class _Position:
    def __init__(self, n: int) -> None:
        self.committed, self.length = n, n


class _Asked:
    """What ``RouterShadow`` calls on a shadow: its position and ``ask`` (the reader is not under test)."""

    grid = 64

    def __init__(self) -> None:
        self.n = 0

    def position(self, session: str) -> _Position:
        return _Position(self.n)

    def ask(self, session: str, question: Any, choices: list[str], at: int | None = None) -> Answer:
        return Answer(session, "A", {"A": 0.75, "B": 0.25}, 0, 1.0)


def _ask(router: RouterShadow, shadow: _Asked, session: str, prompt: list[int]) -> None:
    shadow.n = len(prompt)
    router._ask(shadow, RouterQuestion(session, f"r{len(prompt)}", "A or B?", ["A", "B"], "B", len(prompt), 0,
                                       0.0, len(prompt), fresh=True, ids=array("I", prompt)))


def test_ids_written_as_differences_come_back_exactly(tmp_path: Path) -> None:
    journal = tmp_path / "shadow.jsonl"
    router = RouterShadow(journal, clock=lambda: 1.0, bases=1)
    sh = _Asked()
    a = list(range(1000, 1300))
    prompts = [("s", a[:100]), ("s", a[:250]), ("s", a[:50] + [7, 8, 9]),  # grows, then a rollback
               ("t", a[:30]), ("s", a[:60])]  # t pushes s out of the router's memory (bases=1)
    for session, prompt in prompts:
        _ask(router, sh, session, prompt)
    raw = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [x["ids"]["keep"] for x in raw] == [0, 100, 50, 0, 0]
    lines = read_journal(journal)
    ids, why = rebuild_ids(lines)
    assert why == {} and [ids[n] for n in range(1, 6)] == [p for _, p in prompts]

    # A line whose ids were altered is refused by its SHA-256, and so are the session's lines that keep ids of it.
    raw[1]["ids"]["add"][0] += 1
    journal.write_text("".join(json.dumps(x) + "\n" for x in raw))
    ids, why = rebuild_ids(read_journal(journal))
    assert sorted(ids) == [1, 4, 5] and "do not match its ids_sha256" in why[2]
    assert why[3] == "line 3 keeps 50 ids of line 2, which could not be rebuilt"
    assert ids_sha256(ids[5]) == raw[4]["ids_sha256"]
