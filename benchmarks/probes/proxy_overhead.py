"""What ``shadow proxy`` adds to a request: the time to the first byte and to the last, straight to
the engine and through the proxy, on a real turn of about 2k ids (a mini-swe-agent session's fourth
request, streamed, ``max_tokens`` 16) against ``transformers serve`` serving the tiny checkpoint on
the CPU (``tests/proxy/engine.py``), and ``shadow proxy`` in a process of its own following with the
tiny shadow (as deployed: a client in the proxy's process would share its interpreter). Requests
alternate direct / proxied, the same body each time and no X-Session-Id (the proxy finds the
session by its prompt, as for a client without the header).

    python -m benchmarks.probes.proxy_overhead [--requests 30] [--out DIR]   # needs ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import environment

SESSION = ("mini-swe-agent-gemini3-swebench/django__django-12741.traj.json", 0, 3)


def _timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for _ in r.iter_raw():
            if first is None:
                first = time.perf_counter() - t0
        assert r.status_code == 200, r.status_code
    return (first or 0.0) * 1e3, (time.perf_counter() - t0) * 1e3


def _summary(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"median_ms": statistics.median(s), "p95_ms": s[min(len(s) - 1, int(0.95 * len(s)))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--engine-threads", type=int, default=0,
                        help="the engine's torch threads (OMP_NUM_THREADS; 0: torch's default, every core)")
    args = parser.parse_args()
    import torch

    from shadow.adapters.transcripts import load_transcript, render_turns
    from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
    from tests.proxy.engine import Engine, engine_folder, free_port

    path, index, turn = SESSION
    transcript = load_transcript(Path("../shared/data/sessions/raw") / path)[index]
    req = transcript.requests[turn]
    prompt_ids = len(render_turns(transcript, indices=[turn])[0].prompt_ids)
    home = Path(tempfile.mkdtemp())
    folder = engine_folder(home / "engine")
    engine = Engine(folder, home / "serve.log", threads=args.engine_threads or None)
    engine.start()
    write_checkpoint(home / "shadow", demo_text_config(), dtype=torch.float32, seed=0)
    port = free_port()
    env = {**os.environ, "QWEN38_SHADOW_MODEL": str(home / "shadow"), "QWEN38_SHADOW_DEVICE": "cpu",
           "QWEN38_SHADOW_DTYPE": "float32", "QWEN38_SHADOW_DISK": "off", "QWEN38_SHADOW_DIR": str(home)}
    exe = Path(sys.executable).with_name("shadow")
    front = subprocess.Popen([str(exe), "proxy", "--upstream", engine.url, "--port", str(port), "--engine",
                              "transformers", "--env-file", str(home / "none.env"), "--log-level", "warning"], env=env)
    front_url = f"http://127.0.0.1:{port}"
    body = {"model": str(folder), "messages": req.messages, "tools": req.tools, "stream": True, "max_tokens": 16}
    if not req.tools:
        del body["tools"]
    times: dict[str, list[tuple[float, float]]] = {"direct": [], "proxy": []}
    try:
        with httpx.Client(timeout=300.0) as client:
            while True:
                try:
                    if client.get(front_url + "/v1/conductor/shadow/status").json()["slot"]["state"] == "loaded":
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                time.sleep(0.2)
            for url in (engine.url, front_url):  # warm both paths once
                _timed(client, url, body)
            for _ in range(args.requests):
                times["direct"].append(_timed(client, engine.url, body))
                times["proxy"].append(_timed(client, front_url, body))
    finally:
        front.terminate()
        front.wait(30)
        engine.stop()
    out: dict[str, Any] = {**environment(), "prompt_ids": prompt_ids, "requests": args.requests,
                           "engine_threads": args.engine_threads or f"torch's default ({os.cpu_count()} cores)"}
    for name, xs in times.items():
        out[name] = {"first_byte": _summary([a for a, _ in xs]), "total": _summary([b for _, b in xs])}
    out["added_median_ms"] = {k: out["proxy"][k]["median_ms"] - out["direct"][k]["median_ms"]
                              for k in ("first_byte", "total")}
    print(json.dumps({k: v for k, v in out.items() if k != "environment"}, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "proxy_overhead.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
