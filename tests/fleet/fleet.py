"""Instances of the shadow on one shared store: built in this process (``make``), or run as a real
separate process (``Instance``: ``python -m tests.fleet.fleet`` reads one JSON command a line on its
stdin and answers one JSON line on its stdout)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from dependency_injector import providers

from shadow import ShadowSettings
from shadow.container import build_container
from shadow.core.errors import ShadowError

REPO = Path(__file__).resolve().parents[2]
GRID = 64


def make(ckpt: Path, disk: Path, store: str, name: str, lease_s: float = 1.0, part_bytes: int = 8 * 2**20,
         cluster: bool = False, cap_mib: float = 64) -> Any:
    """A facade on ``disk`` (its own folder: another machine's disk) sharing ``store``."""
    s = ShadowSettings(_env_file=None, model=str(ckpt), device="cpu", dtype="float32", grid=GRID,
                       gb=cap_mib / 1024, disk=str(disk), disk_gb=1.0, store=store, store_cluster=cluster,
                       instance=name, lease_s=lease_s)
    c = build_container(s)
    c.store_part_bytes.override(providers.Object(part_bytes))
    return c.shadow()


def exact(sh: Any, session: str) -> bool:
    """Read what is pending, then whether every tensor equals a fresh prefill of the session's ids."""
    sh.read(session)
    got, want = sh.export_state(session), sh.fresh_state(sh.session_ids(session))
    return bool(got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want))


class Instance:
    """A shadow instance in a separate process, driven over its stdin and stdout."""

    def __init__(self, ckpt: Path, disk: Path, store: str, name: str, lease_s: float = 1.0,
                 part_bytes: int = 8 * 2**20, cluster: bool = False) -> None:
        config = json.dumps({"ckpt": str(ckpt), "disk": str(disk), "store": store, "name": name,
                             "lease_s": lease_s, "part_bytes": part_bytes, "cluster": cluster})
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fleet.fleet", config], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.name = name
        assert self.call("ping", timeout_s=300) == {"ok": True}

    def call(self, op: str, timeout_s: float = 300, **kw: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError(f"instance {self.name}: no answer to {op} in {timeout_s} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"instance {self.name} ended (exit {self.proc.wait()}) on {op}")
        return json.loads(line)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.call("close")
            self.proc.wait(60)


def _serve(config: dict[str, Any]) -> None:
    sh = make(Path(config["ckpt"]), Path(config["disk"]), config["store"], config["name"], config["lease_s"],
              config["part_bytes"], config["cluster"])
    for line in sys.stdin:
        cmd = json.loads(line)
        op, s = cmd["op"], cmd.get("s", "")
        try:
            out: Any = {"ok": True}
            if op == "feed":
                sh.feed_prompt(s, cmd["ids"])
            elif op == "output":
                sh.feed_output(s, cmd["ids"])
            elif op == "read":
                sh.read(s or None)
            elif op == "park":
                sh.park(s)
            elif op == "exact":
                out = {"exact": exact(sh, s), "committed": sh.position(s).committed, "ids": len(sh.session_ids(s))}
            elif op == "status":
                st = sh.status().store
                out = {"sharing": asdict(st.sharing) if st.sharing is not None else None, "lost": st.lost,
                       "sessions": sh.sessions()}
            elif op == "close":
                sh.close()
            elif op != "ping":
                out = {"error": "BadOp", "detail": op}
        except ShadowError as e:
            out = {"error": type(e).__name__, "detail": str(e)}
        print(json.dumps(out), flush=True)
        if op == "close":
            return


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]))
