"""What the shadow costs a main model that decodes on the same GPU (the spec's ``shadow_ab``).

    python -m benchmarks.ab_cost --out DIR [--runs 6] [--main-shape 9b] [--shadow-shape 0.8b] [--sessions ...]
    python -m benchmarks.ab_cost --out /tmp/ab --main-shape tiny --smoke      # the CPU smoke run (CI)
    python -m benchmarks.ab_cost --out DIR --agents 16 --overlap      # 16 sessions decoding at once (CUDA)

One process, one device. The main model (``benchmarks.ab_cost.engine``: this project's Qwen3.5 forward at
the 9B shape, random weights, bf16, decoding through the fast path's captured one-token step)
serves real sessions' turns: each prompt prefilled, then the turn's real output length decoded
token by token. Beside it, a real shadow service (``build_container``: the 0.8B shape from a random
checkpoint, the fast path, its idle window on its own thread and the ration at 2 %, spans to a JSONL
file) is told what happens through the host interface, exactly as an engine would tell it.

Arms alternate, off then on, ``--runs`` of each after ``--warmup`` unmeasured pairs. Every run
serves the same turns; an on-run's sessions get new names, so the shadow reads every prompt.

*Off* is the same process with the service built, loaded and its idle loop running, and no host
call made. That is the true baseline for the question asked: what a host that follows its
sessions pays, against the same host that does not. Building and dropping the service between
runs would change the process between arms (allocator state, threads, the tracer) and could not
alternate within one process; with nothing fed, the idle loop only looks every 0.2 s and reads
nothing. After each on-run the idle window reads the run's sessions to their last whole chunk (so
no backlog spills into the next off-run; the script checks that no chunk span falls in an off-run)
and the sessions are forgotten.

Per run: decode tokens/s (tokens after the first over the time from the first token to the last,
the host's calls included), TTFT (arrival to the first token read back: the calls, the barrier, the
prefill). Paired by run (off_i, on_i): ``decode_loss_pct`` = median of 100 (off - on) / off of the
decode rate; ``ttft_delta_pct`` = median of 100 (on - off) / off of the mean TTFT; with their spread.
From the spans of the same on-runs (``benchmarks.ab_cost.spans``), two estimates over the decode time, medians
over the on-runs: ``trace_chunks_pct``, the chunks' measured device time during the decodes (the
ration's chunks of the run's requests, and any idle chunk that overlaps a decode), which is what an
overlapped host pays (its calls run while the device runs the next step); and ``trace_host_pct``,
the time inside the shadow's calls during the decodes as the service's ``shadow.turn`` spans
report it (chunks included), which is what a host that waits on each call pays. ``trace_cost_pct``
is the one for the run's host (``--overlap`` or not), named in ``trace_estimator``. ``calls_pct``
is the same time as the host measured it around its calls.

On the device, the lead's command. The session travels in an ignored folder (``carry``:
``[".whl", ".bench"]``); without it (no ``../shared`` there) the shipped demo session, also a real
OpenHands session of the same kind, is served instead and the result says so:

    mkdir -p .bench/openhands-examples && echo /.bench/ >> "$(git rev-parse --git-path info/exclude)"
    cp ../shared/data/sessions/raw/openhands-examples/output.jsonl .bench/openhands-examples/

then there (the project's dependencies as for ``pytest -m gpu``; sized to finish within 5 minutes on one H200):

    pip install -q --no-deps .whl/fla_core-0.6.0-py3-none-any.whl && \\
    SHADOW_COMMIT=<commit> python -m benchmarks.ab_cost --out "$OUT" --raw .bench [--smoke]

Writes ``DIR/ab_cost-<date>.json`` (``-overlap``, ``-smoke``, ``-cpu`` added for those runs) and the spans beside
it (``.trace.jsonl``), and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.ab_cost.arithmetic import chunk_spans, overlaps, pct_changes, spread, trace_cost
from benchmarks.ab_cost.engine import MainModel, TurnTiming, build_main, serve_turn, shape
from benchmarks.common import environment, keep_newest, sessions_folder

REPO = Path(__file__).resolve().parents[2]
RAW = sessions_folder()
DEMO = "demo"
DEFAULT_SESSIONS = ("openhands-examples/output.jsonl#1",)  # an agent's tight loop, 4-5k-id prompts
ARMS = ("off", "on")


# ---- the sessions ------------------------------------------------------------------------------


@dataclass
class Served:
    name: str
    source: str
    turns: list[tuple[list[int], list[int]]]  # (prompt ids, output ids) per request

    @property
    def output_ids(self) -> int:
        return sum(len(o) for _, o in self.turns)


def load_sessions(raw: Path, names: Sequence[str], turns: int, max_output: int = 0) -> list[Served]:
    """The first ``turns`` requests of each session, rendered with the Qwen3.5 template and the real
    vocabulary (``relpath`` under ``raw``, ``relpath#k`` for the k-th session of a file, or ``demo``);
    outputs cut to ``max_output`` ids when it is positive. Requests without output are left out."""
    from shadow.adapters.transcripts import demo_transcript, load_transcript, render_turns

    out = []
    for name in names:
        if name == DEMO:
            tr, source = demo_transcript(), "the shipped demo session (OpenHands SDK, real)"
        else:
            rel, _, index = name.partition("#")
            path = raw / rel
            if not path.exists():
                raise SystemExit(f"session {name!r}: {path} is absent (--raw names the sessions folder)")
            found = load_transcript(path)
            k = int(index or 0)
            if k >= len(found):
                raise SystemExit(f"session {name!r}: {path} holds {len(found)} sessions")
            tr, source = found[k], f"{rel}#{k} ({found[k].source_format})"
        rendered = render_turns(tr, indices=range(min(turns, len(tr.requests))))
        pairs = [(t.prompt_ids, t.output_ids[:max_output] if max_output > 0 else t.output_ids)
                 for t in rendered if t.output_ids]
        if not pairs:
            raise SystemExit(f"session {name!r}: no request with output among its first {turns}")
        out.append(Served(name, source, pairs))
    return out


# ---- the runs ----------------------------------------------------------------------------------


@dataclass
class Run:
    index: int
    arm: str
    warm: bool  # a warm-up run: not counted
    turns: list[TurnTiming] = field(default_factory=list)
    start_ns: int = 0
    end_ns: int = 0
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)  # on-runs: fed and read ids
    drain_s: float | None = None
    trace: dict[str, Any] = field(default_factory=dict)
    chunks_during: int = 0  # chunk spans that overlap the run (an off-run must have none)
    # ``--agents``: the turns overlap in time; the decode is the batched steps' wall time and tokens
    steps_s: float = 0.0
    step_tokens: int = 0

    @property
    def decode_s(self) -> float:
        return self.steps_s if self.steps_s > 0 else sum(t.decode_s for t in self.turns)

    @property
    def decode_tps(self) -> float:
        s = self.decode_s
        tokens = self.step_tokens if self.steps_s > 0 else sum(t.decode_tokens for t in self.turns)
        return tokens / s if s > 0 else 0.0

    @property
    def ttft_s(self) -> float:
        return statistics.fmean(t.ttft_s for t in self.turns)

    def row(self) -> dict[str, Any]:
        decode_s = self.decode_s
        return {"run": self.index, "arm": self.arm, "warm_up": self.warm, "decode_tps": self.decode_tps,
                "ttft_ms": 1e3 * self.ttft_s, "decode_s": decode_s,
                "decode_tokens": self.step_tokens or sum(t.decode_tokens for t in self.turns),
                "calls_pct": 100.0 * sum(t.calls_s for t in self.turns) / decode_s if decode_s else 0.0,
                "start_calls_ms": 1e3 * statistics.fmean(t.start_calls_s for t in self.turns),
                "host_ration_ms": sum(t.ration_ms for t in self.turns),
                "host_ration_chunks": sum(t.ration_chunks for t in self.turns),
                "chunks_during_run": self.chunks_during, "drain_s": self.drain_s, "sessions": self.sessions,
                **self.trace, "turns": [asdict(t) for t in self.turns]}


def serve_run(main: MainModel, host: Any, sessions: Sequence[Served], run: Run, gap_s: float,
              overlap: bool = False) -> list[str]:
    """Every turn of every session once; returns the session names the shadow was told of."""
    names = []
    run.start_ns = time.time_ns()
    for j, s in enumerate(sessions):
        name = f"ab-{run.index:02d}-{run.arm}-s{j}"
        names.append(name)
        for k, (prompt, output) in enumerate(s.turns):
            run.turns.append(serve_turn(main, host, f"{name}-t{k}", name, prompt, output, overlap))
            time.sleep(gap_s)  # the agent's tool call: the idle window's turn
    run.end_ns = time.time_ns()
    return names


def drain(service: Any, names: Sequence[str], grid: int, timeout_s: float) -> tuple[float, dict[str, Any]]:
    """Wait for the idle window to read ``names`` to their last whole chunk, check each against a
    fresh prefill of the ids it read (every tensor, ``torch.equal``), then forget them."""
    shadow = service.slot.get()
    t0 = time.perf_counter()
    while any(shadow.backlogs().get(n, 0) >= grid for n in names) and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.02)
    took = time.perf_counter() - t0
    got = {}
    for n in names:
        s = shadow.session_status(n)
        ids, committed, rollbacks = (s.ids, s.committed, s.rollbacks) if s is not None else (0, 0, 0)
        state, fresh = shadow.export_state(n), shadow.fresh_state(list(shadow.session_ids(n))[:committed])
        got[n] = {"ids": ids, "committed": committed, "read_all": committed == ids // grid * grid,
                  "rollbacks": rollbacks, "equal_fresh": state.keys() == fresh.keys()
                  and all(torch.equal(state[k], fresh[k]) for k in fresh)}
        service.forget(n)
    return took, got


def build_service(home: Path, shadow_shape: str, device: torch.device, dtype: torch.dtype, grid: int,
                  ration: float | None, trace: Path, stream: str = "own") -> tuple[Any, Any, dict[str, Any]]:
    """A random checkpoint at ``shadow_shape``, and the service over it, loaded and warm (on this
    thread, before its idle loop starts: nothing else runs on the device while graphs are captured)."""
    from shadow.backends.qwen35 import Qwen35Config
    from shadow.backends.qwen35.checkpoint import random_tensors, write_checkpoint
    from shadow.container import build_container
    from shadow.core.settings import ShadowSettings

    t0 = time.perf_counter()
    text = shape(shadow_shape)
    tensors = {k: v.cpu() for k, v in random_tensors(Qwen35Config.from_dict(text), seed=0, dtype=dtype,
                                                     device=device).items()}
    write_checkpoint(home / "shadow-model", text, tensors, dtype=dtype, layout="text", extras=False)
    del tensors
    written = time.perf_counter() - t0
    settings = ShadowSettings(_env_file=None, model=str(home / "shadow-model"), device=str(device),
                              dtype="bfloat16" if dtype == torch.bfloat16 else "float32", grid=grid, disk="off",
                              gb=32, dir=str(home), trace="jsonl", trace_file=str(trace), stream=stream,
                              **({} if ration is None else {"ration": ration}))
    container = build_container(settings)
    service = container.service()
    t0 = time.perf_counter()
    service.idle_step()  # the idle window's first look loads the model and warms it (the slot's path)
    if service.slot.state != "loaded":
        raise SystemExit(f"the shadow's model did not load: {service.slot.state} {service.slot.error}")
    loaded = time.perf_counter() - t0
    service.start()
    return container, service, {"shape": shadow_shape, "checkpoint_write_s": written, "load_and_warm_s": loaded,
                                "fast_report": container.reader().fast_report(), "grid": grid,
                                "ration": settings.ration, "ration_scope": settings.ration_scope,
                                "idle_window_s": settings.idle_window_s, "idle_poll_s": settings.idle_poll_s,
                                "slice_ms": settings.slice_ms, "stream": settings.stream,
                                "ration_gather": settings.ration_gather, "ration_gather_ms": settings.ration_gather_ms,
                                "ration_thread": settings.ration_thread}


# ---- the result --------------------------------------------------------------------------------


def summarise(runs: Sequence[Run]) -> dict[str, Any]:
    counted = [r for r in runs if not r.warm]
    off = [r for r in counted if r.arm == "off"]
    on = [r for r in counted if r.arm == "on"]
    loss = [-x for x in pct_changes([r.decode_tps for r in off], [r.decode_tps for r in on])]
    ttft = pct_changes([r.ttft_s for r in off], [r.ttft_s for r in on])
    trace = [r.trace["trace_cost_pct"] for r in on]
    estimates = {key: statistics.median([r.trace.get(key, 0.0) for r in on]) if on else 0.0
                 for key in ("trace_chunks_pct", "trace_host_pct")}
    calls = [r.row()["calls_pct"] for r in on]
    return {
        "runs_per_arm": len(on),
        "decode_loss_pct": statistics.median(loss), "ttft_delta_pct": statistics.median(ttft),
        "trace_cost_pct": statistics.median(trace), "calls_pct": statistics.median(calls), **estimates,
        "trace_estimator": on[0].trace.get("trace_estimator", "") if on else "",
        "decode_loss": spread(loss), "ttft_delta": spread(ttft), "trace_cost": spread(trace), "calls": spread(calls),
        "arms": {arm: {"decode_tps": spread([r.decode_tps for r in rs]),
                       "ttft_ms": spread([1e3 * r.ttft_s for r in rs])} for arm, rs in (("off", off), ("on", on))},
    }


def table(result: Mapping[str, Any]) -> str:
    lines = [f"{'run':>3} {'arm':3} {'tok/s':>9} {'TTFT ms':>9} {'decode s':>8} {'chunks':>6} {'trace %':>7} "
             f"{'calls %':>7}"]
    for r in result["runs"]:
        chunks = r.get("ration_chunks", 0) + r.get("idle_in_decode_chunks", 0)
        trace = f"{r['trace_cost_pct']:.2f}" if "trace_cost_pct" in r else "-"
        lines.append(f"{r['run']:>3} {r['arm']:3} {r['decode_tps']:>9.2f} {r['ttft_ms']:>9.1f} {r['decode_s']:>8.2f} "
                     f"{chunks:>6} {trace:>7} {r['calls_pct']:>7.2f}" + ("  (warm-up)" if r["warm_up"] else ""))
    d, t = result["decode_loss"], result["ttft_delta"]
    lines += [
        f"decode loss, paired: median {d['median']:.2f} % (min {d['min']:.2f}, max {d['max']:.2f}; "
        f"{', '.join(f'{x:+.2f}' for x in d['values'])})",
        f"TTFT change, paired: median {t['median']:+.2f} % (min {t['min']:+.2f}, max {t['max']:+.2f})",
        f"trace cost, {result['trace_estimator']}: median {result['trace_cost_pct']:.2f} % (chunk spans "
        f"{result['trace_chunks_pct']:.2f} %, turn spans' host time {result['trace_host_pct']:.2f} %); "
        f"host calls timed by the host: {result['calls_pct']:.2f} %",
        f"off: {result['arms']['off']['decode_tps']['median']:.2f} tok/s, TTFT "
        f"{result['arms']['off']['ttft_ms']['median']:.1f} ms; on: {result['arms']['on']['decode_tps']['median']:.2f} "
        f"tok/s, TTFT {result['arms']['on']['ttft_ms']['median']:.1f} ms",
    ]
    return "\n".join(lines)


def _say(msg: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="folder for the JSON")
    ap.add_argument("--runs", type=int, default=6, help="measured runs per arm (paired off, on, off, on ...)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured (off, on) pairs first")
    ap.add_argument("--main-shape", default="9b", help="the main model's shape: 9b, 4b, 2b, 0.8b, tiny")
    ap.add_argument("--shadow-shape", default=None, help="the shadow's shape (default 0.8b; tiny with a tiny main)")
    ap.add_argument("--sessions", nargs="*", default=None,
                    help=f"relpath[#k] under --raw, or {DEMO!r} (default {list(DEFAULT_SESSIONS)}; the demo "
                         "session without the shared folder)")
    ap.add_argument("--raw", type=Path, default=RAW, help="the sessions folder (default: ../shared/data/sessions/raw, "
                    "else tests/data's subset)")
    ap.add_argument("--turns", type=int, default=6, help="requests served of each session, from its first")
    ap.add_argument("--max-output", type=int, default=0, help="cut each output to this many ids (0: whole)")
    ap.add_argument("--gap-s", type=float, default=0.5, help="idle time after each request (the agent's tool)")
    ap.add_argument("--pause-s", type=float, default=1.0, help="idle time between runs")
    ap.add_argument("--ration", type=float, default=None,
                    help="the ration's share of the decode time (default 0.02 for one agent, as measured before "
                         "issue 18; with --agents the service's own default)")
    ap.add_argument("--agents", type=int, default=1,
                    help="sessions decoding at once in one batched step (benchmarks.ab_cost.agents; CUDA only)")
    ap.add_argument("--history", type=int, default=1,
                    help="--agents: each session's first turns, read by the shadow before a run, not served")
    ap.add_argument("--max-len", type=int, default=12288, help="--agents: leave out sessions longer than this")
    ap.add_argument("--grid", type=int, default=512, help="the shadow's grid")
    ap.add_argument("--main-grid", type=int, default=512, help="rows per prefill pass of the main model")
    ap.add_argument("--main-path", choices=("auto", "fast", "eager"), default="auto",
                    help="auto: the fast path (CUDA graphs) on CUDA, the torch forward elsewhere")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--drain-timeout-s", type=float, default=60.0)
    ap.add_argument("--tmp", default=None, help="where the shadow's random checkpoint is written")
    ap.add_argument("--overlap", action="store_true",
                    help="report each round while the GPU runs the next step (an overlapped engine)")
    ap.add_argument("--stream", choices=("own", "caller"), default="own",
                    help="the reader's CUDA stream (the STREAM setting); caller adds -caller to the file's name")
    ap.add_argument("--smoke", action="store_true", help="1 run per arm, no warm-up, 2 turns, 16 ids of output")
    args = ap.parse_args(argv)
    if args.smoke:
        args.runs, args.warmup, args.turns, args.max_output = 1, 0, 2, args.max_output or 16
        args.gap_s, args.pause_s = min(args.gap_s, 0.3), min(args.pause_s, 0.3)
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1")
    if args.agents > 1:
        from benchmarks.ab_cost.agents import agents_main

        return agents_main(args)
    if args.ration is None:
        args.ration = 0.02
    t_start = time.perf_counter()
    dev_name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if dev_name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here (the CPU smoke run: --main-shape tiny)")
    device = torch.device(dev_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shadow_shape = args.shadow_shape or ("tiny" if args.main_shape == "tiny" else "0.8b")
    fast = args.main_path == "fast" or (args.main_path == "auto" and device.type == "cuda")
    env = environment()  # the commit that runs, before anything else happens
    notes: list[str] = []
    names = args.sessions
    if not names:
        names = list(DEFAULT_SESSIONS) if args.raw.is_dir() else [DEMO]
        if names == [DEMO]:
            notes.append(f"{args.raw} is absent: served the shipped demo session")
    sessions = load_sessions(args.raw, names, args.turns, args.max_output)
    _say(f"{len(sessions)} sessions, {sum(len(s.turns) for s in sessions)} turns, "
         f"{sum(s.output_ids for s in sessions)} output ids a run; device {device}, main {args.main_shape} "
         f"({'fast' if fast else 'eager'}), shadow {shadow_shape}", t_start)

    suffix = "".join(tag for tag, on in (("-overlap", args.overlap), ("-caller", args.stream == "caller"),
                                          ("-smoke", args.smoke),
                                          ("-cpu", device.type == "cpu")) if on)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"ab_cost{suffix}"
    keep_newest(args.out / f"{stem}.json", (".trace.jsonl",))
    trace_path = args.out / f"{stem}.trace.jsonl"
    trace_path.unlink(missing_ok=True)  # the exporter appends
    main_model, main_info = build_main(args.main_shape, device, dtype, args.main_grid, fast)
    _say(f"main model built in {main_info['build_s']:.1f} s, graphs captured in {main_info['capture_s']:.1f} s",
         t_start)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="ab_cost-") as tmp:
        container, service, shadow_info = build_service(Path(tmp), shadow_shape, device, dtype, args.grid,
                                                        args.ration, trace_path, args.stream)
        _say(f"shadow service loaded and warm in {shadow_info['load_and_warm_s']:.1f} s", t_start)
        try:
            schedule = [(arm, True) for _ in range(args.warmup) for arm in ARMS]
            schedule += [(arm, False) for _ in range(args.runs) for arm in ARMS]
            first = time.perf_counter()
            for i, (arm, warm) in enumerate(schedule):
                run = Run(i, arm, warm)
                names_fed = serve_run(main_model, service if arm == "on" else None, sessions, run, args.gap_s,
                                      args.overlap)
                if arm == "on":
                    run.drain_s, run.sessions = drain(service, names_fed, args.grid, args.drain_timeout_s)
                runs.append(run)
                eta = (time.perf_counter() - first) / (i + 1) * (len(schedule) - i - 1)
                _say(f"run {i + 1}/{len(schedule)} {arm}{' (warm-up)' if warm else ''}: {run.decode_tps:.2f} tok/s, "
                     f"TTFT {1e3 * run.ttft_s:.1f} ms; about {eta:.0f} s to go", t_start)
                gc.collect()
                time.sleep(args.pause_s)
        finally:
            service.stop()
            container.shutdown_resources()  # flushes the span exporter
    from shadow.adapters.telemetry import read_jsonl

    spans = read_jsonl(trace_path) if trace_path.exists() else []
    for run in runs:
        run.chunks_during = sum(overlaps(s, [(run.start_ns, run.end_ns)]) for s in chunk_spans(spans))
        if run.arm == "on":
            run.trace = trace_cost(spans, run.turns, args.overlap)
    result: dict[str, Any] = {
        "benchmark": "ab_cost", **env, "smoke": args.smoke, **summarise(runs),
        "main": main_info, "shadow": shadow_info, "sessions": [{"name": s.name, "source": s.source,
                                                                 "turns": len(s.turns), "output_ids": s.output_ids,
                                                                 "prompt_ids": [len(p) for p, _ in s.turns]}
                                                                for s in sessions],
        **common_fields(args, runs, notes, t_start),
    }
    return write_result(result, runs, notes, args.out / f"{stem}.json", trace_path)


def common_fields(args: argparse.Namespace, runs: Sequence[Any], notes: list[str], t_start: float) -> dict[str, Any]:
    """The result's fields every A/B run has (one agent or many)."""
    return {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "off_arm": "service built, loaded and its idle loop running; no host call made",
            "notes": notes, "runs": [r.row() for r in runs], "wall_s": time.perf_counter() - t_start}


def write_result(result: dict[str, Any], runs: Sequence[Any], notes: list[str], out: Path, trace_path: Path) -> int:
    """Notes what spoils the baseline, writes the JSON, prints the table; 1 when a run was spoilt."""
    bad = [r.index for r in runs if r.arm == "off" and r.chunks_during]
    unread = [n for r in runs for n, s in r.sessions.items() if not s["read_all"]]
    if bad:
        notes.append(f"chunks were read during off-runs {bad}: those runs are not a clean baseline")
    if unread:
        notes.append(f"sessions not read to their last whole chunk within --drain-timeout-s: {unread}")
    differ = [n for r in runs for n, s in r.sessions.items() if not s["equal_fresh"]]
    checked = sum(len(r.sessions) for r in runs)
    result["exact"] = {"sessions_checked": checked, "equal_to_fresh_prefill": checked - len(differ), "differ": differ}
    notes.append(f"exact: {checked - len(differ)} of {checked} sessions equal to a fresh prefill of the ids read")
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(table(result))
    for n in notes:
        print(f"note: {n}")
    print(f"wrote {out} and {trace_path.name} in {result['wall_s']:.0f} s")
    return 1 if bad or unread or differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
