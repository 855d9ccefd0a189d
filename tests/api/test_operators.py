"""What an operator's tools read: ``/metrics`` parsed by prometheus_client's own parser, its names
against the list below, its counters equal to the service's own counts after the shipped real
session is replayed (parked and restored on a tiny cap, a parked file corrupted and refused);
``/health`` and ``/ready`` (503 before the model is loaded and warmed, 200 after); the token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from shadow.adapters.timeline import replay_timeline
from shadow.adapters.transcripts import demo_transcript, render_turns
from shadow.api.app import BASE, create_app
from shadow.api.operators import BASE as OPERATORS_BASE
from shadow.api.server import BackgroundServer
from tests.conftest import FakeClock, make_container, make_settings

LOCAL = "http://127.0.0.1"
GRID = 256  # the tiny model reads a 256-row chunk per id faster than a 64-row one on the CPU

# Every name /metrics serves (counters with their _total), kept here so a rename is a decision.
NAMES = {
    "shadow_chunks_total", "shadow_ids_read_total", "shadow_ids_reread_total", "shadow_rollbacks_total",
    "shadow_parks_total", "shadow_restores_total", "shadow_parked_files_refused_total",
    "shadow_ration_seconds_total", "shadow_narrator_seconds_total", "shadow_questions_total",
    "shadow_narrations_total", "shadow_proxy_turns_total", "shadow_proxy_render_mismatches_total",
    "shadow_sessions", "shadow_resident_bytes", "shadow_resident_cap_bytes", "shadow_disk_bytes",
    "shadow_backlog_ids", "shadow_model_loaded",
    "shadow_store_parks_total", "shadow_store_park_failures_total", "shadow_store_restores_total",
    "shadow_store_parks_refused_total", "shadow_stale_parks_refused_total", "shadow_leases_lost_total",
    "shadow_store_up", "shadow_sessions_unshared",
    "shadow_behind_at_turn_start_ids", "shadow_chunk_seconds", "shadow_question_seconds", "shadow_park_seconds",
    "shadow_restore_seconds",
}


def scrape(client: Any, path: str = "/metrics") -> dict[str, Any]:
    """``{family name (counters with _total): family}`` from prometheus_client's text parser."""
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {}
    for f in text_string_to_metric_families(r.text):
        families[f.name + "_total" if f.type == "counter" else f.name] = f
    return families


def sample(families: dict[str, Any], name: str, suffix: str = "", **labels: str) -> float:
    """One sample's value (0 when the series is absent); counters: ``name`` ends in _total."""
    fam = families[name]
    want = (name if fam.type == "counter" else name + suffix)
    got = [s.value for s in fam.samples if s.name == want and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) <= 1, (name, labels, got)
    return got[0] if got else 0.0


def test_the_operators_paths_are_in_the_openapi_document(checkpoint: Path, tmp_path: Path) -> None:
    assert OPERATORS_BASE == BASE
    c = make_container(make_settings(checkpoint, tmp_path))
    with TestClient(create_app(c, start_idle_loop=False), base_url=LOCAL) as client:
        paths = client.get("/schema/openapi.json").json()["paths"]
    for p in ("/metrics", "/health", "/ready", "/"):
        assert "get" in paths[p] and "get" in paths[BASE + (p if p != "/" else "")], p
    assert set(paths["/ready"]["get"]["responses"]) >= {"200", "503"}


def test_ready_is_503_with_the_reason_until_the_model_is_loaded_and_warmed(checkpoint: Path, tmp_path: Path) -> None:
    c = make_container(make_settings(checkpoint, tmp_path))
    with TestClient(create_app(c, start_idle_loop=False), base_url=LOCAL) as client:
        for path in ("/ready", BASE + "/ready"):
            r = client.get(path)
            assert r.status_code == 503 and r.json() == {"ready": False, "state": "empty",
                                                         "reason": "the model is not loaded yet"}
        assert client.get("/health").json() == {"status": "ok"} and client.get(BASE + "/health").status_code == 200
        assert sample(scrape(client), "shadow_model_loaded") == 0
        c.service().idle_step()  # the idle window loads the model and warms it up
        for path in ("/ready", BASE + "/ready"):
            r = client.get(path)
            assert r.status_code == 200 and r.json()["ready"] is True and r.json()["state"] == "loaded"
        assert sample(scrape(client), "shadow_model_loaded") == 1


