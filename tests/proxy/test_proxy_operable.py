"""Issue 55 on `shadow proxy`, the main deployment path, each as a test that fails on 1392d56's behaviour:

- `shadow status --url` against a proxy with a token, at its root and at its shadow prefix;
- a scraper's bearer token on the proxy's own paths (never forwarded), not on the engine's;
- the page's token cookie stripped before anything is forwarded, the other cookies kept;
- the proxy keeps relaying with the shadow off, and its readiness says why; its own liveness path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from shadow.api.app import create_app
from shadow.api.paths import BASE
from shadow.api.server import BackgroundServer
from shadow.cli import main
from shadow.proxy import create_proxy_app
from tests.conftest import make_container, make_settings, wait_until
from tests.proxy.upstream import ScriptedUpstream, key, sse_chunks, whole_body

TOKEN = "s3cret"


def test_status_url_works_against_a_proxy_with_a_token(stack_of: Any, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    stack = stack_of([], token=TOKEN)
    env = tmp_path / "serve.env"
    env.write_text(f"QWEN38_SHADOW_TOKEN={TOKEN}\n")
    monkeypatch.delenv("QWEN38_SHADOW_TOKEN", raising=False)
    for url in (stack.url, stack.url + BASE, stack.url + BASE + "/"):  # on 1392d56: 401 for both forms
        assert main(["status", "--url", url, "--env-file", str(env)]) == 0, capsys.readouterr().err
        assert "model: loaded" in capsys.readouterr().out
    env.write_text("QWEN38_SHADOW_TOKEN=wrong\n")
    assert main(["status", "--url", stack.url, "--env-file", str(env)]) == 1
    assert "401" in capsys.readouterr().err


def test_bearer_on_the_proxys_own_paths_and_the_cookie_never_reaches_the_engine(stack_of: Any) -> None:
    stack = stack_of([], token=TOKEN)
    bearer = {"authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=60.0) as client:
        # what Prometheus 2.42 can send: a bearer token (no custom header)
        for path in (BASE + "/metrics", BASE + "/ready", BASE + "/health", "/v1/conductor/proxy/status",
                     "/v1/conductor/proxy/health"):
            assert client.get(stack.url + path, headers=bearer).status_code == 200, path
        assert "shadow_chunks_total" in client.get(stack.url + BASE + "/metrics", headers=bearer).text
        # the page on the proxy reads the proxy's status with its cookie (its proxy section)
        page = {"cookie": f"shadow_token={TOKEN}"}
        assert client.get(stack.url + "/v1/conductor/proxy/status", headers=page).json()["engine"] == "transformers"
        assert client.get(stack.url + BASE + "/metrics", headers=page).status_code == 401  # not a page read
        assert stack.upstream.requests == []  # none of them went to the engine
        # a forwarded GET from the page's browser: the token cookie is the proxy's, the others the engine's
        r = client.get(stack.url + "/v1/models", headers={
            "x-shadow-token": TOKEN, "cookie": f"engine_session=abc; shadow_token={TOKEN}; theme=dark"})
        assert r.status_code == 200
    seen = stack.upstream.headers[-1]
    assert seen["cookie"] == "engine_session=abc; theme=dark"  # on 1392d56 the token went along, in clear
    assert "x-shadow-token" not in seen and TOKEN not in str(stack.upstream.raw_headers[-1])


def test_the_proxy_relays_with_the_shadow_off(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Say hi."}]
    reply = {"role": "assistant", "content": "Hi! How can I help you today?"}
    upstream = ScriptedUpstream({key(messages): reply})
    with BackgroundServer(upstream, lifespan="off") as up:
        settings = make_settings("", tmp_path)  # MODEL empty: the shadow is off
        proxy = create_proxy_app(up.url, make_container(settings), timeout_s=30.0, engine="transformers")
        with BackgroundServer(proxy, server_header=False, date_header=False) as front, \
                httpx.Client(timeout=30.0) as client:
            models = client.get(front.url + "/v1/models")
            assert models.status_code == 200 and models.content == client.get(up.url + "/v1/models").content
            ready = client.get(front.url + BASE + "/ready")
            assert ready.status_code == 503 and "the shadow is off" in ready.json()["reason"]
            assert client.get(front.url + "/v1/conductor/proxy/health").json() == {"status": "ok"}
            assert client.get(front.url + BASE + "/health").status_code == 200
            # a chat completion, whole and streamed, goes through as the engine answered it
            body = {"model": "qwen", "messages": messages}
            whole = client.post(front.url + "/v1/chat/completions", json=body)
            assert whole.status_code == 200 and whole.content == whole_body(reply)
            with client.stream("POST", front.url + "/v1/chat/completions", json={**body, "stream": True}) as r:
                assert r.status_code == 200 and b"".join(r.iter_raw()) == b"".join(sse_chunks(reply))


def test_a_proxy_following_another_process_passes_its_own_token_on(checkpoint: Path, tmp_path: Path) -> None:
    """With ``--shadow URL`` the shadow's paths go to that service: the client's credentials (a bearer
    token, the page's cookie) are checked by the proxy and not passed on; the proxy sends its own."""
    serve_settings = make_settings(checkpoint, tmp_path / "serve", token=TOKEN)
    upstream = ScriptedUpstream({})
    with BackgroundServer(create_app(make_container(serve_settings))) as serve, \
            BackgroundServer(upstream, lifespan="off") as up:
        proxy = create_proxy_app(up.url, make_container(make_settings("", tmp_path / "proxy", token=TOKEN)),
                                 timeout_s=30.0, engine="transformers", shadow_url=serve.url)
        with BackgroundServer(proxy) as front, httpx.Client(timeout=30.0) as client:
            for headers in ({"authorization": f"Bearer {TOKEN}"}, {"x-shadow-token": TOKEN},
                            {"cookie": f"shadow_token={TOKEN}"}):
                r = client.get(front.url + BASE + "/status", headers=headers)
                assert r.status_code == 200 and "slot" in r.json(), (headers, r.text)
            assert client.get(front.url + BASE + "/status").status_code == 401
            assert client.get(front.url + BASE + "/status", headers={"authorization": "Bearer no"}).status_code == 401


def test_a_proxy_whose_shadow_service_is_down_still_relays(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Say hi."}]
    reply = {"role": "assistant", "content": "Hi!"}
    with BackgroundServer(ScriptedUpstream({key(messages): reply}), lifespan="off") as up:
        proxy = create_proxy_app(up.url, make_container(make_settings("", tmp_path)), timeout_s=30.0,
                                 engine="transformers", shadow_url="http://127.0.0.1:9")  # nothing listens there
        with BackgroundServer(proxy) as front, httpx.Client(timeout=30.0) as client:
            r = client.post(front.url + "/v1/chat/completions", json={"model": "qwen", "messages": messages})
            assert r.status_code == 200 and r.content == whole_body(reply)
            assert client.get(front.url + BASE + "/ready").status_code == 502  # the shadow's paths: its own
            assert client.get(front.url + "/v1/conductor/proxy/health").status_code == 200
            # the turn's following stops as the shadow refuses the connection (the client had its answer)
            status = front.url + "/v1/conductor/proxy/status"
            wait_until(lambda: client.get(status).json()["counts"]["not_followed"] == {"shadow_error": 1},
                       "the turn to be counted not followed")
