"""The Litestar app in process (lifespan included): typed bodies, clear 4xx errors, the OpenAPI
schema, the pre-load queue, profiles, holds, the narrator and the router's shadow mode."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from shadow.adapters.records import Status
from shadow.adapters.tokens import get_tokens
from shadow.api.app import create_app
from shadow.api.paths import BASE
from shadow.core.records import Answer
from shadow.core.settings import MAX_HOLD_S, ShadowSettings
from tests.conftest import GRID, FakeClock, Spans, ids, make_container, make_settings

LOCAL = "http://127.0.0.1"  # the Host the service answers to (a TestClient says testserver.local)
JSON = {"content-type": "application/json"}
QUESTION = "Did the agent finish? A: yes, B: no. Answer with the letter."


@pytest.fixture
def app_parts(checkpoint: Path, tmp_path: Path, clock: FakeClock, spans: Spans, request: pytest.FixtureRequest):
    kw: dict[str, Any] = getattr(request, "param", {})
    c = make_container(make_settings(checkpoint, tmp_path, **kw), clock, spans)
    app = create_app(c, start_idle_loop=False)  # the tests step the idle window themselves
    with TestClient(app, base_url=LOCAL) as client:
        yield client, c


def post(client: TestClient, path: str, body: Any) -> Any:
    return client.post(BASE + path, json=body)


def test_feed_ask_status_through_http(app_parts) -> None:
    client, c = app_parts
    svc = c.service()
    chat = {"messages": [{"role": "user", "content": "hi " * 200}]}
    r = post(client, "/feed/prompt", {"session": "s", "prompt": chat})
    assert r.status_code == 200 and r.json()["queued"]  # before the model loads: kept
    r = post(client, "/ask", {"session": "s", "question": QUESTION, "choices": ["A", "B"]})
    assert r.status_code == 503 and "loading" in r.json()["detail"]
    svc.idle_step()  # loads and replays
    svc.idle_step()  # reads
    st = client.get(BASE + "/status").json()
    s = st["sessions"]["s"]
    assert st["slot"]["state"] == "loaded" and s["profile"] == "default"
    assert s["committed"] == s["ids"] // GRID * GRID
    assert st["backlog"] == s["backlog"] < GRID and st["bytes"] > 0 and st["where"]["dir"]
    r = post(client, "/ask", {"session": "s", "question": QUESTION, "choices": ["A", "B"]})
    body = r.json()
    assert r.status_code == 200 and set(body["probs"]) == {"A", "B"} and body["behind"] == s["backlog"]
    assert abs(sum(body["probs"].values()) - 1) < 1e-5 and body["latency_ms"] > 0 and body["session"] == "s"
    q_ids = get_tokens().encode("<|im_start|>user\nDone? A or B<|im_end|>\n<|im_start|>assistant\n")
    assert post(client, "/ask", {"session": "s", "question": q_ids, "choices": ["A", "B"]}).status_code == 200
    assert post(client, "/feed/output", {"session": "s", "ids": ids(70)}).json()["backlog"] == s["backlog"] + 70
    st = client.get(BASE + "/status").json()
    assert [a["label"] for a in st["answers"]] == [body["label"], st["answers"][1]["label"]]
    assert st["answers"][1]["question"] == f"<{len(q_ids)} ids>"
    # the JSON is the layers' record, field for field: decoded strictly it is what the service built
    got = msgspec.json.decode(client.get(BASE + "/status").content, type=Status)
    want = svc.status()
    # the process's RSS is read anew by each status (the heap's trim thread moves it between two)
    assert got.store.rss_bytes > 0 and want.store.rss_bytes > 0
    got_store, want_store = replace(got.store, rss_bytes=0), replace(want.store, rss_bytes=0)
    assert (got.sessions, got_store, got.profiles, got.answers) == (want.sessions, want_store, want.profiles,
                                                                    want.answers)
    a, kept = msgspec.json.decode(r.content, type=Answer), svc.answers[0]
    assert (a.session, a.label, a.probs, a.behind, a.latency_ms) == (
        kept.session, kept.label, kept.probs, kept.behind, kept.latency_ms)


@pytest.mark.parametrize("app_parts", [{"max_body_kb": 4}], indirect=True)
def test_clear_4xx_errors(app_parts) -> None:
    client, c = app_parts
    c.service().idle_step()
    assert post(client, "/feed/prompt", {"session": "s", "prompt": ids(100)}).status_code == 200

    def problem(r: Any, code: int, *words: str) -> None:
        assert r.status_code == code, r.text
        body = r.json()
        assert body["status_code"] == code and all(w in body["detail"] for w in words), body

    problem(post(client, "/ask", {"session": "nope", "question": "q", "choices": ["A"]}), 404, "unknown session")
    problem(post(client, "/feed/output", {"session": "nope", "ids": [1]}), 404, "unknown session")
    problem(post(client, "/feed/output", {"session": "s", "ids": [248320]}), 400, "<= 248319")
    problem(post(client, "/feed/prompt", {"session": "s", "prompt": [-1]}), 400, ">= 0")
    problem(post(client, "/feed/prompt", {"session": "s", "prompt": []}), 400, "length >= 1")
    problem(post(client, "/feed/prompt", {"session": "s", "prompt": {"messages": []}}), 400, "length >= 1")
    problem(post(client, "/feed/prompt", {"session": "s", "prompt": {"messages": [{"role": "assistant"}]}}),
            400, "chat template")  # no user message: the template refuses
    problem(post(client, "/feed/prompt", {"session": "s", "prompt": {"messages": [{"role": "robot"}]}}), 400, "role")
    problem(post(client, "/feed/prompt", {"session": "s", "prompt": [1], "profile": "nope"}), 400,
            "unknown profile")
    problem(post(client, "/feed/prompt", {"session": "s", "prompt": [1], "colour": "red"}), 400, "colour")
    problem(post(client, "/ask", {"session": "s", "question": "q", "choices": ["A", "maybe not"]}), 400,
            "not one token")
    problem(post(client, "/ask", {"session": "s", "question": "q", "choices": ["A", "A"]}), 400, "repeat")
    problem(post(client, "/ask", {"session": "s", "question": [], "choices": ["A"]}), 400)
    problem(client.post(BASE + "/ask", content=b'{"session": "s", "question": ', headers=JSON), 400, "malformed")
    problem(client.post(BASE + "/feed/prompt", content=json.dumps({"session": "s", "prompt": [5] * 2000}),
                        headers=JSON), 413)
    problem(post(client, "/host/round-ended", {"request_id": "never", "ids": []}), 404, "unknown request")
    problem(post(client, "/host/first-token", {"request_id": "never"}), 404, "unknown request")
    problem(post(client, "/narrate", {"session": "s", "prompt": "Summarise."}), 400, "narrator is off")
    problem(client.delete(BASE + "/host/holds/hold-9"), 404, "unknown hold")
    assert post(client, "/host/arrived", {"request_id": "r"}).status_code == 200
    problem(post(client, "/host/arrived", {"request_id": "r"}), 400, "already")


def test_openapi_is_served_and_typed(app_parts) -> None:
    client, _ = app_parts
    schema = client.get("/schema/openapi.json").json()
    paths = schema["paths"]
    for p in ["/ask", "/status", "/narrate", "/feed/prompt", "/feed/output", "/host/arrived", "/host/started",
              "/host/first-token", "/host/round-ended", "/host/finished", "/host/holds", "/host/holds/{hold_id}"]:
        assert BASE + p in paths
    ask = paths[BASE + "/ask"]["post"]
    assert set(ask["responses"]) >= {"200", "400", "404", "413", "503"}
    assert sorted(schema["components"]["schemas"]["AskBody"]["required"]) == ["choices", "question", "session"]
    # The schema's bound on a hold is the one enforced: the default MAX_HOLD_S, which no setting exceeds.
    ttl = schema["components"]["schemas"]["HoldBody"]["properties"]["ttl_s"]
    assert ttl["maximum"] == MAX_HOLD_S == ShadowSettings(_env_file=None).max_hold_s == 3600
    assert post(client, "/host/holds", {"ttl_s": MAX_HOLD_S + 1}).status_code == 400
    assert post(client, "/host/holds", {"ttl_s": MAX_HOLD_S}).status_code == 201
    # one record per concept: the host verbs' turn is status' turn, each answer the core's record
    components = schema["components"]["schemas"]
    turn = components["HostStatus"]["properties"]["turns"]["items"]["$ref"]
    assert turn.endswith("/TurnTimeline") and not {"Turn", "TurnStatus", "Fed", "Rationed", "Asked"} & set(components)
    answers = {p: paths[BASE + p]["post"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
               for p in ("/ask", "/feed/prompt", "/host/arrived", "/host/round-ended", "/host/started")}
    assert {p: ref.rsplit("/", 1)[1] for p, ref in answers.items()} == {
        "/ask": "Answer", "/feed/prompt": "FeedResult", "/host/arrived": "TurnTimeline",
        "/host/round-ended": "RoundResult", "/host/started": "StartedTurn"}


def test_holds_shut_the_idle_window_over_http(app_parts) -> None:
    client, c = app_parts
    svc = c.service()
    svc.idle_step()
    post(client, "/feed/prompt", {"session": "s", "prompt": ids(4 * GRID)})
    r = post(client, "/host/holds", {"ttl_s": 30})
    assert r.status_code == 201
    hold = r.json()["hold_id"]
    assert svc.idle_step() == [] and client.get(BASE + "/status").json()["host"]["holds"] == 1
    assert client.delete(BASE + f"/host/holds/{hold}").status_code == 204
    assert len(svc.idle_step()) == 4


def profiles_file(tmp: Path) -> str:
    p = tmp / "profiles.yaml"
    p.write_text("coding:\n  shadow: {mode: on, router: shadow, router_min_tokens: 256, narrator: on}\n"
                 "chat: {}\n")
    return str(p)


def test_profiles_router_shadow_mode_and_narrator(checkpoint: Path, tmp_path: Path, clock: FakeClock,
                                                  spans: Spans) -> None:
    settings = make_settings(checkpoint, tmp_path, profiles=profiles_file(tmp_path), profile="coding")
    c = make_container(settings, clock, spans)
    with TestClient(create_app(c, start_idle_loop=False), base_url=LOCAL) as client:
        svc = c.service()
        svc.idle_step()
        chat = post(client, "/host/started", {"request_id": "c1", "session": "chat-s", "prompt": ids(300),
                                              "profile": "chat"}).json()
        assert not chat["fed"]["followed"] and chat["fed"]["reason"] == "profile"
        post(client, "/host/finished", {"request_id": "c1", "ids": [1, 2]})
        router = {"question": "Which class? A: code, B: chat. Answer with the letter.", "choices": ["A", "B"],
                  "label": "A", "fresh": True}
        tok = get_tokens()
        prompt = tok.encode("<|im_start|>user\n" + "fix the bug " * 150 + "<|im_end|>\n<|im_start|>assistant\n")
        r = post(client, "/host/started", {"request_id": "r1", "session": "s", "prompt": prompt, "router": router})
        assert r.status_code == 200 and r.json()["fed"]["followed"]
        short = post(client, "/host/started", {"request_id": "r2", "session": "s2", "prompt": ids(100),
                                                "router": router})
        assert short.status_code == 200  # under router_min_tokens: not asked
        post(client, "/host/finished", {"request_id": "r1"})
        post(client, "/host/finished", {"request_id": "r2"})
        assert client.get(BASE + "/status").json()["router"]["waiting"] == 1
        svc.idle_step()  # reads up to the insertion point, then asks
        st = client.get(BASE + "/status").json()
        rt = st["router"]
        assert rt["asked"] == 1 and rt["waiting"] == 0 and rt["compared"] == 1
        [rec] = rt["last"]
        assert rec["router_label"] == "A" and rec["agree"] == (rec["label"] == "A") and rec["insertion"] == \
            len(prompt) - 4
        assert rec["fresh"] is True and rec["choices"] == ["A", "B"] and rec["grid"] == GRID
        [line] = [json.loads(line) for line in (tmp_path / "shadow.jsonl").read_text().splitlines()]
        # the journal holds what router-eval asks again with; status keeps the rest (not the ids)
        assert line["question"] == router["question"] and line["ids"] == {"keep": 0, "add": prompt[:-4]}
        assert line == {**rec, "question": line["question"], "ids": line["ids"], "ids_sha256": line["ids_sha256"]}
        assert [s.attributes["shadow.ask.kind"] for s in spans.all("shadow.ask")] == ["router"]
        r = post(client, "/narrate", {"session": "s", "prompt": "Summarise the session in one line.",
                                      "max_new": 5})
        assert r.status_code == 200 and len(r.json()["ids"]) <= 5
        assert r.json()["text"] == get_tokens().decode(r.json()["ids"])
