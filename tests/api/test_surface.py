"""The HTTP surface as a hostile page or client would try it, on a real server on loopback: strict
bodies, deep JSON, content types, browser origins, foreign Host headers, the bearer token, bounded
holds, bounded sessions, forgetting a session; and `shadow serve` refusing an open address bare."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shadow.api.app import create_app
from shadow.api.client import ShadowClient, ShadowHTTPError
from shadow.api.paths import BASE
from shadow.api.server import BackgroundServer, is_loopback
from shadow.cli import main
from tests.conftest import GRID, ids, make_container, make_settings, wait_until

ALLOWED = "https://ok.example"
LIMITS = dict(max_holds=2, max_hold_s=100.0, max_session_ids=3 * GRID, allowed_origins=ALLOWED + "/",
              max_arrived=500)


@pytest.fixture(scope="module")
def served(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackgroundServer, Any]]:
    settings = make_settings(checkpoint, tmp_path_factory.mktemp("surface"), idle_poll_s=0.05, **LIMITS)
    c = make_container(settings)
    with BackgroundServer(create_app(c)) as server, ShadowClient(server.url) as host:
        wait_until(lambda: host.status().slot.state == "loaded", "the model to load")
        yield server, c


def raw(server: BackgroundServer, path: str, body: bytes | str, **headers: str) -> httpx.Response:
    h = {"content-type": "application/json", **headers}
    return httpx.post(server.url + BASE + path, content=body, headers=h)


def problem(r: httpx.Response, code: int, *words: str) -> None:
    assert r.status_code == code, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert body["status_code"] == code and all(w in body["detail"] for w in words), body


def test_bodies_are_decoded_strictly_and_deep_json_is_400(served) -> None:
    server, container = served
    with ShadowClient(server.url) as host:
        host.feed_prompt("strict", ids(100))
        deep = "[" * 5000 + "]" * 5000
        problem(raw(server, "/feed/output", '{"session": "strict", "ids": ' + deep + "}"), 400)
        tools = '[{"type": "function", "x": ' + deep + "}]"
        body = '{"session": "strict", "prompt": {"messages": [{"role": "user", "content": "hi"}], "tools": ' + tools
        problem(raw(server, "/feed/prompt", body + "}}"), 400, "nested too deeply")
        problem(raw(server, "/feed/prompt", deep), 400)
        problem(raw(server, "/feed/output", '{"session": "strict", "ids": ["17"]}'), 400, "Expected `int`", "ids[0]")
        problem(raw(server, "/feed/output", '{"session": "strict", "ids": [1.5]}'), 400, "Expected `int`", "ids[0]")
        problem(raw(server, "/feed/output", '{"session": "strict", "ids": [373.0, 2.5e-1]}'), 400, "ids[1]")
        problem(raw(server, "/feed/output", '{"session": "strict", "ids": [1e300]}'), 400, "ids[0]")
        problem(raw(server, "/host/holds", '{"ttl_s": "5"}'), 400, "Expected `float`, got `str`", "ttl_s")
        problem(raw(server, "/feed/output", '{"session": "strict", "ids": [17'), 400, "malformed")
        assert host.status().sessions["strict"].ids == 100  # nothing of the refused bodies got in
        assert host.status().host.holds == 0
        assert raw(server, "/feed/output", '{"session": "strict", "ids": [17, 1000]}').status_code == 200
        # The schema says integer, and JSON Schema's integer is any number without a fraction: so does the decoder.
        assert raw(server, "/feed/output", '{"session": "strict", "ids": [373.0, 1e3]}').status_code == 200
        assert host.status().sessions["strict"].ids == 104
        assert list(container.shadow().session_ids("strict")[-4:]) == [17, 1000, 373, 1000]


def test_only_json_from_our_host_and_no_foreign_browser_origin(served) -> None:
    server, _ = served
    ok = '{"session": "origin", "prompt": [1, 2, 3]}'
    problem(raw(server, "/feed/prompt", ok, **{"content-type": "text/plain"}), 415, "application/json", "text/plain")
    problem(raw(server, "/feed/prompt", ok, **{"content-type": ""}), 415)
    problem(raw(server, "/feed/prompt", ok, origin="https://evil.example"), 403, "evil.example", "ALLOWED_ORIGINS")
    problem(raw(server, "/feed/prompt", ok, origin="null"), 403)
    problem(raw(server, "/feed/prompt", ok, host="evil.example"), 400, "evil.example")
    problem(raw(server, "/feed/prompt", ok, host=f"rebound.example:{server.port}"), 400, "rebound.example")
    r = httpx.get(server.url + BASE + "/status", headers={"host": "evil.example"})
    problem(r, 400, "evil.example")
    with ShadowClient(server.url) as host:
        assert "origin" not in host.status().sessions
    assert raw(server, "/feed/prompt", ok, origin=ALLOWED).status_code == 200
    assert raw(server, "/feed/prompt", ok, host=f"localhost:{server.port}").status_code == 200


def test_holds_are_bounded_in_count_and_time(served) -> None:
    server, _ = served
    with ShadowClient(server.url) as host:
        with pytest.raises(ShadowHTTPError) as err:
            host.add_hold(101)
        assert err.value.status_code == 400 and "QWEN38_SHADOW_MAX_HOLD_S=100" in err.value.detail
        a, b = host.add_hold(100), host.add_hold(5)
        with pytest.raises(ShadowHTTPError) as err:
            host.add_hold(5)
        assert err.value.status_code == 429 and "MAX_HOLDS" in err.value.detail
        assert host.status().host.holds == 2
        host.release_hold(a)
        c = host.add_hold(5)
        host.release_hold(b)
        host.release_hold(c)


def test_arrived_requests_are_bounded_like_holds(served) -> None:
    server, _ = served
    refused = 0
    with ShadowClient(server.url) as host:
        for i in range(2_000):  # the audit's case: any number of request ids, each shutting the idle window
            try:
                host.arrived(f"flood-{i}")
            except ShadowHTTPError as err:
                assert err.status_code == 429 and "MAX_ARRIVED" in str(err)
                refused += 1
        assert refused == 1_500 and host.status().host.waiting == 500
        host.finished("flood-0")
        host.arrived("flood-late")  # one finished: one more may arrive
        for i in range(1, 500):
            host.finished(f"flood-{i}")
        host.finished("flood-late")
        assert host.status().host.waiting == 0


def test_a_session_is_bounded_and_kept_when_a_feed_is_refused(served) -> None:
    server, _ = served
    with ShadowClient(server.url) as host:
        host.feed_prompt("long", ids(3 * GRID - 10))
        with pytest.raises(ShadowHTTPError) as err:
            host.feed_output("long", ids(11))
        assert err.value.status_code == 400 and "MAX_SESSION_IDS" in err.value.detail
        assert host.status().sessions["long"].ids == 3 * GRID - 10
        with pytest.raises(ShadowHTTPError) as err:
            host.feed_prompt("long", ids(3 * GRID + 1))
        assert err.value.status_code == 400
        assert host.status().sessions["long"].ids == 3 * GRID - 10
        host.feed_output("long", ids(10))  # up to the limit itself
        assert host.status().sessions["long"].ids == 3 * GRID


def test_delete_forgets_a_session(served) -> None:
    server, c = served
    with ShadowClient(server.url) as host:
        host.feed_prompt("gone / soon", ids(2 * GRID + 5))
        assert "gone / soon" in host.status().sessions
        host.forget("gone / soon")
        assert "gone / soon" not in host.status().sessions
        assert "gone / soon" not in c.shadow().sessions()
        with pytest.raises(ShadowHTTPError) as err:
            host.forget("gone / soon")
        assert err.value.status_code == 404 and "unknown session" in err.value.detail


def test_delete_removes_the_parked_file(checkpoint: Path, tmp_path: Path) -> None:
    disk = tmp_path / "parked"
    c = make_container(make_settings(checkpoint, tmp_path, disk=str(disk), idle_poll_s=0.05))
    with BackgroundServer(create_app(c)) as server, ShadowClient(server.url) as host:
        wait_until(lambda: host.status().slot.state == "loaded", "the model to load")
        for name, seed in (("kept", 1), ("gone", 2)):
            host.feed_prompt(name, ids(2 * GRID + 5, seed))
        # each session to its last whole chunk: with one chunk still pending, the idle window would
        # bring the session back to read it right after it is parked
        wait_until(lambda: all(s.backlog < GRID for s in host.status().sessions.values()), "both read")
        c.shadow().park("kept")
        [kept] = list(disk.rglob("*.safetensors"))
        c.shadow().park("gone")
        [gone] = set(disk.rglob("*.safetensors")) - {kept}
        assert host.status().sessions["gone"].where == "parked"
        host.forget("gone")
        assert not gone.exists() and kept.exists()  # its file, on disk, and only its
        assert "gone" not in host.status().sessions and host.status().sessions["kept"].where == "parked"


def test_the_token_guards_every_endpoint(checkpoint: Path, tmp_path: Path) -> None:
    settings = make_settings(checkpoint, tmp_path, token="s3cret-token")
    with BackgroundServer(create_app(make_container(settings))) as server:
        for path in [BASE + "/status", "/schema/openapi.json"]:
            problem(httpx.get(server.url + path), 401, "no bearer token")
            problem(httpx.get(server.url + path, headers={"authorization": "Bearer wrong"}), 401, "wrong")
        problem(raw(server, "/feed/prompt", '{"session": "t", "prompt": [1]}'), 401)
        assert httpx.get(server.url + BASE + "/status").headers["www-authenticate"] == "Bearer"
        # the token in its own header (what a client behind `shadow proxy` sends) serves as well
        assert httpx.get(server.url + BASE + "/status", headers={"x-shadow-token": "s3cret-token"}).status_code == 200
        problem(httpx.get(server.url + BASE + "/status", headers={"x-shadow-token": "wrong"}), 401, "X-Shadow-Token")
        with ShadowClient(server.url, token="s3cret-token") as host:
            assert host.status().slot.state in ("empty", "loading", "loaded")
            host.feed_prompt("t", [1, 2, 3])
        with ShadowClient(server.url) as bare, pytest.raises(ShadowHTTPError) as err:
            bare.status()
        assert err.value.status_code == 401


def test_serve_refuses_an_open_address_without_a_token(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QWEN38_SHADOW_TOKEN", raising=False)
    env = tmp_path / "serve.env"
    env.write_text(f"QWEN38_SHADOW_DIR={tmp_path}\n")
    assert main(["serve", "--host", "0.0.0.0", "--env-file", str(env)]) == 2
    err = capsys.readouterr().err
    assert "0.0.0.0" in err and "QWEN38_SHADOW_TOKEN" in err
    assert [is_loopback(h) for h in ["127.0.0.1", "::1", "[::1]", "localhost", "127.1.2.3"]] == [True] * 5
    assert [is_loopback(h) for h in ["0.0.0.0", "::", "10.0.0.2", "example.com"]] == [False] * 4


def test_the_client_sends_the_routers_question_typed(served) -> None:
    """``RouterAsk`` goes over the wire as the body's ``router`` and is checked there like the rest."""
    from shadow.core.records import RouterAsk

    server, _ = served
    with ShadowClient(server.url) as host:
        host.arrived("routed")
        ask = RouterAsk("Which class?", ["A", "B"], "A", True)
        turn, fed = host.started("routed", "routed", ids=ids(40), router=ask)
        assert turn.session == "routed" and fed.followed
        host.finished("routed")
        host.arrived("routed-bad")
        with pytest.raises(ShadowHTTPError, match=r"router\.choices") as bad:
            host.started("routed-bad", "routed", ids=ids(40), router=RouterAsk([1, 2], []))
        assert bad.value.status_code == 400
        host.finished("routed-bad")  # a refused start changed nothing: the request is still there to end