def test_ready_says_why_when_the_shadow_is_off(tmp_path: Path) -> None:
    c = make_container(make_settings("", tmp_path))
    with TestClient(create_app(c, start_idle_loop=False), base_url=LOCAL) as client:
        r = client.get("/ready")
    assert r.status_code == 503 and "QWEN38_SHADOW_MODEL is empty" in r.json()["reason"]


def test_after_a_real_session_the_counters_equal_the_services_own_counts(checkpoint: Path, tmp_path: Path) -> None:
    clock = FakeClock()
    # a cap far below one session: every use ends with a park, every next use restores
    settings = make_settings(checkpoint, tmp_path, grid=GRID, gb=1e-6, disk=str(tmp_path / "parked"))
    c = make_container(settings, clock)
    svc = c.service()
    turns = render_turns(demo_transcript())
    with TestClient(create_app(c, start_idle_loop=False), base_url=LOCAL) as client:
        svc.idle_step()
        reports = replay_timeline(svc, "demo", turns, GRID, speed=1.0, sleep=clock.advance, now=clock)
        # output after the last turn (the ration may have read every turn's ids): the idle window's to read
        svc.feed_output("demo", list(range(1_000, 1_000 + 2 * GRID)))
        while svc.idle_step():  # the gap after the session: the idle window catches up
            pass
        svc.ask("demo", "Did the agent finish? A: yes, B: no. Answer with the letter.", ["A", "B"])
        st = svc.status()
        m = scrape(client)

        assert set(m) == NAMES
        session = st.sessions["demo"]
        w = st.windows
        assert session.where == "parked" and session.backlog < GRID
        assert sample(m, "shadow_chunks_total", window="idle") == w.idle.chunks > 0
        assert sample(m, "shadow_chunks_total", window="ration") == w.ration.chunks > 0
        assert sample(m, "shadow_chunks_total", window="ask") == 0  # nothing left to read when asked
        assert sample(m, "shadow_ids_read_total") == session.committed + session.reread
        assert sample(m, "shadow_rollbacks_total") == session.rollbacks
        assert sample(m, "shadow_ids_reread_total") == session.reread
        assert sample(m, "shadow_ration_seconds_total") == pytest.approx(w.ration.spent_ms / 1e3)
        assert sample(m, "shadow_chunk_seconds", "_count", window="idle") == w.idle.chunks
        parks, restores = sample(m, "shadow_parks_total"), sample(m, "shadow_restores_total")
        assert parks > 1 and parks - restores == 1  # the one session is parked now
        assert sample(m, "shadow_park_seconds", "_count") == parks
        assert sample(m, "shadow_restore_seconds", "_count") == restores
        assert sample(m, "shadow_questions_total") == len(st.answers) == 1
        assert sample(m, "shadow_question_seconds", "_count") == 1
        # one turn start each, fresh ones (less than one chunk behind) in the bucket at grid - 1
        assert sample(m, "shadow_behind_at_turn_start_ids", "_count") == len(reports) == len(turns)
        assert sample(m, "shadow_behind_at_turn_start_ids", "_bucket", le=f"{GRID - 1}.0") == \
            sum(r.fresh for r in reports)
        assert sample(m, "shadow_behind_at_turn_start_ids", "_sum") == sum(r.behind_at_start for r in reports)
        # the gauges: what the facade holds now
        assert sample(m, "shadow_sessions", where="parked") == 1 and sample(m, "shadow_sessions", where="resident") == 0
        assert sample(m, "shadow_backlog_ids") == st.backlog
        assert sample(m, "shadow_disk_bytes") == session.bytes_on_disk > 0
        assert sample(m, "shadow_resident_bytes") == st.store.resident_bytes == 0
        assert sample(m, "shadow_resident_cap_bytes") == st.store.cap_bytes

        # a parked file altered on disk: refused (checksum), removed, and the session read again
        [parked] = list(c.disk().root.glob("*.safetensors"))
        data = bytearray(parked.read_bytes())
        data[-1] ^= 0xFF
        parked.write_bytes(bytes(data))
        committed = session.committed
        svc.ask("demo", "Did the agent finish? A: yes, B: no. Answer with the letter.", ["A", "B"])
        st = svc.status()
        m2 = scrape(client)
    session = st.sessions["demo"]
    assert sample(m2, "shadow_parked_files_refused_total", reason="checksum") == 1
    assert sum(s.value for s in m2["shadow_parked_files_refused_total"].samples) == 1
    assert sample(m2, "shadow_restores_total") == restores  # refused: not a restore
    # the file held the session's ids (README, "Every byte counted or bounded"): refused, the session is
    # empty until the host's next prompt feeds it again, so the question had nothing of it to read
    assert (session.ids, session.committed) == (0, 0) and committed > 0
    assert sample(m2, "shadow_chunks_total", window="ask") == 0
    assert sample(m2, "shadow_ids_read_total") == sample(m, "shadow_ids_read_total")


