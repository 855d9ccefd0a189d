"""How fast the shadow reads (the spec's shadow_measure): ours on the fast path, ours eager, and the
peer (transformers' Qwen3_5ForCausalLM with fla's kernels) on the same random weights, in one
process on one GPU; and the exactness of a real session on the fast path, in the same run.

On the device, the lead's command. First, here, put the real sessions under an ignored folder so
that they travel (``carry``: ``[".whl", ".bench"]``):

    mkdir -p .bench && echo /.bench/ >> "$(git rev-parse --git-path info/exclude)"
    cp ../shared/data/sessions/raw/mini-swe-agent-gemini3-swebench/sympy__sympy-12489.traj.json \\
       ../shared/data/sessions/raw/mini-swe-agent-gemini3-swebench/django__django-16527.traj.json .bench/

then, on the device (the project's dependencies as for ``pytest -m gpu``; nothing is fetched):

    pip install -q --no-deps .whl/fla_core-0.6.0-py3-none-any.whl && \\
    SHADOW_COMMIT=<commit> python -m benchmarks.read_rate --out "$OUT" --session .bench/sympy__sympy-12489.traj.json

(about 6 minutes; ``--quick --session .bench/django__django-16527.traj.json``: about 2). Without
``--session`` and without ``../shared`` the check takes the shipped demo session (OpenHands, real,
6 turns, 6k ids) and says so in ``exact.session``. On a CPU, a smoke run of every path on a tiny
model (tests/benchmarks/test_read_rate.py runs it):

    python -m benchmarks.read_rate --out /tmp/rr --device cpu --quick

Random weights at the published 0.8B/2B/4B shapes (``reference_shape``), bf16, written once as a
text-layout HF checkpoint that both sides load. The first model gets every figure, the others the
chunk at depth 0. Figures, each after a warm pass (below):

- ``chunk``: ms per 512-chunk at depths 0, 8k, 32k, 100k (100,352 = 196 chunks): ``sh.read(ReadPlan(
  session, max_chunks=1))`` wall time, device synchronised, median over consecutive chunks from that depth;
- ``question300``: ``sh.ask(session, <300 ids>, ["A", "B"])`` at 32k and 100k, the session read to
  exactly that depth with no pending tail, median of several;
- ``fork_decode_token``: ``sh.decode(session, prompt, max_new=N)`` timed for two N and differenced
  (the prompt's cost cancels), divided by the difference in tokens returned, at 32k;
- ``floor_ms``: the roofline floor of that work from the matmul and copy rates measured in this
  run (``floor``: the FLOP formula is there).

Warm-up: every side runs ``warm_up`` (ours) or loads (the peer), then the whole timed sequence once
on a throwaway session or cache (the same depths, so the same shapes: first-shape compiles, cuDNN
plans and graph captures happen there); the figures come from the second run. ``warm_up``'s wall
time is the start-up reported, with the reader's ``fast_report`` when it has one.

Writes ``DIR/read_rate-<date>.json`` (``-quick``, ``-cpu`` added for those runs) and prints the
table last. The peer's figures at depths above ``--peer-max-depth`` are skipped (and say so).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment, keep_newest
from benchmarks.read_rate import batch as batch_mod
from benchmarks.read_rate import exact as exact_mod
from benchmarks.read_rate import floor as floor_mod
from benchmarks.read_rate.steps import FIGURES, GRID, PeerRunner, Plan, ShadowSide, run_steps
from shadow import Shadow, ShadowSettings, build_shadow
from shadow.backends.qwen35 import Qwen35Config
from shadow.backends.qwen35.attention import SETTINGS as ATTENTION
from shadow.backends.qwen35.checkpoint import demo_text_config, random_tensors, write_checkpoint
from shadow.backends.qwen35.config import reference_shape

MODELS = {"0.8b": lambda: reference_shape("0.8B"), "2b": lambda: reference_shape("2B"),
          "4b": lambda: reference_shape("4B"), "tiny": demo_text_config}

FULL = Plan(depths=(0, 8192, 32768, 100352), question_depths=(32768, 100352), decode_depth=32768,
            decode_n=(4, 24), session=str(exact_mod.SESSION_FULL))
QUICK = Plan(depths=(0, 8192, 32768), question_depths=(32768,), decode_depth=32768, chunks=5, repeats=3,
             decode_n=(4, 20), session=str(exact_mod.SESSION_QUICK))
# On a CPU the tiny model walks every path; these are smoke runs, not measurements (--quick: for CI).
CPU = Plan(depths=(0, 1024), question_depths=(1024,), decode_depth=1024, chunks=2, repeats=2, decode_n=(1, 3),
           matmul_n=512, copy_bytes=2**26, session=str(exact_mod.SESSION_QUICK), session_max_tokens=3000)
CPU_QUICK = replace(CPU, depths=(0, 512), question_depths=(512,), decode_depth=512, chunks=1, repeats=1,
                    decode_n=(1, 2))


@dataclass
class ModelRun:
    name: str
    cfg: Qwen35Config
    figures: dict[str, dict[str, dict[int, float | None]]] = field(default_factory=dict)  # side -> figure -> depth
    startup: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _behind_facade(sh: Shadow) -> dict[str, Any]:
    """The one place this script reaches behind the facade: what the reader says about its fast path."""
    reader = getattr(sh, "reader", None)
    report = getattr(reader, "fast_report", None)
    try:
        got = report() if callable(report) else None
    except Exception as err:  # a report that fails is reported, the run goes on
        got = {"error": f"{type(err).__name__}: {err}"}
    return {"reader": type(reader).__name__, "fast_report": got}


def _build(ckpt: Path, device: str, dtype: str, fast: str, attention: str = "auto") -> tuple[Shadow, dict[str, Any]]:
    t0 = time.perf_counter()
    sh = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device=device, dtype=dtype, grid=GRID,
                                     disk="off", gb=64, fast=fast, attention=attention))
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    sh.warm_up()
    sh.sync()
    return sh, {"build_s": built, "warm_up_s": time.perf_counter() - t0, "attention": sh.reader.attention,
                **_behind_facade(sh)}


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def _write_model(folder: Path, text_config: dict[str, Any], device: torch.device, dtype: torch.dtype) -> float:
    t0 = time.perf_counter()
    cfg = Qwen35Config.from_dict(text_config)
    tensors = {k: v.cpu() for k, v in random_tensors(cfg, seed=0, dtype=dtype, device=device).items()}
    write_checkpoint(folder, text_config, tensors, dtype=dtype, layout="text", extras=False)
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Inputs:
    ids: list[int]  # the session, deep enough for every stop and its chunks
    question: list[int]  # 300 ids
    prompt: list[int]  # the fork decode's prompt


def _inputs(cfg: Qwen35Config, plan: Plan) -> Inputs:
    rng = random.Random(0)
    n = max(plan.stops()) + plan.chunks * GRID
    top = min(cfg.vocab_size, 248000)  # ordinary tokens, below the special ones
    return Inputs([rng.randrange(top) for _ in range(n)], [rng.randrange(top) for _ in range(300)],
                  [rng.randrange(top) for _ in range(16)])


def _walk_twice(sh: Shadow, side: str, plan: Plan, inputs: Inputs, run: ModelRun) -> dict[str, Any]:
    """The warm pass, then the timed one; returns the timings of each pass."""
    took: dict[str, Any] = {}
    for session in ("warm", "timed"):
        t0 = time.perf_counter()
        walker = ShadowSide(sh, inputs.ids, session, GRID)
        figures: dict[str, dict[int, float | None]] = {}
        run_steps(walker, plan, inputs.question, inputs.prompt, figures)
        walker.close()
        took[f"{session}_pass_s"] = time.perf_counter() - t0
    run.figures[side] = figures
    run.notes.extend(f"{side}: {n}" for n in walker.notes)
    return took


def _ours(run: ModelRun, plan: Plan, ckpt: Path, args: argparse.Namespace, work: Path, inputs: Inputs,
          exact: dict[str, Any] | None) -> tuple[Any, list[int]] | None:
    """Ours on the fast path; with ``exact``, the real session's check too. Returns its state and ids."""
    sh, start = _build(ckpt, args.device, args.dtype, "auto", args.attention)
    start.update(_walk_twice(sh, "ours", plan, inputs, run))
    start["peak_gib"] = _peak_gib(args.device)
    run.startup["ours"] = start
    if exact is None:
        return None
    _, source, turns = exact_mod.load_turns(Path(plan.session), plan.session_max_tokens)
    child = None if args.no_child else [sys.executable, "-m", "benchmarks.read_rate", "--device", args.device,
                                         "--dtype", args.dtype, "--child-model", str(ckpt),
                                         "--attention", args.attention]
    report, state, ids = exact_mod.check(sh, turns, child, work)
    exact.update(session=source, **report)
    return state, ids


