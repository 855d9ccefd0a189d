"""The proxy against llama.cpp's real server (llama-cpp-python), as issue 56 tried it: a script, not a
CI test, because llama-cpp-python built from source took 47 minutes on the 2-core machine. The
recipe is in docs/proxy.md; results go to benchmarks/README.md.

The proxy runs in this process, with the shadow's settings taken from the environment
(``QWEN38_SHADOW_MODEL`` and the rest); the engine runs in a child process. The steps:

1. a real session's first turns through the proxy without ``X-Session-Id``;
2. a planned restart of the proxy on the same folders, then the session's next turns: it must keep
   its name and continue from its parked state;
3. a turn cut by a small ``max_tokens`` (llama.cpp streams the thought as plain ``content``): the
   session must end with exactly the streamed text's ids, no ``</think>`` added;
4. a request whose chat template fails inside the stream (a system message after a user message),
   on a named session: the session must be untouched.

After each step every session's state is compared with a fresh prefill of its ids (``torch.equal``).
One JSON line of results goes to stdout; the exit status is 0 when every check held.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from shadow.adapters.tokens import get_tokens
from shadow.adapters.transcripts import load_transcript
from shadow.api.server import BackgroundServer
from shadow.container import build_container
from shadow.core.settings import ShadowSettings
from shadow.proxy import ProxyApp, create_proxy_app


def _wait(ready: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.1)


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/models", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


class Proxy:
    """The proxy and its shadow in this process, on a port of its own."""

    def __init__(self, upstream: str, disk: Path) -> None:
        settings = ShadowSettings(disk=str(disk))
        self.app: ProxyApp = create_proxy_app(upstream, build_container(settings), timeout_s=600.0, engine="llamacpp")
        self.server = BackgroundServer(self.app, server_header=False, date_header=False)
        self.server.start()
        self.url = self.server.url
        service: Any = self.app.host  # the in-process ShadowService
        self.service = service
        _wait(lambda: service.slot.state == "loaded", "the shadow's model to load", 600.0)

    def idle(self) -> None:
        service = self.service
        _wait(lambda: self.app.in_flight == 0 and service.activity.counts()[:2] == (0, 0), "the turns to end", 300.0)

    def exact(self) -> dict[str, bool]:
        """Each session: its state equal to a fresh prefill of its ids, tensor for tensor."""
        service = self.service
        sh, out = service.live, {}
        grid = self.app.settings.grid
        for name in sh.status().sessions:
            _wait(lambda n=name: sh.session_status(n).backlog < grid, "the idle window to catch up", 1200.0)
            with service.hold():
                ids = list(sh.session_ids(name))
                got, want = sh.export_state(name), sh.fresh_state(ids)
            out[name] = got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want)
        return out

    def stop(self) -> None:
        self.server.stop()


def _chat(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, str]:
    """A streamed chat completion; its status and the content it streamed."""
    text = []
    with httpx.Client(timeout=600.0) as client, client.stream(
            "POST", url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers or {}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:]).get("choices") or []:
                    text.append((c.get("delta") or {}).get("content") or "")
        return r.status_code, "".join(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True, help="a Qwen3.5 GGUF (the shadow's tokenizer)")
    ap.add_argument("--llama-python", default=sys.executable, help="a python with llama-cpp-python[server]")
    ap.add_argument("--sessions", required=True, help="a transcript file (../shared/data/sessions/raw/...)")
    ap.add_argument("--index", type=int, default=0, help="which session of the file")
    ap.add_argument("--turns", type=int, default=4, help="turns before and after the restart, each")
    ap.add_argument("--port", type=int, default=8090, help="the engine's port")
    args = ap.parse_args()

    transcript = load_transcript(Path(args.sessions))[args.index]
    requests = transcript.requests[: 2 * args.turns]
    engine_url = f"http://127.0.0.1:{args.port}"
    engine = subprocess.Popen([args.llama_python, "-m", "llama_cpp.server", "--model", args.gguf, "--host",
                               "127.0.0.1", "--port", str(args.port), "--n_ctx", "65536"])
    results: dict[str, Any] = {"gguf": args.gguf, "session": transcript.name}
    ok = True
    try:
        _wait(lambda: _up(engine_url), "llama.cpp's server to answer", 600.0)
        disk = Path(tempfile.mkdtemp(prefix="llamacpp-check-"))
        proxy = Proxy(engine_url, disk)

        def turns(reqs: list[Any]) -> None:
            for req in reqs:
                body: dict[str, Any] = {"model": "qwen", "messages": req.messages}
                if req.tools:
                    body["tools"] = req.tools
                status, _ = _chat(proxy.url, body)
                assert status == 200, status
                proxy.idle()

        turns(requests[: args.turns])
        before = proxy.app.sessions.names()
        results["before_restart"] = proxy.exact()
        proxy.stop()
        proxy = Proxy(engine_url, disk)  # the same folders: the index and the parked state are read back
        turns(requests[args.turns:])
        after = proxy.app.sessions.names()
        results["names_kept"] = set(before) <= set(after) and len(after) == len(before)
        results["after_restart"] = proxy.exact()
        line = proxy.service.live.status().sessions
        results["reread"] = {n: line[n].reread for n in after}

        cut_body = {"model": "qwen", "messages": requests[0].messages, "max_tokens": 16}
        status, text = _chat(proxy.url, cut_body, {"X-Session-Id": "cut"})
        proxy.idle()
        ids = list(proxy.service.live.session_ids("cut"))
        tokens = get_tokens()
        results["cut_fed_as_text"] = status == 200 and ids[-len(tokens.encode(text)):] == tokens.encode(text) \
            and not set(tokens.encode("</think>")) & set(ids[-len(tokens.encode(text)):])
        held = list(proxy.service.live.session_ids("cut"))
        bad = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]}
        status, _ = _chat(proxy.url, bad, {"X-Session-Id": "cut"})
        proxy.idle()
        results["failed_stream_status"] = status
        results["failed_stream_untouched"] = list(proxy.service.live.session_ids("cut")) == held
        results["exact_at_end"] = proxy.exact()
        results["counts"] = proxy.app.counts.as_dict()
        proxy.stop()
        ok = (all(results["before_restart"].values()) and all(results["after_restart"].values())
              and results["names_kept"] and results["cut_fed_as_text"] and results["failed_stream_untouched"]
              and all(results["exact_at_end"].values()))
    finally:
        engine.terminate()
        engine.wait(60)
    results["ok"] = ok
    print(json.dumps(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
