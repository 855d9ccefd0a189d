"""What the narrator keeps is bounded: the books of requests whose thoughts wait (one whose host
never finished it stayed for the life of the process) and each session's count of thoughts (kept
for every session ever narrated, forgotten or not)."""

from __future__ import annotations

from pathlib import Path

from shadow.adapters.narrator import Narrator
from shadow.adapters.tokens import THINK_END
from shadow.core.records import TurnTimeline
from shadow.core.slot import ModelSlot
from tests.conftest import ids, make_container, make_settings


def _thought(n: Narrator, request_id: str, session: str) -> None:
    assert n.output(TurnTimeline(request_id, session=session), session, 100, [5, THINK_END, 7]) == 1


def test_requests_that_never_finish_keep_at_most_max_turns_books() -> None:
    n = Narrator(ModelSlot(None, wanted=False), "Say what the agent just did.", max_turns=8)
    for i in range(100):  # each one's host went away before finished
        _thought(n, f"r{i}", "s")
    st = n.status()
    assert st.waiting == 8 and st.skipped == {"request_gone": 92}
    assert n.waiting("r99") == 1 and n.waiting("r91") == 0  # the newest are kept
    n.step(TurnTimeline("r99", session="s"), final=True)  # a turn that finishes still ends as before
    assert n.status().waiting == 7 and n.status().skipped["not_loaded"] == 1


def test_a_forgotten_sessions_thoughts_are_counted_afresh() -> None:
    n = Narrator(ModelSlot(None, wanted=False), "Say what the agent just did.")
    for i in range(3):
        _thought(n, f"r{i}", "s")
    n.forget("s")
    _thought(n, "r9", "s")
    assert [t.number for t in n._turns["r9"].waiting] == [1]


def test_the_service_tells_the_narrator_a_session_is_forgotten(checkpoint: Path, tmp_path: Path) -> None:
    c = make_container(make_settings(checkpoint, tmp_path, narrator="on"))
    svc, told = c.service(), []
    assert svc.narrator is not None
    svc.narrator.forget = told.append  # type: ignore[method-assign]
    svc.idle_step()  # the model loads in the idle window
    assert c.slot().state == "loaded"
    for name in ("deleted", "capped"):
        svc.feed_prompt(name, ids(50))
    svc.forget("deleted")  # a DELETE
    svc.live.forget("capped")  # the facade's own (its cap, MAX_SESSIONS)
    assert told == ["deleted", "capped"]
