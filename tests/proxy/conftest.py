"""The proxy's test stack: a scripted upstream on loopback, the proxy with the tiny model in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shadow.adapters.transcripts import load_transcript
from shadow.adapters.transcripts.model import Transcript
from shadow.api.server import BackgroundServer
from shadow.proxy import ProxyApp, create_proxy_app
from tests.conftest import GRID, Spans, make_container, make_settings, wait_until
from tests.proxy.upstream import ScriptedUpstream, key

RAW = "sessions/raw"
REASONING = ("mini-swe-agent-gemini3-swebench/django__django-12741.traj.json", 0, 4)
TOOLS = ("openhands-examples/output.jsonl", (1, 2), 2)


def session_of(shared_data: Path, path: str, index: int) -> Transcript:
    return load_transcript(shared_data / RAW / path)[index]


def headers_of(response: httpx.Response) -> list[tuple[bytes, bytes]]:
    return [(k.lower(), v) for k, v in response.headers.raw if k.lower() != b"date"]


def chat_body(req: Any, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "qwen", "messages": req.messages, "stream": stream}
    if req.tools:
        body["tools"] = req.tools
    return body


class Stack:
    def __init__(self, proxy: ProxyApp, upstream: ScriptedUpstream, url: str, upstream_url: str,
                 spans: Spans, servers: list[BackgroundServer] | None = None) -> None:
        self.proxy, self.upstream, self.url, self.upstream_url = proxy, upstream, url, upstream_url
        self.spans = spans
        self.servers = servers or []

    def stop(self) -> None:
        """A planned stop: the proxy and its service (which parks every resident session), then the upstream."""
        for s in reversed(self.servers):
            s.stop()
        self.servers.clear()

    @property
    def service(self) -> Any:
        return self.proxy.host

    def idle(self) -> None:
        """The proxy has told the shadow every turn's end (its client may have had all bytes before)."""
        wait_until(lambda: self.proxy.in_flight == 0 and self.service.activity.counts()[:2] == (0, 0),
                   "the proxy's turns to finish", 60.0)


@pytest.fixture
def stack_of(checkpoint: Path, tmp_path: Path, spans: Spans) -> Iterator[Any]:
    servers: list[BackgroundServer] = []

    def make(transcripts: list[Transcript], engine: str = "transformers", strict: bool = False, **kw: Any) -> Stack:
        replies = {key(r.messages): r.response for t in transcripts for r in t.requests}
        upstream = ScriptedUpstream(replies, strict=strict)
        up = BackgroundServer(upstream, lifespan="off")
        up.start()
        servers.append(up)
        settings = make_settings(checkpoint, tmp_path, idle_poll_s=0.05, idle_window_s=2.0, **kw)
        proxy = create_proxy_app(up.url, make_container(settings, spans=spans), timeout_s=60.0, engine=engine)
        front = BackgroundServer(proxy, server_header=False, date_header=False)
        front.start()
        servers.append(front)
        wait_until(lambda: proxy.host.slot.state == "loaded", "the model to load")
        return Stack(proxy, upstream, front.url, up.url, spans, [up, front])

    yield make
    for s in reversed(servers):
        s.stop()


def stream_chat(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
        return r.status_code, b"".join(r.iter_raw())


def exact(stack: Stack, session: str) -> list[int]:
    """The session's ids, once its state (read to the end) equals a fresh prefill of them."""
    sh = stack.service.live
    ids = list(sh.session_ids(session))
    wait_until(lambda: sh.session_status(session).backlog < GRID, "the idle window to catch up")
    with stack.service.hold():
        got, want = sh.export_state(session), sh.fresh_state(ids)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].equal(want[name]), f"{session}: {name}"
    return ids


class RedisServer:
    def __init__(self, url: str, proc: Any) -> None:
        self.url, self.proc = url, proc

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server of its own on a free loopback port (no persistence)."""
    import shutil
    import subprocess

    import redis

    from tests.proxy.engine import free_port

    exe = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if exe is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server)")
    port = free_port()
    folder = tmp_path / "redis"
    folder.mkdir()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False
        wait_until(up, "redis-server to answer", 30.0)
        client.close()
        yield RedisServer(url, proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
