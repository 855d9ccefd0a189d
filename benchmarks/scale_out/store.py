"""One session parked and restored through a real Redis on loopback, against the local disk and against
reading it again (``python -m benchmarks.scale_out store``).

    python -m benchmarks.scale_out store --out DIR                                    # CPU: the tiny model
    python -m benchmarks.scale_out store --out DIR --model 0.8B --ids 32768 --device cuda --dtype bfloat16 \\
        --redis-server /path/to/redis-server                                          # the GPU machine

The script starts ``redis-server`` (``--redis-server``: the binary, for a machine that carries it as an
unpacked Debian package) on a free loopback port with persistence off, and stops it at the end. A
session of ``--ids`` random ids is read on the grid (random weights at the model's published shape, or
the tests' tiny model), then, ``--repeat`` times:

- the local disk: A parks and restores from its own file (the page cache);
- Redis, through the store (``STORE=redis://``, ``shadow/backends/stores/tiered.py``): instance A parks
  (its disk, then Redis in parts of at most 8 MB under a manifest), instance B, on a disk of its own, is
  fed the session's ids and takes it from Redis; then B parks and A takes it back the same way;
- after each restore the state is ``torch.equal`` to a fresh prefill of the ids (``compare``);
- the store's rate: random bytes of ``--transfer-bytes`` (default: a 32k session of the 0.8B, 442 MB)
  in 8 MB parts under a SHA-256 manifest (redis-py, the store's form), each way: a tiny model's park is
  too small to time a rate by.

Reading again: the same ids read on the grid again (after a warm read); on a GPU its wall
is the device's time. A restore's device time: the host-to-device copy of the park's tensors (the
session's CPU state moved to the device, synchronised), against that read.

Writes ``DIR/scale_out_store.json`` (``DIR/scale_out_store-gpu.json`` on a GPU) with ``rates``: the
store's rate the fleet replay uses (``redis_restore_GBps``: the transfer's bytes over its fetch and
check) and ``host_to_device_GBps``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
import torch

from benchmarks.common import environment, keep_newest
from shadow import Shadow, ShadowSettings, build_shadow
from shadow.adapters.replay import compare
from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.backends.qwen35.config import reference_shape

from .members import state_bytes

PART = 8 * 2**20  # the store's largest value (Redis caps one at 512 MB, and a large one blocks its thread)
VOCAB = 248_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_server(binary: str, folder: Path) -> Iterator[redis.Redis]:
    """A redis-server of its own on loopback, persistence off; a client to it."""
    if shutil.which(binary) is None and not Path(binary).is_file():
        raise SystemExit(f"no redis-server at {binary!r}: give --redis-server PATH")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder), "--protected-mode", "yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
    try:
        for _ in range(200):
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise SystemExit(f"{binary} did not answer on port {port}")
        yield client
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=30)


def put(client: redis.Redis, key: str, data: bytes, generation: int) -> None:
    """Parts first (each checked by its SHA-256 in the manifest), then the manifest."""
    parts = [data[i:i + PART] for i in range(0, len(data), PART)]
    pipe = client.pipeline(transaction=False)
    for i, part in enumerate(parts):
        pipe.set(f"{key}:part:{generation}:{i}", part)
    pipe.execute()
    manifest = {"generation": generation, "bytes": len(data),
                "parts": [hashlib.sha256(p).hexdigest() for p in parts]}
    client.set(f"{key}:manifest", json.dumps(manifest))


def get(client: redis.Redis, key: str) -> bytes:
    """The parked bytes, every part checked against the manifest; raises on a part missing or wrong."""
    raw = client.get(f"{key}:manifest")
    if raw is None:
        raise LookupError(f"{key}: no manifest")
    manifest = json.loads(raw)
    pipe = client.pipeline(transaction=False)
    for i in range(len(manifest["parts"])):
        pipe.get(f"{key}:part:{manifest['generation']}:{i}")
    parts = pipe.execute()
    for i, (part, want) in enumerate(zip(parts, manifest["parts"], strict=True)):
        if part is None or hashlib.sha256(part).hexdigest() != want:
            raise ValueError(f"{key}: part {i} missing or wrong")
    data = b"".join(parts)
    if len(data) != manifest["bytes"]:
        raise ValueError(f"{key}: {len(data)} bytes, the manifest says {manifest['bytes']}")
    return data


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def to_device(state: dict[str, torch.Tensor], device: str) -> list[torch.Tensor]:
    return [t.to(device) for t in state.values()]


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def measure_transfer(client: redis.Redis, size: int, repeat: int) -> dict[str, Any]:
    """Random bytes of a park's size through the same parts and manifest, each way: the store's rate."""
    data = os.urandom(size)
    puts, gets = [], []
    key = "bench:{transfer}"
    for g in range(repeat):
        puts.append(timed(functools.partial(put, client, key, data, g), "cpu"))
        client.delete(*[f"{key}:part:{g - 1}:{i}" for i in range(-(-size // PART))])  # the generation before
        t0 = time.perf_counter()
        got = get(client, key)
        gets.append(time.perf_counter() - t0)
        assert got == data
        del got
    client.delete(*client.keys("bench:*"))
    return {"bytes": size, "put_s": puts, "get_s": gets, "put_GBps": size / median(puts) / 1e9,
            "get_GBps": size / median(gets) / 1e9}


def instance(ckpt: Path, work: Path, name: str, url: str, args: argparse.Namespace) -> Shadow:
    """A shadow on a disk of its own (another machine's), sharing the store at ``url``."""
    return build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device=args.device, dtype=args.dtype,
                                       grid=args.grid, gb=256, disk=str(work / f"disk-{name}"), disk_gb=256,
                                       store=url, instance=name))


