"""Two ``shadow proxy`` + ``transformers serve`` pairs behind a real router (Debian's nginx, hashing
``X-Session-Id``), sharing one Redis: a session keeps to one pair; when that pair is killed (kill -9,
the proxy and its engine), the router sends the next turn to the other pair, which takes the lease once
it expires and restores the session from the store, and its state is exactly a fresh prefill of its ids."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from shadow.core.settings import PREFIX
from tests.conftest import GRID, make_container, make_settings, wait_until
from tests.proxy.engine import Engine, engine_folder

from .router import NGINX, Router
from .servers import RedisNode, free_port, need_redis

STATUS = "/v1/conductor/shadow/status"
LEASE_S = 2.0
SESSION = "failover-1"
# a user's long first message (a few grid chunks of ids), then short follow-ups
FIRST = ("Here is the repository layout and the failing test; read it and tell me where to start.\n"
         + "\n".join(f"src/module_{i}.py: def handler_{i}(request): return process(request, retries={i})"
                     for i in range(40)))
FOLLOW_UPS = ["Now look at module 7 again.", "And what about the retries?", "Summarise what we found."]


class Pair:
    """One ``transformers serve`` and one ``shadow proxy`` (the CLI, its shadow in process) in front of it."""

    def __init__(self, name: str, folder: Path, tmp: Path, store: str) -> None:
        self.name, self.tmp = name, tmp / name
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.engine = Engine(folder, self.tmp / "serve.log", threads=1)
        self.folder, self.store = folder, store
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(PREFIX)}
        env.update({PREFIX + "MODEL": str(self.folder), PREFIX + "DEVICE": "cpu", PREFIX + "DTYPE": "float32",
                    PREFIX + "GRID": str(GRID), PREFIX + "DISK": str(self.tmp / "disk"),
                    PREFIX + "DIR": str(self.tmp), PREFIX + "IDLE_POLL_S": "0.05", PREFIX + "STORE": self.store,
                    PREFIX + "LEASE_S": str(LEASE_S), PREFIX + "INSTANCE": self.name,
                    # below one session: each is parked (to the disk and the store) as soon as its use ends
                    PREFIX + "GB": "0.0001", "OMP_NUM_THREADS": "1"})
        return env

    def start(self) -> None:
        self.engine.start()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shadow.cli", "proxy", "--upstream", self.engine.url, "--port", str(self.port),
             "--engine", "transformers", "--log-level", "warning"], cwd=self.tmp, env=self.env(),
            stdout=subprocess.DEVNULL, stderr=open(self.tmp / "proxy.log", "ab"))  # noqa: SIM115

        def loaded() -> bool:
            assert self.proc is not None and self.proc.poll() is None, (self.tmp / "proxy.log").read_text()[-3000:]
            try:
                return bool(httpx.get(self.url + STATUS, timeout=2).json()["slot"]["state"] == "loaded")
            except httpx.TransportError:
                return False
        wait_until(loaded, f"{self.name}'s shadow proxy to load its model", 180.0)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = httpx.get(self.url + STATUS, timeout=30).json()
        return out

    def idle(self) -> None:
        def quiet() -> bool:
            proxy = httpx.get(self.url + "/v1/conductor/proxy/status", timeout=30).json()
            return bool(proxy["in_flight"] == 0 and self.status()["host"]["running"] == 0)
        wait_until(quiet, f"{self.name}'s turns to finish", 120.0)

    def kill(self) -> None:
        """kill -9 of the pair: no park, no release; its lease runs out in the store."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        if self.engine.proc is not None:
            self.engine.proc.kill()
            self.engine.proc.wait()

    def stop(self) -> None:
        """A planned stop (SIGINT): every resident session parked, its lease let go."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(120)
        self.engine.stop()


def _turn(client: httpx.Client, folder: Path, messages: list[dict[str, str]]) -> str:
    body = {"model": str(folder), "messages": messages, "max_tokens": 8, "stream": True}
    text = []
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": SESSION}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def _holder(pairs: list[Pair]) -> Pair:
    held = [p for p in pairs if SESSION in p.status()["sessions"]]
    assert len(held) == 1, [p.name for p in held]
    return held[0]


@pytest.mark.slow  # two real engines and two shadow processes on the CPU (a few minutes on 2 cores)
def test_a_killed_pair_s_session_is_restored_from_the_store_by_the_other_exactly(tmp_path: Path) -> None:
    need_redis()
    if NGINX is None:
        pytest.skip("nginx is not installed (Debian's package nginx; .ci/run installs it)")
    folder = engine_folder(tmp_path / "qwen35-tiny")
    redis = RedisNode(tmp_path / "redis").start()
    pairs = [Pair(n, folder, tmp_path, redis.url) for n in ("pair-a", "pair-b")]
    router: Router | None = None
    try:
        for p in pairs:
            p.start()
        router = Router(tmp_path / "nginx", [f"127.0.0.1:{p.port}" for p in pairs])
        router.start()
        messages = [{"role": "user", "content": FIRST}]
        with router.client() as client:
            for follow in FOLLOW_UPS[:2]:  # two turns: both on the pair the hash picked
                messages.append({"role": "assistant", "content": _turn(client, folder, messages)})
                holder = _holder(pairs)
                holder.idle()
                messages.append({"role": "user", "content": follow})
            other = next(p for p in pairs if p is not holder)
            assert SESSION not in other.status()["sessions"]  # the session kept to one pair
            before = holder.status()["sessions"][SESSION]
            killed_at = time.monotonic()
            holder.kill()
            # the dead pair's lease runs out (a turn on the other pair before then is relayed, not
            # followed: its shadow answers 409 naming the holder; the next turn's whole prompt catches up)
            leases = redis.client()
            wait_until(lambda: not list(leases.scan_iter(match="*:lease")), "the dead pair's lease to run out",  # type: ignore[attr-defined]
                       LEASE_S + 30.0)
            lease_gone_s = time.monotonic() - killed_at
            # the next turn: nginx finds the dead pair's port closed and passes the request to the other
            messages.append({"role": "assistant", "content": _turn(client, folder, messages)})
            other.idle()
            failover_s = time.monotonic() - killed_at
        line = other.status()["sessions"][SESSION]
        assert line["ids"] > before["ids"] and line["committed"] >= before["committed"]
        metrics = httpx.get(other.url + "/v1/conductor/shadow/metrics", timeout=30).text
        restores = sum(float(m.split()[-1]) for m in metrics.splitlines()
                       if m.startswith("shadow_store_restores_total"))
        assert restores >= 1  # restored from the store's parts, not read again from the start
        print(f"failover: the lease gone {lease_gone_s:.2f} s after the kill (LEASE_S {LEASE_S}), the next turn "
              f"finished on {other.name} {failover_s:.2f} s after it; {restores:g} restores from the store")
        other.stop()  # parks what it holds, so that this process can restore it and compare
    finally:
        if router is not None:
            router.stop()
        for p in pairs:
            p.kill()
    # the survivor's state, restored here from its disk: exactly a fresh prefill of its ids
    settings = make_settings(folder, tmp_path / other.name, disk=str(other.tmp / "disk"), store=redis.url,
                             instance="checker")
    container = make_container(settings)
    service = container.service()
    service.start()
    try:
        wait_until(lambda: service.slot.state == "loaded", "the model to load")
        with service.hold():
            ids = list(service.live.session_ids(SESSION))
            got, fresh = service.live.export_state(SESSION), service.live.fresh_state(ids)
        assert got.keys() == fresh.keys() and all(got[k].equal(fresh[k]) for k in fresh)
    finally:
        service.stop()
        redis.kill()
