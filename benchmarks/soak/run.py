"""Soak: a real ``shadow serve`` on loopback for a set time, fed as hosts would feed it, with the
disk full for a while, one kill -9 and restart, and every live session checked bit for bit at the end.

    python -m benchmarks.soak --minutes 60 --out benchmarks/results/soak.json
    python -m benchmarks.soak --minutes 3 --turns 2 --max-ids 4000   # the short form, in CI
                                                       # (tests/benchmarks/test_soak.py)

- The model: the demo checkpoint (random weights, the real vocabulary) written to a working folder;
  CPU, float32. The sessions: up to ``--sessions`` real timelines rendered from ../shared/data, else
  from tests/data's subset (the first turns of each transcript, reused under other names when there
  are fewer), or the demo session shipped in shadow/data/demo when ``--data`` holds none.
- ``--threads`` threads each own some sessions and drive them through the HTTP host routes
  (arrived, started, first-token, round-ended, finished) or the feeding routes, with asks, holds
  and deletes mixed in, under a tiny cap (``--cap-mib``) so that sessions are parked all the time.
- Disk full from 40 % of the run for ``--disk-full-s``: RLIMIT_FSIZE lowered to 1 KiB on the server
  process (``prlimit``; CPython ignores SIGXFSZ, so every park write fails with EFBIG), then lifted.
- At 70 %: kill -9 of the server, and a restart on the same port and park folder. The feeding
  threads pause from the kill until the model is loaded again (calls in flight at the kill fail as
  ``connection``).
- A monitor reads status every 2 s: resident + dropped bytes against the cap, the process's RSS.
- At the end: each live session is fed its whole ids as a prompt (as a host's next turn would),
  asked once (which brings it back and so parks it again), the server stopped (a planned stop
  parks what is resident), and a facade loaded in this process over the same park folder
  restores each session as the server parked it and compares every tensor with ``fresh_state``
  of the ids the server read (``torch.equal``); its ids must equal what the soak fed.

The report (JSON, and a summary on stdout): operations by route, errors by kind, 5xx, the cap's
peak against its limit, the server's peak RSS and its slope after warm-up per process life, the
restart time, and the end check. The RSS per process life: its peak, its least-squares slope after
the first quarter (warm-up) and over the second half, and the median of each quarter.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.common import environment, keep_newest, sessions_folder  # noqa: E402
from benchmarks.soak.rss import quarters, slope  # noqa: E402
from benchmarks.soak.sessions import Sess, load_sessions  # noqa: E402
from shadow.api.client import ShadowClient, ShadowHTTPError  # noqa: E402
from shadow.core.session import first_difference  # noqa: E402

QUESTION = "Is the agent done? A: yes, B: no."
ROUND_IDS = 64
MAX_ROUNDS = 8  # per turn: the rest of the output comes with finished


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ops: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.mu = threading.Lock()
        self.go = threading.Event()  # set while the server is up and loaded
        self.stop = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.samples: list[dict[str, Any]] = []  # the monitor's
        self.life = 0  # which server process (0, then 1 after the restart)
        self.events: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.log = open(work / "server.log", "ab")  # noqa: SIM115 (open for the whole run)
        self.model = work / "model"
        from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint

        write_checkpoint(self.model, demo_text_config(), dtype=torch.float32, seed=0)
        self.env = {**os.environ, "QWEN38_SHADOW_MODEL": str(self.model), "QWEN38_SHADOW_DIR": str(work / "dir"),
                    "QWEN38_SHADOW_DISK": str(work / "disk"), "QWEN38_SHADOW_GB": repr(args.cap_mib / 1024),
                    "QWEN38_SHADOW_DEVICE": "cpu", "QWEN38_SHADOW_DTYPE": "float32",
                    "QWEN38_SHADOW_GRID": str(args.grid), "QWEN38_SHADOW_PORT": str(self.port)}

    # ---- the server ------------------------------------------------------------------------

    def start_server(self) -> float:
        t = time.monotonic()
        env, cmd = self.env, [sys.executable, "-m", "shadow.cli", "serve"]
        if self.args.memory_log:  # the same server, with a sampler of where its memory goes
            env = {**env, "SHADOW_MEMORY_LOG": str(self.work / f"memory-{self.life}.jsonl"),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))}
            cmd = [sys.executable, "-m", "benchmarks.probes.server_memory", "serve"]
        self.proc = subprocess.Popen(cmd, cwd=self.work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        with ShadowClient(self.url, timeout=10) as c:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}: see {self.work / 'server.log'}")
                try:
                    if c.status().slot.state == "loaded":
                        break
                except (httpx.HTTPError, ShadowHTTPError):
                    pass
                time.sleep(0.2)
        self.go.set()
        return time.monotonic() - t

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        """The server's output to a log written by this process, which no RLIMIT_FSIZE limits."""
        assert proc.stdout is not None
        for line in proc.stdout:
            self.log.write(line)
            self.log.flush()

    def event(self, what: str, **kw: Any) -> None:
        self.events.append({"t_s": round(time.monotonic() - self.t0, 1), "event": what, **kw})
        print(f"[{time.monotonic() - self.t0:7.1f} s] {what} {kw if kw else ''}", flush=True)

    def disk_full(self, on: bool) -> None:
        assert self.proc is not None
        _, hard = resource.prlimit(self.proc.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(self.proc.pid, resource.RLIMIT_FSIZE, (1024 if on else hard, hard))
        self.event("disk full" if on else "disk no longer full", method="RLIMIT_FSIZE 1 KiB (EFBIG)")

    def kill_and_restart(self) -> None:
        assert self.proc is not None
        self.go.clear()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.event("kill -9", pid=self.proc.pid)
        with self.mu:
            self.life += 1
        took = self.start_server()
        self.event("restarted and loaded", seconds=round(took, 1), pid=self.proc.pid)

    # ---- the hosts ---------------------------------------------------------------------------

    def call(self, route: str, fn: Any, *a: Any, **kw: Any) -> Any:
        with self.mu:
            self.ops[route] += 1
        try:
            return fn(*a, **kw)
        except ShadowHTTPError as e:
            with self.mu:
                self.errors[f"{route} {e.status_code}"] += 1
            raise
        except httpx.HTTPError as e:
            with self.mu:
                self.errors[f"{route} connection ({type(e).__name__})"] += 1
            raise

    def host(self, index: int, mine: list[Sess]) -> None:
        rng = random.Random(index)
        with ShadowClient(self.url, timeout=120) as c:
            while not self.stop.is_set():
                self.go.wait()
                s = rng.choice(mine)
                try:
                    self.step(c, rng, s)
                except ShadowHTTPError as e:
                    if e.status_code == 404:  # forgotten (the cap, or a delete): the next turn feeds it whole
                        s.lost = True
                except httpx.HTTPError:
                    s.lost = True  # the kill: what it held is its last park; the next prompt brings it up to date
                    time.sleep(0.2)

    def step(self, c: ShadowClient, rng: random.Random, s: Sess) -> None:
        roll = rng.random()
        if roll < 0.03:
            if not s.lost:
                self.call("delete", c.forget, s.name)
            s.ids, s.at, s.lost = [], 0, True
            return
        if roll < 0.15 and s.ids and not s.lost:
            self.call("ask", c.ask, s.name, QUESTION, ["A", "B"])
            return
        if roll < 0.22:
            hold = self.call("hold", c.add_hold, 30.0)
            time.sleep(rng.random() * 0.2)
            self.call("release", c.release_hold, hold)
            return
        prompt, output = s.turns[s.at]
        s.at = (s.at + 1) % len(s.turns)
        if s.at == 0:  # the timeline starts over: a new session under the same name
            if not s.lost:
                self.call("delete", c.forget, s.name)
            s.ids, s.lost = [], True
        if roll < 0.32:  # the feeding routes
            s.lost = True
            self.call("feed/prompt", c.feed_prompt, s.name, prompt)
            s.ids, s.lost = list(prompt), False
            if output:
                self.call("feed/output", c.feed_output, s.name, output)
                s.ids += output
            return
        rid = uuid.uuid4().hex
        self.call("arrived", c.arrived, rid)
        try:
            s.lost = True
            self.call("started", c.started, rid, s.name, ids=prompt)
            s.ids, s.lost = list(prompt), False
            self.call("first-token", c.first_token, rid)
            rounds = [output[i:i + ROUND_IDS] for i in range(0, len(output), ROUND_IDS)]
            for r in rounds[:MAX_ROUNDS]:
                self.call("round-ended", c.round_ended, rid, r)
                s.ids += r
            rest = [t for r in rounds[MAX_ROUNDS:] for t in r]
            self.call("finished", c.finished, rid, rest)
            s.ids += rest
        except (ShadowHTTPError, httpx.HTTPError):
            with contextlib.suppress(ShadowHTTPError, httpx.HTTPError):  # an open request keeps the idle window shut
                c.finished(rid, [])
            raise

    # ---- the monitor -------------------------------------------------------------------------

    def monitor(self) -> None:
        with ShadowClient(self.url, timeout=30) as c:
            while not self.stop.is_set():
                self.stop.wait(2.0)
                if not self.go.is_set():
                    continue
                try:
                    st = c.status()
                except (httpx.HTTPError, ShadowHTTPError):
                    continue
                store = st.store
                if store is None or store.cap_bytes is None:
                    continue
                self.samples.append({"t_s": time.monotonic() - self.t0, "life": self.life,
                                     "held": store.resident_bytes + store.dropped_bytes,
                                     "cap": store.cap_bytes, "rss": store.rss_bytes,
                                     "forgotten": store.forgotten, "park_failures": store.park_failures,
                                     "sessions": len(st.sessions)})

    # ---- the end -------------------------------------------------------------------------------

    def settle(self, sessions: list[Sess]) -> None:
        """Each live session fed its whole ids (a host's next turn does) and asked once (which brings
        it back, so that the cap parks it again): a planned stop then leaves every one on disk."""
        with ShadowClient(self.url, timeout=600) as c:
            for s in sessions:
                if s.ids:
                    self.call("feed/prompt", c.feed_prompt, s.name, s.ids)
                    self.call("ask", c.ask, s.name, QUESTION, ["A", "B"])
                    s.lost = False

    def stop_server(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(600)

    def check(self, sessions: list[Sess]) -> dict[str, Any]:
        """A facade in this process over the same park folder: every live session restored as the
        server parked it and compared with a fresh prefill of the ids the server read (its committed
        prefix), tensor by tensor (torch.equal); its ids must be what the soak fed."""
        from shadow.container import build_container
        from shadow.core.settings import ShadowSettings

        s = ShadowSettings(_env_file=None, model=str(self.model), disk=str(self.work / "disk"),
                           gb=self.args.cap_mib / 1024, device="cpu", dtype="float32", grid=self.args.grid,
                           dir=str(self.work / "dir"))
        sh = build_container(s).shadow()
        live = [x for x in sessions if x.ids]
        failures: list[str] = []
        equal = ids_read = ids_held = 0
        for x in live:
            if x.name not in sh.sessions():
                failures.append(f"{x.name}: not on disk after the planned stop")
                continue
            ids = list(sh.session_ids(x.name))  # restores it: the state as the server parked it
            if ids != x.ids:
                failures.append(f"{x.name}: holds {len(ids)} ids, the soak fed {len(x.ids)} "
                                f"(first difference at {first_difference(ids, x.ids)})")
                continue
            read = sh.position(x.name).committed
            got, want = sh.export_state(x.name), sh.fresh_state(ids[:read])
            bad = [k for k in want if k not in got or not torch.equal(got[k], want[k])]
            if bad or got.keys() != want.keys():
                failures.append(f"{x.name}: {bad[:3]} differ from a fresh prefill")
                continue
            ids_read += read
            ids_held += len(ids)
            equal += 1
            sh.park(x.name)
        refused = list(sh.disk.refused) if sh.disk is not None else []
        sh.close()
        return {"live_sessions": len(live), "equal_to_fresh_prefill": equal, "failures": failures,
                "ids_held": ids_held, "ids_read_by_the_server": ids_read,
                "compared": "each session's parked state (the server's reading) against fresh_state of the "
                            "ids it read (its committed prefix), every tensor, torch.equal",
                "refused_files_at_load": refused}

    # ---- the run -------------------------------------------------------------------------------

    def run(self, sessions: list[Sess], source: str) -> dict[str, Any]:
        total = self.args.minutes * 60
        self.at_start = environment()  # the commit the server runs (and re-imports at the restart)
        took = self.start_server()
        self.event("server loaded", seconds=round(took, 1), pid=self.proc.pid if self.proc else None)
        mine: list[list[Sess]] = [[] for _ in range(self.args.threads)]
        for i, s in enumerate(sessions):
            mine[i % self.args.threads].append(s)
        threads = [threading.Thread(target=self.host, args=(i, m), daemon=True) for i, m in enumerate(mine) if m]
        threads.append(threading.Thread(target=self.monitor, daemon=True))
        for t in threads:
            t.start()
        plan = [(0.4 * total, lambda: self.disk_full(True)),
                (0.4 * total + min(self.args.disk_full_s, 0.2 * total), lambda: self.disk_full(False)),
                (0.7 * total, self.kill_and_restart)]
        for at, act in plan:
            self.stop.wait(max(0.0, self.t0 + at - time.monotonic()))
            act()
        self.stop.wait(max(0.0, self.t0 + total - time.monotonic()))
        self.stop.set()
        self.go.set()
        for t in threads:
            t.join(180)
        self.event("feeding stopped")
        self.settle(sessions)
        code = self.stop_server()
        self.event("server stopped", exit=code)
        end = self.check(sessions)
        self.event("checked", equal=end["equal_to_fresh_prefill"], of=end["live_sessions"])
        return self.report(sessions, source, end, code)

    def report(self, sessions: list[Sess], source: str, end: dict[str, Any], code: int) -> dict[str, Any]:
        held = [x["held"] for x in self.samples]
        cap = self.samples[0]["cap"] if self.samples else None
        lives = {}
        for life in sorted({x["life"] for x in self.samples}):
            pts = [(x["t_s"], x["rss"]) for x in self.samples if x["life"] == life and x["rss"]]
            warm = pts[len(pts) // 4:]  # after the first quarter of the process's life: warm-up
            lives[f"process {life}"] = {"rss_peak_mib": round(max(r for _, r in pts) / 2**20, 1) if pts else None,
                                        "rss_slope_mib_per_hour_after_warmup": slope(warm),
                                        "samples": len(pts),
                                        "rss_slope_mib_per_hour_second_half": slope(pts[len(pts) // 2:]),
                                        "rss_median_mib_by_quarter": quarters(pts)}
        five = sum(n for k, n in self.errors.items() if k.split()[-1].isdigit() and int(k.split()[-1]) >= 500)
        return {
            **self.at_start,
            "device": "cpu",
            "machine": self.args.machine,
            "minutes": self.args.minutes, "sessions": len(sessions), "threads": self.args.threads,
            "sessions_from": source, "grid": self.args.grid, "cap_mib": self.args.cap_mib,
            "disk_full": {"method": "RLIMIT_FSIZE lowered to 1 KiB on the server process (EFBIG on every write)",
                          "seconds": min(self.args.disk_full_s, 0.2 * self.args.minutes * 60)},
            "events": self.events,
            "operations": dict(sorted(self.ops.items())), "operations_total": sum(self.ops.values()),
            "errors": dict(sorted(self.errors.items())), "errors_5xx": five,
            "cap": {"limit_bytes": cap, "peak_held_bytes": max(held) if held else None,
                    "samples_over_limit": sum(1 for h in held if cap is not None and h > cap),
                    "samples": len(held), "held": "resident_bytes + dropped_bytes, from status every 2 s"},
            "forgotten": max((x["forgotten"] for x in self.samples), default=0),
            "park_failures_peak": max((x["park_failures"] for x in self.samples), default=0),
            "rss": lives, "server_exit_at_planned_stop": code, "end": end,
            **({"memory": self.memory()} if self.args.memory_log else {}),
        }

    def memory(self) -> dict[str, Any]:
        """Per process life, the sampler's line after warm-up (a quarter in) beside its last one."""
        out: dict[str, Any] = {}
        for path in sorted(self.work.glob("memory-*.jsonl")):
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            if len(lines) >= 2:
                out[f"process {path.stem.split('-')[1]}"] = {"after_warmup": lines[len(lines) // 4],
                                                             "last": lines[-1], "lines": len(lines)}
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--threads", type=int, default=10)
    ap.add_argument("--turns", type=int, default=8, help="turns taken from each transcript")
    ap.add_argument("--max-ids", type=int, default=None, help="leave out turns of more ids (a short run's end check)")
    ap.add_argument("--cap-mib", type=float, default=4.0, help="GB cap of the server, MiB (tiny: parking all the time)")
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--disk-full-s", type=float, default=60.0)
    ap.add_argument("--data", default=str(sessions_folder().parents[1]),
                    help="the data folder holding sessions/ (default: ../shared/data, else tests/data)")
    ap.add_argument("--work", default="", help="working folder (default: a temporary one)")
    ap.add_argument("--out", default="", help="where the JSON report goes (the one there moves to history/)")
    ap.add_argument("--memory-log", action="store_true",
                    help="run the server under benchmarks/probes/server_memory.py (malloc, objects) and report it")
    ap.add_argument("--machine", default="", help="the machine and what else ran on it (the report's machine)")
    args = ap.parse_args(argv)
    sessions, source = load_sessions(args.sessions, args.turns, Path(args.data), args.max_ids)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        soak = Soak(args, work)
        try:
            out = soak.run(sessions, source)
        finally:
            if soak.proc is not None and soak.proc.poll() is None:
                soak.proc.kill()
    text = json.dumps(out, indent=1)
    if args.out:
        keep_newest(Path(args.out))
        Path(args.out).write_text(text + "\n")
    print(json.dumps({k: out[k] for k in ("operations_total", "errors", "errors_5xx", "cap", "rss", "end")}, indent=1))
    return out


if __name__ == "__main__":
    main()
