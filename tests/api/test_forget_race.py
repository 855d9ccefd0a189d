"""A forget racing a read is not an error: the idle window's look at a chunk's session after the
read (its backlog, for the span) finds it gone and moves on; status keeps no UnknownSession."""

from __future__ import annotations

import threading
from pathlib import Path

from shadow.backends.schedulers.common import backlog_after
from shadow.core.plan import ReadPlan
from tests.conftest import GRID, ids, joined, make_container, make_settings, wait_until


def test_a_chunks_session_forgotten_after_the_read_has_no_backlog(checkpoint: Path, tmp_path: Path) -> None:
    sh = make_container(make_settings(checkpoint, tmp_path)).shadow()
    sh.feed_prompt("s", ids(3 * GRID))
    (chunk,) = sh.read(ReadPlan("s", max_chunks=1))
    sh.forget("s")  # what another thread may do between the read and the look after it
    assert backlog_after(sh, chunk) == 0


def test_forgets_racing_the_idle_window_leave_no_error_in_status(checkpoint: Path, tmp_path: Path) -> None:
    svc = make_container(make_settings(checkpoint, tmp_path, idle_poll_s=0.001, idle_window_s=0.05)).service()
    svc.start()
    try:
        wait_until(lambda: svc.status().slot.state == "loaded", "the model to load")
        stop = threading.Event()

        def churn(who: int) -> None:  # feed a session, let the idle window start on it, forget it: again and again
            for i in range(150):
                if stop.is_set():
                    return
                name = f"race-{who}-{i % 2}"
                svc.feed_prompt(name, ids(4 * GRID, seed=i))
                svc.forget(name)

        workers = [threading.Thread(target=churn, args=(who,)) for who in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            joined(w, "the churn", timeout_s=600)
        stop.set()
        errors = svc.status().errors
        assert not [e for e in errors if "UnknownSession" in e], errors
    finally:
        svc.stop()


def test_a_session_the_facade_forgets_on_its_own_takes_its_profile_along(checkpoint: Path, tmp_path: Path) -> None:
    svc = make_container(make_settings(checkpoint, tmp_path, max_sessions=2)).service()
    svc.start()
    try:
        wait_until(lambda: svc.status().slot.state == "loaded", "the model to load")
        for name in ("a", "b", "c"):  # c makes three: a, the least recently used, is forgotten
            svc.feed_prompt(name, ids(GRID))
        assert sorted(svc.status().sessions) == ["b", "c"]
        assert sorted(svc.turns.bookkeeping()[0]) == ["b", "c"]  # nothing per session outlives it
        store = svc.status().store
        assert store is not None and store.forgotten == 1
    finally:
        svc.stop()
