"""Run a document's own commands, as an operator would copy and paste them.

Every fenced ``bash`` block right after a ``<!-- run -->`` line is run, in order, in one bash
(``set -euo pipefail``) in a fresh folder; what a block starts in the background is stopped at the
end. ``shadow`` on the PATH is this checkout's (``python -m shadow.cli``), ``$MODEL`` the
checkpoint folder given, ``$ENGINE`` a small OpenAI-shaped engine on a loopback port that this
script starts (``/v1/models``, ``/health``; a stand-in for vLLM, which the docs' commands only ask
for its models). Exit status: the script's.

    python tools/doc_commands.py docs/operations.md --model PATH
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- run -->\s*\n```bash\n(.*?)```", re.S)


def blocks(doc: Path) -> list[str]:
    return BLOCK.findall(doc.read_text(encoding="utf-8"))


class _Engine(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "qwen", "object": "model", "owned_by": "docs"}]})
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._json(404, {"error": "not found"})

    def _json(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def run(doc: Path, model: str, timeout_s: float) -> int:
    found = blocks(doc)
    if not found:
        print(f"{doc}: no block marked <!-- run -->", file=sys.stderr)
        return 2
    engine = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="doc-commands-") as tmp:
        folder = Path(tmp)
        bin_dir = folder / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "shadow"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "from shadow.cli import main; '
                        f'raise SystemExit(main())" "$@"\n')
        shim.chmod(0o755)
        script = ("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n"
                  + "\n".join(f"echo '--- block {i + 1}'\n{b}" for i, b in enumerate(found)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("QWEN38_SHADOW_")}
        env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", PYTHONPATH=str(REPO), MODEL=model,
                   ENGINE=f"http://127.0.0.1:{engine.server_address[1]}",
                   QWEN38_SHADOW_DIR=str(folder / "home"), QWEN38_SHADOW_DISK="off")
        for key in ("QWEN38_SHADOW_DEVICE", "QWEN38_SHADOW_DTYPE", "QWEN38_SHADOW_GRID"):
            if key in os.environ:  # the caller's choice for a small machine (cpu, float32, a small grid)
                env[key] = os.environ[key]
        try:
            done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"{doc}: the commands took longer than {timeout_s:g} s", file=sys.stderr)
            return 1
        finally:
            engine.shutdown()
    print(f"{doc}: {len(found)} blocks, exit {done.returncode}")
    return done.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("doc", type=Path)
    ap.add_argument("--model", required=True, help="the checkpoint folder the commands use as $MODEL")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    return run(args.doc, args.model, args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
