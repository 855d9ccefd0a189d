"""One session parked and restored through a real Redis on loopback, against the local disk and against
reading it again (``python -m benchmarks.scale_out store``).

    python -m benchmarks.scale_out store --out DIR                                    # CPU: the tiny model
    python -m benchmarks.scale_out store --out DIR --model 0.8B --ids 32768 --device cuda --dtype bfloat16 \\
        --redis-server /path/to/redis-server                                          # the GPU machine

The script starts ``redis-server`` (``--redis-server``: the binary, for a machine that carries it as an
unpacked Debian package) on a free loopback port with persistence off, and stops it at the end. A
session of ``--ids`` random ids is read on the grid (random weights at the model's published shape, or
the tests' tiny model), then, ``--repeat`` times:

- the local disk: ``park`` (the disk store's file: fsync, rename) and ``restore`` from it (the page cache);
- Redis: the parked file's bytes sent in parts of at most 8 MB with a manifest listing each part's
  SHA-256 (parts first, then the manifest), the local file deleted, then the manifest and parts fetched,
  every part checked, the file written back and restored through the disk store's own checks. Until the
  Redis store (``shadow/backends/stores/redis*.py``) is on this branch, that is done here with redis-py in
  the same form (the JSON's ``path`` says which);
- after each restore the state is ``torch.equal`` to a fresh prefill of the ids (``compare``);
- the store's rate: random bytes of ``--transfer-bytes`` (default: a 32k session of the 0.8B, 442 MB)
  through the same parts and manifest, each way (a tiny model's park is too small to time a rate by).

Reading again: the same ids as a new session, read on the grid (after a warm read); on a GPU its wall
is the device's time. A restore's device time: the host-to-device copy of the park's tensors (the
session's CPU state moved to the device, synchronised), against that read.

Writes ``DIR/scale_out_store.json`` (``DIR/scale_out_store-gpu.json`` on a GPU) with ``rates``: the
store's rate the fleet replay uses (``redis_restore_GBps``: the transfer's bytes over its fetch and
check) and
``host_to_device_GBps``.
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
from pathlib import Path
from typing import Any

import redis
import torch

from shadow import Shadow, ShadowSettings, build_shadow
from shadow.adapters.replay import compare
from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.backends.qwen35.config import reference_shape
from shadow.backends.stores import DiskStore, parked

from .common import environment
from .scale_out import state_bytes

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


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    config = demo_text_config() if args.model == "tiny" else reference_shape(args.model)
    ckpt = write_checkpoint(work / f"qwen35-{args.model}-random", config,
                            dtype=torch.float32 if args.dtype == "float32" else torch.bfloat16, seed=0)
    disk = work / "parked"
    sh: Shadow = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device=args.device, dtype=args.dtype,
                                             grid=args.grid, gb=256, disk=str(disk), disk_gb=256))
    rng = random.Random(0)
    ids = [rng.randrange(VOCAB) for _ in range(args.ids)]
    warm = [rng.randrange(VOCAB) for _ in range(4 * args.grid)]
    sh.feed_prompt("warm", warm)
    sh.read("warm")
    sh.forget("warm")
    reads = []
    for i in range(args.repeat_read):
        name = f"read{i}"
        sh.feed_prompt(name, ids)
        reads.append(timed(functools.partial(sh.read, name), args.device))
        if i < args.repeat_read - 1:
            sh.forget(name)
    name = f"read{args.repeat_read - 1}"
    fresh = sh.fresh_state(ids)
    committed = sh.position(name).committed
    assert compare(sh.export_state(name), fresh)[0], "the read session differs from a fresh prefill"
    state = sh.export_state(name)
    state_bytes = sum(t.numel() * t.element_size() for t in state.values())
    copies = [timed(functools.partial(to_device, state, args.device), args.device) for _ in range(args.repeat)]
    del state
    disk_store = sh.disk
    assert isinstance(disk_store, DiskStore)
    path = disk_store.root / parked.file_name(name)
    rows: dict[str, list[float]] = {k: [] for k in ("disk_park_s", "disk_restore_s", "redis_put_s", "redis_get_s",
                                                     "redis_file_s", "redis_load_s")}
    equal: list[bool] = []
    with redis_server(args.redis_server, work) as client:
        key = "bench:{" + hashlib.sha256(name.encode()).hexdigest()[:40] + "}"
        for g in range(args.repeat):
            rows["disk_park_s"].append(timed(lambda: sh.park(name), args.device))
            data = path.read_bytes()
            rows["redis_put_s"].append(timed(functools.partial(put, client, key, data, g), "cpu"))
            del data
            path.unlink()  # what comes back comes from Redis
            t0 = time.perf_counter()
            got = get(client, key)
            rows["redis_get_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tmp = path.with_name(path.name + ".redis")
            with open(tmp, "wb") as f:
                f.write(got)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            rows["redis_file_s"].append(time.perf_counter() - t0)
            del got
            rows["redis_load_s"].append(timed(lambda: sh.restore(name), args.device))
            equal.append(compare(sh.export_state(name), fresh)[0] and not disk_store.refused)
            sh.park(name)
            rows["disk_restore_s"].append(timed(lambda: sh.restore(name), args.device))
            equal.append(compare(sh.export_state(name), fresh)[0] and not disk_store.refused)
        size = path.stat().st_size
        client.delete(*client.keys("bench:*"))
        transfer = measure_transfer(client, args.transfer_bytes, args.repeat)
    sh.close()
    med = {k: median(v) for k, v in rows.items()}
    read_s, copy_s = median(reads), median(copies)
    redis_restore = med["redis_get_s"] + med["redis_file_s"] + med["redis_load_s"]
    on_gpu = args.device.startswith("cuda")
    return {
        "model": args.model, "ids": args.ids, "committed": committed, "grid": args.grid, "dtype": args.dtype,
        "path": "redis-py here, the parked file's bytes in 8 MB parts with a SHA-256 manifest (the Redis store "
                "is not on this branch yet)",
        "park_bytes": size, "state_bytes": state_bytes, "repeat": args.repeat, "all_equal_to_fresh": all(equal),
        "restores_checked": len(equal), "read_again_s": read_s, "read_again_all_s": reads,
        "medians_s": med, "all_s": rows, "redis_restore_s": redis_restore,
        "host_to_device_s": copy_s if on_gpu else None,
        "restore_device_share_of_read": copy_s / read_s if on_gpu else None,
        "transfer": transfer,
        "rates": {"redis_put_GBps": transfer["put_GBps"], "redis_restore_GBps": transfer["get_GBps"],
                  "session_redis_put_GBps": size / med["redis_put_s"] / 1e9,
                  "session_redis_get_GBps": size / med["redis_get_s"] / 1e9,
                  "redis_restore_end_to_end_GBps": size / redis_restore / 1e9,
                  "disk_park_GBps": size / med["disk_park_s"] / 1e9,
                  "disk_restore_GBps": size / med["disk_restore_s"] / 1e9,
                  "host_to_device_GBps": state_bytes / copy_s / 1e9 if on_gpu else None},
        "redis_server": subprocess.run([args.redis_server, "--version"], capture_output=True,
                                       text=True).stdout.strip(),
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
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: doc[k] for k in ("committed", "park_bytes", "read_again_s", "redis_restore_s",
                                          "all_equal_to_fresh", "rates")}, indent=1))
    print(f"wrote {out}")
    return 0 if doc["all_equal_to_fresh"] else 1
