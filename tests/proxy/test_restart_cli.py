"""``shadow proxy`` restarted as a user restarts it (the CLI in a child process, SIGINT, the same
folders): a conversation without ``X-Session-Id`` keeps its name across the restart, another one
started after it gets its own, and the first continues from its parked state, exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from shadow.adapters.transcripts import render_turns
from shadow.api.server import BackgroundServer
from shadow.core.session import first_difference
from shadow.core.settings import PREFIX
from tests.conftest import GRID, make_container, make_settings, wait_until
from tests.proxy.conftest import TOOLS, chat_body, session_of, stream_chat
from tests.proxy.engine import free_port
from tests.proxy.upstream import ScriptedUpstream, key

STATUS = "/v1/conductor/shadow/status"


def _start(checkpoint: Path, tmp_path: Path, upstream: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(PREFIX)}
    env.update({PREFIX + "MODEL": str(checkpoint), PREFIX + "DEVICE": "cpu", PREFIX + "DTYPE": "float32",
                PREFIX + "GRID": str(GRID), PREFIX + "DISK": str(tmp_path / "disk"), PREFIX + "DIR": str(tmp_path),
                PREFIX + "IDLE_POLL_S": "0.05"})
    proc = subprocess.Popen([sys.executable, "-m", "shadow.cli", "proxy", "--upstream", upstream, "--port", str(port),
                             "--engine", "transformers", "--log-level", "warning"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "proxy.log", "ab"))  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"

    def loaded() -> bool:
        assert proc.poll() is None, (tmp_path / "proxy.log").read_text()
        try:
            return bool(httpx.get(url + STATUS, timeout=2).json()["slot"]["state"] == "loaded")
        except httpx.TransportError:
            return False
    wait_until(loaded, "shadow proxy to load its model", 120.0)
    return proc, url


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0


def _turn(client: httpx.Client, url: str, req: Any) -> dict[str, Any]:
    status, _ = stream_chat(client, url, chat_body(req), {})
    assert status == 200

    def idle() -> bool:
        return bool(client.get(url + "/v1/conductor/proxy/status").json()["in_flight"] == 0
                    and client.get(url + STATUS).json()["host"]["running"] == 0)
    wait_until(idle, "the turn to finish", 60.0)
    sessions: dict[str, Any] = client.get(url + STATUS).json()["sessions"]
    return sessions


@pytest.mark.slow  # two starts of a child process that loads torch and the model (about a minute)
def test_the_cli_proxy_restarted_keeps_a_headerless_conversations_name(
        shared_data: Path, checkpoint: Path, tmp_path: Path) -> None:
    path, (ia, ib), _ = TOOLS
    a, b = session_of(shared_data, path, ia), session_of(shared_data, path, ib)
    upstream = BackgroundServer(ScriptedUpstream({key(r.messages): r.response for t in (a, b) for r in t.requests}),
                                lifespan="off")
    upstream.start()
    turns = render_turns(a, indices=range(3))
    try:
        proc, url = _start(checkpoint, tmp_path, upstream.url)
        try:
            with httpx.Client(timeout=120.0) as client:
                _turn(client, url, a.requests[0])
                (name,) = _turn(client, url, a.requests[1])
        finally:
            _stop(proc)  # a planned stop: the session is parked, the index is on disk
        proc, url = _start(checkpoint, tmp_path, upstream.url)
        try:
            with httpx.Client(timeout=120.0) as client:
                after_b = _turn(client, url, b.requests[0])
                assert set(after_b) - {name} and after_b[name]["where"] == "parked"
                restored = after_b[name]
                final = _turn(client, url, a.requests[2])
        finally:
            _stop(proc)
    finally:
        upstream.stop()
    want = turns[2].prompt_ids + turns[2].output_ids
    assert final[name]["ids"] == len(want)
    differs = first_difference(turns[1].prompt_ids + turns[1].output_ids, turns[2].prompt_ids)
    assert differs is not None
    again = restored["committed"] - max(c for c in restored["checkpoints"] if c <= differs)
    assert (final[name]["rollbacks"], final[name]["reread"]) == (1, again)  # what any run reads again
    # the parked state, read back in this process: equal to a fresh prefill of its ids
    container = make_container(make_settings(checkpoint, tmp_path, disk=str(tmp_path / "disk")))
    service = container.service()
    service.start()
    try:
        wait_until(lambda: service.slot.state == "loaded", "the model to load")
        with service.hold():
            assert list(service.live.session_ids(name)) == want
            got, fresh = service.live.export_state(name), service.live.fresh_state(want)
        assert got.keys() == fresh.keys() and all(got[k].equal(fresh[k]) for k in fresh)
    finally:
        service.stop()