def exact(sh: Shadow, session: str, fresh: dict[str, torch.Tensor]) -> bool:
    return bool(compare(sh.export_state(session), fresh)[0])


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    config = demo_text_config() if args.model == "tiny" else reference_shape(args.model)
    ckpt = write_checkpoint(work / f"qwen35-{args.model}-random", config,
                            dtype=torch.float32 if args.dtype == "float32" else torch.bfloat16, seed=0)
    rng = random.Random(0)
    ids = [rng.randrange(VOCAB) for _ in range(args.ids)]
    warm = [rng.randrange(VOCAB) for _ in range(4 * args.grid)]
    rows: dict[str, list[float]] = {k: [] for k in ("park_s", "redis_restore_s", "disk_restore_s")}
    checks: list[bool] = []
    with redis_server(args.redis_server, work) as client:
        url = f"redis://127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"
        a, b = instance(ckpt, work, "A", url, args), instance(ckpt, work, "B", url, args)
        a.feed_prompt("warm", warm)
        a.read("warm")
        a.forget("warm")
        reads = []
        for i in range(args.repeat_read):  # the session read again (the last reading kept)
            if i:
                a.forget("s")
            a.feed_prompt("s", ids)
            reads.append(timed(functools.partial(a.read, "s"), args.device))
        fresh = a.fresh_state(ids)
        committed = a.position("s").committed
        checks.append(exact(a, "s", fresh))
        state = a.export_state("s")
        state_bytes = sum(t.numel() * t.element_size() for t in state.values())
        copies = [timed(functools.partial(to_device, state, args.device), args.device) for _ in range(args.repeat)]
        del state
        for _ in range(args.repeat):
            for holder, other in ((a, b), (b, a)):
                # the holder parks (its disk, then the store), the other takes the session from the store
                rows["park_s"].append(timed(functools.partial(holder.park, "s"), args.device))
                rows["redis_restore_s"].append(timed(functools.partial(other.feed_prompt, "s", ids), args.device))
                checks.append(other.position("s").committed == committed and exact(other, "s", fresh))
            # A holds it again: parked and restored from its own disk
            a.park("s")
            rows["disk_restore_s"].append(timed(functools.partial(a.restore, "s"), args.device))
            checks.append(a.position("s").committed == committed and exact(a, "s", fresh))
        sharing = {name: asdict(got) for name, sh in (("A", a), ("B", b)) if (got := sh.sharing()) is not None}
        stored = a.disk.info("s") if a.disk is not None else None
        size = stored.bytes if stored is not None else 0
        a.close()
        b.close()
        client.delete(*(client.keys("shadow:*") or ["-"]))
        transfer = measure_transfer(client, args.transfer_bytes, args.repeat)
    med = {k: median(v) for k, v in rows.items()}
    read_s, copy_s = median(reads), median(copies)
    on_gpu = args.device.startswith("cuda")
    return {
        "model": args.model, "ids": args.ids, "committed": committed, "grid": args.grid, "dtype": args.dtype,
        "path": "the Redis store (STORE=redis://, shadow/backends/stores/tiered.py): instance A parks (its disk, "
                "then Redis), instance B on a disk of its own takes the session from Redis when fed its ids, "
                "and back",
        "park_bytes": size, "state_bytes": state_bytes, "repeat": args.repeat, "all_equal_to_fresh": all(checks),
        "restores_checked": len(checks), "read_again_s": read_s, "read_again_all_s": reads,
        "medians_s": med, "all_s": rows, "sharing": sharing,
        "host_to_device_s": copy_s if on_gpu else None,
        "restore_device_share_of_read": copy_s / read_s if on_gpu else None,
        "transfer": transfer,
        "rates": {"redis_put_GBps": transfer["put_GBps"], "redis_restore_GBps": transfer["get_GBps"],
                  "session_park_GBps": size / med["park_s"] / 1e9,
                  "session_redis_restore_GBps": size / med["redis_restore_s"] / 1e9,
                  "session_disk_restore_GBps": size / med["disk_restore_s"] / 1e9,
                  "host_to_device_GBps": state_bytes / copy_s / 1e9 if on_gpu else None},
        "redis_server": subprocess.run([args.redis_server, "--version"], capture_output=True,
                                       text=True).stdout.strip(),
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scale_out store", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for scale_out_store[-gpu].json")
    ap.add_argument("--redis-server", default="redis-server", help="the redis-server binary (default: on PATH)")
    ap.add_argument("--model", default="tiny", choices=("tiny", "0.8B", "2B", "4B"))
    ap.add_argument("--ids", type=int, default=4096, help="the session's ids (the GPU run: 32768)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--transfer-bytes", type=int, default=state_bytes('0.8B').park(32768, 32768, 1),
                    help="random bytes of this size through Redis each way, for the store's rate (default: a\n"
                         "32k session of the 0.8B, one checkpoint)")
    ap.add_argument("--repeat", type=int, default=3, help="parks and restores each way (medians reported)")
    ap.add_argument("--repeat-read", type=int, default=2, help="reads of the session again (median reported)")
    args = ap.parse_args(argv)
    doc: dict[str, Any] = {"benchmark": "scale_out_store", **environment()}
    with tempfile.TemporaryDirectory(prefix="shadow-scale-out-store-") as tmp:
        doc |= run(args, Path(tmp))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / ("scale_out_store-gpu.json" if args.device.startswith("cuda") else "scale_out_store.json")
    keep_newest(out)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: doc[k] for k in ("committed", "park_bytes", "read_again_s", "medians_s",
                                          "all_equal_to_fresh", "rates")}, indent=1))
    print(f"wrote {out}")
    return 0 if doc["all_equal_to_fresh"] else 1