def _eager(run: ModelRun, plan: Plan, ckpt: Path, args: argparse.Namespace, inputs: Inputs,
           fast_state: tuple[Any, list[int]] | None, exact: dict[str, Any]) -> None:
    sh, start = _build(ckpt, args.device, args.dtype, "off")
    start.update(_walk_twice(sh, "eager", plan, inputs, run))
    start["peak_gib"] = _peak_gib(args.device)
    run.startup["eager"] = start
    if fast_state is not None:
        exact["fast_vs_eager"] = exact_mod.agreement(fast_state[0], sh.fresh_state(fast_state[1]))


def _peer(run: ModelRun, plan: Plan, ckpt: Path, args: argparse.Namespace, inputs: Inputs) -> None:
    """The peer, both passes; a failure of the peer is noted, not fatal: our figures still count."""
    from benchmarks.read_rate import peer as peer_mod

    device = torch.device(args.device)
    try:
        model, info = peer_mod.load(ckpt, device, torch.bfloat16 if args.dtype == "bfloat16" else torch.float32)
        peer = PeerRunner(peer_mod.PeerSide(model, inputs.ids, lambda: _sync(device)), args.peer_max_depth, GRID)
        for session in ("warm", "timed"):
            t0 = time.perf_counter()
            peer.side.restart()
            figures: dict[str, dict[int, float | None]] = {}
            run_steps(peer, plan, inputs.question, inputs.prompt, figures)
            info[f"{session}_pass_s"] = time.perf_counter() - t0
    except Exception as err:  # reported in the results, the run goes on
        run.notes.append(f"peer failed: {type(err).__name__}: {err}"[:500])
        return
    info["peak_gib"] = _peak_gib(args.device)
    run.figures["peer"], run.startup["peer"] = figures, info
    run.notes.extend(peer.notes)


