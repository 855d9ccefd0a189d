"""The host interface's per-round call timed alone: ``round_ended`` with one id, 1,000 times, on a
tiny model on the CPU (no chunk is read: the ration is 0), without and then with the idle loop's
thread running, then with the thread blocked for ``--gap-ms`` before each call (as a host that
waits on the device between rounds: a call made right after the wait runs on cold caches and a
slowed core). What ``ab_cost.py`` sees a call cost beside a decoding model, less its chunks, is to
be compared with these.

    python -m benchmarks.probes.host_calls [--out DIR]      # prints; with --out writes DIR/host_calls.json
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.ab_engine import shape
from benchmarks.common import environment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--gap-ms", type=float, default=5.0, help="the wait before each call of the last runs")
    args = parser.parse_args()
    import torch

    from shadow.backends.qwen35.checkpoint import write_checkpoint
    from shadow.container import build_container
    from shadow.core.settings import ShadowSettings

    home = Path(tempfile.mkdtemp())
    write_checkpoint(home / "m", shape("tiny"), dtype=torch.float32, seed=0)
    settings = ShadowSettings(_env_file=None, model=str(home / "m"), device="cpu", dtype="float32", grid=512,
                              disk="off", gb=4, dir=str(home), trace="jsonl", trace_file=str(home / "t.jsonl"),
                              ration=0.0)
    service = build_container(settings).service()
    service.idle_step()
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 2000) for _ in range(3000)]
    result: dict[str, object] = {**environment(), "rounds": args.rounds}

    def timed(tag: str, run: int, gap_s: float = 0.0) -> float:
        rid = f"{tag}-{run}"
        service.arrived(rid)
        service.started(rid, rid, prompt)
        service.first_token(rid)
        spent = 0.0
        for _ in range(args.rounds):
            if gap_s:
                time.sleep(gap_s)
            t0 = time.perf_counter()
            service.round_ended(rid, [rng.randrange(1000, 2000)])
            spent += time.perf_counter() - t0
        us = spent / args.rounds * 1e6
        service.finished(rid)
        print(f"{tag} run {run}: {us:.1f} us a round_ended", flush=True)
        return us

    result["alone_us"] = [timed("alone", r) for r in range(3)]
    service.start()
    result["idle_loop_us"] = [timed("idle-loop", r) for r in range(3)]
    result["gap_ms"] = args.gap_ms
    result["after_gap_us"] = [timed(f"after-{args.gap_ms:g}-ms", r, args.gap_ms / 1e3) for r in range(3)]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_calls.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
