"""Where a waiting host's ``round_ended`` time goes, on the GPU box (a probe, not an A/B).

A 9B main model's captured one-token step, then the call, as ``ab_cost.py``'s waiting host makes
it; the service's stages wrapped with timers (a look's stages only: quiet rounds skip them). Each
variant serves the first 6 turns of the ab_cost session twice and keeps the second: ``wait`` (as
ab_cost), ``off_ref`` / ``wait_ref`` (a fixed Python loop timed right after the wait and again, to
tell cold caches from work), ``wait_spin`` (the host polls an event before reading its token),
``wait_nogc`` (the collector off).

    python -m benchmarks.probes.round_stages --raw DIR --out DIR     # CUDA only; writes DIR/round_stages.json
"""
from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.ab_cost import DEFAULT_SESSIONS, RAW, build_service, drain, load_sessions
from benchmarks.ab_engine import MainModel, build_main
from benchmarks.common import environment

VARIANTS = ("wait", "off_ref", "wait_ref", "wait_spin", "wait_nogc", "wait", "wait_spin")
STAGES = (("activity", "turn"), ("service", "_follows"), ("service", "_feed_output"),
          ("activity", "record_round_ended"), ("service", "_narrate"), ("ration", "step"), ("service", "_counts"))


def ref() -> int:
    """A fixed piece of Python: its time right after a wait against its time again tells cold from work."""
    s = 0
    for i in range(300):
        s += i * i
    return s


def stats(v: list[int]) -> dict[str, float] | None:
    v = sorted(v)
    if not v:
        return None
    return {"n": len(v), "mean_us": sum(v) / len(v) / 1e3, "p50_us": v[len(v) // 2] / 1e3,
            "p90_us": v[int(len(v) * 0.9)] / 1e3, "min_us": v[0] / 1e3}


def timed(acc: dict[str, list[int]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            acc.setdefault(name, []).append(time.perf_counter_ns() - t)
    return wrapper


def serve(main: MainModel, service: Any, prompts: list[tuple[list[int], list[int]]], variant: str, rep: int,
          acc: dict[str, list[int]]) -> dict[str, Any]:
    acc.clear()
    rounds: list[int] = []
    chunky: list[int] = []
    cold: list[int] = []
    hot: list[int] = []
    name = f"p-{variant}-{rep}"
    decode_s, tokens = 0.0, 0
    host = None if variant == "off_ref" else service
    for k, (prompt, output) in enumerate(prompts):
        rid = f"{name}-t{k}"
        if host is not None:
            host.arrived(rid)
            host.started(rid, name, ids=list(prompt))
        main.prefill(prompt)
        if host is not None:
            host.first_token(rid)
        t0 = time.perf_counter()
        for i in range(1, len(output)):
            if variant == "wait_spin":
                wait = main.launch(output[i - 1])
                event = torch.cuda.Event()
                event.record()
                while not event.query():
                    pass
                wait()
            else:
                main.step(output[i - 1])
            if variant in ("off_ref", "wait_ref"):
                a = time.perf_counter_ns()
                ref()
                b = time.perf_counter_ns()
                ref()
                cold.append(b - a)
                hot.append(time.perf_counter_ns() - b)
            if host is not None:
                a = time.perf_counter_ns()
                got = host.round_ended(rid, [output[i]])
                (chunky if got.chunks else rounds).append(time.perf_counter_ns() - a)
        decode_s += time.perf_counter() - t0
        tokens += len(output) - 1
        if host is not None:
            host.finished(rid)
        main.finish()
        time.sleep(0.5)
    if host is not None:
        drain(service, [name], 512, 60)
    return {"tps": tokens / decode_s, "round_ended": stats(rounds), "with_chunks": stats(chunky),
            "ref_cold": stats(cold), "ref_hot": stats(hot), "stages": {k: stats(v) for k, v in acc.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", type=Path, default=RAW, help="the sessions folder (ab_cost's)")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    env = environment()
    device, dtype = torch.device("cuda"), torch.bfloat16
    prompts = load_sessions(args.raw, list(DEFAULT_SESSIONS), 6)[0].turns
    model, _ = build_main("9b", device, dtype, 512, True)
    acc: dict[str, list[int]] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        container, service, _ = build_service(Path(tmp), "0.8b", device, dtype, 512, 0.02, Path(tmp) / "t.jsonl")
        owners = {"activity": service.activity, "service": service, "ration": service.ration}
        for owner, attr in STAGES:
            obj = owners[owner]
            setattr(obj, attr, timed(acc, f"{owner}.{attr}", getattr(obj, attr)))
        try:
            for variant in VARIANTS:
                for rep in range(2):  # the first of each warms
                    if variant == "wait_nogc":
                        gc.disable()
                    got = serve(model, service, prompts, variant, rep, acc)
                    gc.enable()
                results.setdefault(variant, []).append(got)
                print(variant, json.dumps({k: got[k] for k in ("tps", "round_ended", "ref_cold", "ref_hot")}),
                      flush=True)
        finally:
            service.stop()
            container.shutdown_resources()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "round_stages.json").write_text(
        json.dumps({"benchmark": "round_stages", **env, "variants": results}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