def run_model(run: ModelRun, plan: Plan, ckpt: Path, args: argparse.Namespace, work: Path,
              exact: dict[str, Any] | None) -> None:
    """Every side of one model through ``plan``, one after the other, each freed before the next;
    with ``exact`` (a dict to fill), the exactness check on the fast path and its distance to eager."""
    inputs = _inputs(run.cfg, plan)
    _free(args.device)
    fast_state = _ours(run, plan, ckpt, args, work, inputs, exact)
    _free(args.device)
    _eager(run, plan, ckpt, args, inputs, fast_state, exact if exact is not None else {})
    _free(args.device)
    if args.no_peer:
        run.notes.append("peer skipped (--no-peer)")
    else:
        _peer(run, plan, ckpt, args, inputs)
        _free(args.device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rows(runs: list[ModelRun], plans: dict[str, Plan], rates: tuple[float, float], elem: int) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        plan = plans[run.name]
        for figure in FIGURES:
            depths = {"chunk": plan.depths, "question300": plan.question_depths,
                      "fork_decode_token": () if plan.decode_depth is None else (plan.decode_depth,)}[figure]
            for d in depths:
                n, depth = {"chunk": (GRID, d), "question300": (300, d), "fork_decode_token": (1, d + 16)}[figure]
                floor, bound = floor_mod.cost(run.cfg, n, depth, figure != "chunk", elem).floor_ms(*rates)
                got = {s: run.figures.get(s, {}).get(figure, {}).get(d) for s in ("ours", "eager", "peer")}
                out.append({"model": run.name, "figure": figure, "depth": d, "ours_ms": got["ours"],
                            "eager_ms": got["eager"], "peer_ms": got["peer"], "floor_ms": floor, "floor_bound": bound})
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(result: dict[str, Any]) -> str:
    lines = [f"{'model':5} {'figure':17} {'depth':>7} {'ours':>8} {'eager':>8} {'peer':>8} {'floor':>7} "
             f"{'peer/ours':>9} {'ours/floor':>10}"]
    for r in result["rows"]:
        if r["figure"] != "chunk" and r["figure"] not in FIGURES:
            continue  # the batch rows: their own table below
        o, p, f = r["ours_ms"], r["peer_ms"], r["floor_ms"]
        lines.append(f"{r['model']:5} {r['figure']:17} {r['depth']:>7} {_fmt(o):>8} {_fmt(r['eager_ms']):>8} "
                     f"{_fmt(p):>8} {_fmt(f):>7} {_fmt(p / o if o and p else None):>9} "
                     f"{_fmt(o / f if o and f else None):>10}")
    e = result["exact"]
    lines.append(f"exact: {'yes' if e.get('equal') else 'NO'} ({e.get('tokens')} ids, {e.get('turns')} turns, "
                 f"{e.get('rollbacks')} rollbacks; other process: {e.get('other_process_equal', 'skipped')}; "
                 f"fast vs eager rel {_fmt((e.get('fast_vs_eager') or {}).get('largest_rel_diff'))})")
    lines += batch_table(result)
    for name, s in result["startup"].items():
        ours = s.get("ours", {})
        lines.append(f"{name}: warm_up {_fmt(ours.get('warm_up_s'))} s, fast_report {ours.get('fast_report')}")
    return "\n".join(lines)


def batch_table(result: dict[str, Any]) -> list[str]:
    lines = [f"{'model':5} {'figure':17} {'batch':>5} {'depth':>7} {'ms/512':>8} {'floor':>7} {'tflops':>7}"]
    for r in result["rows"]:
        if r["figure"] in ("batch_chunk", "attention_layer", "attention_tiles", "attention_read"):
            depth = r.get("depth_range") or r["depth"]
            lines.append(f"{r['model']:5} {r['figure']:17} {r.get('batch', '-'):>5} {depth:>7} "
                         f"{_fmt(r.get('ours_ms')):>8} {_fmt(r.get('floor_ms')):>7} {_fmt(r.get('tflops')):>7} "
                         f"{r.get('tiles', '')} {r.get('error', '')}"
                         + ("" if r.get("equal", True) else " NOT EQUAL to its own calls"))
        if r["figure"] == "batch_busy":
            wall, kern = _fmt(r.get("wall_ms")), _fmt(r.get("kernel_ms"))
            lines.append(f"{r['model']:5} busy: batch {r['batch']} depth {r['depth']}: wall {wall} ms, "
                         f"kernels {kern} ms ({r.get('kernels')}) {r.get('error', '')}")
    b = result["exact"].get("batch")
    if b is not None:
        lines.append(f"batch exact: {'yes' if b['equal'] else 'NO'} ({b['sessions']} sessions at depths "
                     f"{b['depths_before']}, against each alone and a fresh prefill)")
    return lines if len(lines) > 1 or b else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.read_rate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results", help="folder for read_rate.json (the one "
                    "before moves to history/)")
    ap.add_argument("--quick", action="store_true", help="fewer depths and repeats, the 0.8B shape only")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                    help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--models", default=None,
                    help="comma-separated of 0.8b,2b,4b,tiny (default: by device and --quick)")
    ap.add_argument("--session", default=None, help="the real session of the exactness check (a file)")
    ap.add_argument("--peer-max-depth", type=int, default=None, help="skip the peer's figures above this depth")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer (transformers)")
    ap.add_argument("--no-child", action="store_true", help="skip the fresh prefill in another process")
    ap.add_argument("--tmp", default=None, help="where the random checkpoints are written (default: the system's)")
    ap.add_argument("--no-batch", action="store_true", help="skip the batch figures (read_rate.batch)")
    ap.add_argument("--batch-cpu", action="store_true", help="the batch figures on the CPU too (a smoke run)")
    ap.add_argument("--attention", default="auto", choices=ATTENTION,
                    help="the chunk attention kernel (the ATTENTION setting; auto, the shipped choice: the "
                         "Gluon one on a Hopper; a kernel named here writes read_rate-<kernel>.json)")
    ap.add_argument("--child-model", help=argparse.SUPPRESS)
    ap.add_argument("--child-fresh", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.child_fresh:
        sh, _ = _build(Path(args.child_model), args.device, args.dtype, "auto", args.attention)
        exact_mod.child_fresh(sh, Path(args.child_fresh))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here (use --device cpu for the smoke run)")
    base = ((CPU_QUICK if args.quick else CPU) if args.device == "cpu" else QUICK if args.quick else FULL)
    if args.session:
        base = replace(base, session=args.session)
    names = (args.models or ("tiny" if args.device == "cpu" else "0.8b" if args.quick else "0.8b,2b,4b")).split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; known: {sorted(MODELS)}")
    t_start = time.perf_counter()
    env = environment()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    rates = (floor_mod.matmul_rate(device, dtype, base.matmul_n), floor_mod.copy_rate(device, base.copy_bytes))
    plans = {n: base if i == 0 else base.depth0() for i, n in enumerate(names)}
    exact: dict[str, Any] = {}
    runs: list[ModelRun] = []
    batch_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="read_rate-") as tmp:
        for i, name in enumerate(names):
            run = ModelRun(name, Qwen35Config.from_dict(MODELS[name]()))
            folder = Path(tmp) / name
            run.startup["checkpoint_write_s"] = _write_model(folder, MODELS[name](), device, dtype)
            run_model(run, plans[name], folder, args, Path(tmp), exact if i == 0 else None)
            if i == 0 and not args.no_batch and (args.device == "cuda" or args.batch_cpu):
                _free(args.device)
                batch = batch_mod.measure(folder, args.device, args.dtype,
                                          batch_mod.BatchPlan() if args.device == "cuda" else batch_mod.CPU_PLAN, rates,
                                          args.attention)
                exact["batch"] = batch.pop("exact")
                run.startup["batch"] = {k: v for k, v in batch.items() if k != "rows"}
                batch_rows = [{"model": name, **r} for r in batch["rows"]]
                _free(args.device)
            shutil.rmtree(folder)
            runs.append(run)
    result: dict[str, Any] = {
        "benchmark": "read_rate", **env, "dtype": args.dtype, "grid": GRID,
        "quick": args.quick, "warm": "each side ran the whole timed sequence once (same depths and shapes) on a "
                                     "throwaway session or cache after warm_up or loading; figures are the second run",
        "matmul_tflops": rates[0] / 1e12, "copy_tbps": rates[1] / 1e12,
        "exact": exact, "startup": {r.name: r.startup for r in runs},
        "notes": [f"{r.name}: {n}" for r in runs for n in r.notes],
        "plans": {n: asdict(p) for n, p in plans.items()},
        "rows": rows(runs, plans, rates, 2 if dtype == torch.bfloat16 else 4) + batch_rows,
        "wall_s": time.perf_counter() - t_start,
    }
    result["attention_kernel"] = runs[0].startup.get("ours", {}).get("attention")  # as the container resolved it
    suffix = ("-quick" if args.quick else "") + ("-cpu" if args.device == "cpu" else "") + (
        "" if args.attention == "auto" else f"-{args.attention}")
    out = Path(args.out) / f"read_rate{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    keep_newest(out)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out} in {result['wall_s']:.0f} s")
    print(f"warm: {result['warm']}")
    for note in result["notes"]:
        print(f"note: {note}")
    print(table(result))
    reads_equal = all(r.get("equal", True) for r in result["rows"] if r["figure"] == "attention_read")
    return 0 if exact.get("equal") and exact.get("batch", {"equal": True})["equal"] and reads_equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
