"""How long Python's collector stops a serving process, with and without what is loaded frozen
(``gc.freeze`` after a collection, as a server would once its model is warm): the 64-agent replay
of ``benchmarks/concurrency.py`` (the service's own schedulers and facade on a simulated clock, a
reader that costs the read_rate file's time) run in two child processes that import what ``shadow
serve`` imports, one of them freezing before the replay. Per child: a full collection's time right
after the imports, then every collection during the replay by generation (count, total and longest
ms, from ``gc.callbacks``). CPU only; the two children run at once.

    python -m benchmarks.probes.gc_pauses --raw ../shared/data/sessions/raw --out DIR   # DIR/gc_pauses.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import environment, result_path

RATE_FILE = Path(__file__).resolve().parents[1] / "results" / "read_rate-h100.json"


def _child(args: argparse.Namespace) -> dict[str, Any]:
    import gc

    import torch  # noqa: F401  # what a serving process holds: torch, triton, the reader and the server

    with contextlib.suppress(ImportError):
        import triton  # noqa: F401
    import shadow.api.app
    import shadow.backends.reader
    import shadow.container  # noqa: F401
    from benchmarks import concurrency

    def timed_collect() -> float:
        t0 = time.perf_counter()
        gc.collect()
        return (time.perf_counter() - t0) * 1e3

    out: dict[str, Any] = {"freeze": args.freeze, "tracked": len(gc.get_objects()),
                           "full_collect_ms": [timed_collect() for _ in range(3)]}
    if args.freeze:
        gc.collect()
        gc.freeze()
        out["frozen"] = gc.get_freeze_count()
        out["full_collect_ms_frozen"] = [timed_collect() for _ in range(3)]
    pauses: list[tuple[int, float]] = []
    started: list[float] = []

    def on_collect(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        else:
            pauses.append((info["generation"], (time.perf_counter() - started.pop()) * 1e3))

    gc.callbacks.append(on_collect)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        concurrency.main(["--raw", args.raw, "--agents", str(args.agents), "--policies", args.policy,
                          "--rate-file", str(args.rate_file), "--no-plot", "--out", f"{scratch}/replay.json"])
        replay = json.loads(Path(scratch, "replay.json").read_text())
    gc.callbacks.remove(on_collect)
    out["replay_wall_s"] = time.perf_counter() - t0
    out["replay_rows"] = replay["rows"]
    out["collections"] = {str(g): {"count": sum(1 for x, _ in pauses if x == g),
                                   "total_ms": sum(ms for x, ms in pauses if x == g),
                                   "longest_ms": max((ms for x, ms in pauses if x == g), default=0.0)}
                          for g in range(3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", required=True, help="the real sessions (../shared/data/sessions/raw)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--policy", default="device:8:spans:gather8/1000")
    ap.add_argument("--rate-file", type=Path, default=RATE_FILE)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--freeze", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    base = [sys.executable, "-m", "benchmarks.probes.gc_pauses", "--child", "--raw", args.raw, "--agents",
            str(args.agents), "--policy", args.policy, "--rate-file", str(args.rate_file)]
    runs = {arm: subprocess.Popen(base + (["--freeze"] if arm == "frozen" else []), stdout=subprocess.PIPE, text=True)
            for arm in ("plain", "frozen")}
    arms = {}
    for arm, proc in runs.items():
        stdout, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"the {arm} child failed ({proc.returncode})")
        arms[arm] = json.loads(stdout.strip().splitlines()[-1])
        print(arm, {g: {k: round(v, 1) for k, v in c.items()} for g, c in arms[arm]["collections"].items()})
    path = result_path(args.out, "gc_pauses.json")
    path.write_text(json.dumps({"probe": "gc_pauses", **environment(), "agents": args.agents, "policy": args.policy,
                                "rate_file": args.rate_file.name, "arms": arms}, indent=1) + "\n")
    print("->", path)


if __name__ == "__main__":
    main()