def test_the_token_guards_metrics_and_metrics_public_opens_them_on_loopback(checkpoint: Path, tmp_path: Path) -> None:
    for public in (False, True):
        c = make_container(make_settings(checkpoint, tmp_path, token="s3cret", metrics_public=public))
        with BackgroundServer(create_app(c, start_idle_loop=False)) as server, httpx.Client(base_url=server.url) as h:
            # open from loopback with METRICS_PUBLIC (/ready then says 503: no model loaded), else 401
            want = {"/metrics": 200, BASE + "/metrics": 200, "/health": 200, "/ready": 503} if public else \
                dict.fromkeys(("/metrics", BASE + "/metrics", "/health", "/ready"), 401)
            assert {p: h.get(p).status_code for p in want} == want
            assert h.get(BASE + "/status").status_code == 401  # the rest stays guarded either way
            authed = {"Authorization": "Bearer s3cret"}
            assert h.get("/metrics", headers=authed).status_code == 200
            assert h.get(BASE + "/status", headers={"Cookie": "shadow_token=s3cret"}).status_code == 200
            assert h.get(BASE + "/status", headers={"Cookie": "shadow_token=wrong"}).status_code == 401
            assert h.get("/").status_code == 200  # the page holds no data: it asks for the token


def test_the_proxy_serves_them_under_the_shadows_prefix_and_leaves_the_rest_to_the_engine(
        checkpoint: Path, tmp_path: Path) -> None:
    from shadow.proxy import create_proxy_app

    c = make_container(make_settings(checkpoint, tmp_path))
    with BackgroundServer(create_proxy_app("http://127.0.0.1:9", c)) as server, \
            httpx.Client(base_url=server.url) as h:
        assert h.get(BASE + "/health").json() == {"status": "ok"}
        assert h.get(BASE + "/ready").status_code in (200, 503)  # the idle loop may have loaded it already
        assert "shadow_model_loaded" in scrape(h, BASE + "/metrics")
        assert h.get(BASE).headers["content-type"].startswith("text/html")
        for engines in ("/metrics", "/health", "/"):  # the engine's own (here: none to reach)
            assert h.get(engines).status_code == 502, engines


def test_the_docs_and_the_dashboard_name_only_metrics_that_exist() -> None:
    import json
    import re

    from tests.conftest import REPO

    docs = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    assert {n for n in NAMES if f"`{n}" not in docs} == set()  # every metric has its line
    dashboard = json.loads((REPO / "docs" / "grafana-shadow.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for e in exprs for n in re.findall(r"shadow_\w+", e)}
    assert used <= NAMES and len(used) >= 8, used - NAMES
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for wanted in ("fresh", "backlog", "device share", "parks", "refused"):
        assert wanted in titles


def test_every_refusal_of_a_parked_file_has_a_bounded_reason() -> None:
    import re

    from shadow.backends.stores import disk
    from tests.conftest import REPO

    stores = REPO / "shadow" / "backends" / "stores"
    source = (stores / "disk.py").read_text(encoding="utf-8")
    parked = (stores / "parked.py").read_text(encoding="utf-8")
    # every message the store refuses with (its own, and the parked-file format's), but the identity
    # check's, which starts with its key
    starts = [m for m in re.findall(r'_refuse\(path, f?"([^"]*)"', source) + re.findall(r'Refused\(f?"([^"]*)"', parked)
              if not m.startswith("{key}")]
    identity = [f"{key} is 'x', this reader has 'y'" for key in ("format", "weights_hash", "grid", "dtype")]
    reasons = {disk.refusal_reason(m) for m in starts + identity}
    assert len(starts) >= 7 and "other" not in reasons
    assert reasons == {"unreadable", "format", "weights", "grid", "dtype", "metadata", "checksum", "not_last_park",
                       "session", "vocabulary", "model"}
