"""``ab_cost --agents N``: the main model decodes N sessions at once, as a serving engine batches
its requests, and the shadow follows all of them (issue 18).

``BatchDecoder`` is the 9B stand-in as an engine runs it: a prompt is prefilled alone (the fast
path's fork, as for one agent), then every agent that is decoding advances one token in one
captured step of N rows (one row a session; padding rows for the agents between turns). The step
is this project's fast forward (``FastForward``'s pieces: GEMMs over the N rows, the conv and GDN
per session on N state slots) with decode attention over each session's own KV rows in one call
(a padded KV buffer of ``max_len`` rows a session and a mask by length, as a paged engine's decode
kernel reads only what each session holds), and the greedy token of every row, all in one CUDA
graph. The ids fed are the sessions' real output ids (teacher forcing): the shadow gets the real
ids, the same in every run; the main model's choices do not matter, its pace does.

``serve_agents`` is one run: each agent serves its session's turns one after the other with the
tool gap between them; all agents start together, so their turns soon interleave. Prefills run
between decode steps (an engine without chunked prefill). The host calls are those of
``engine.serve_turn``, per request, in an engine's order; with ``overlap`` each step's rounds
are reported while the device runs the next step. The decode rate is the tokens of all steps over
the wall time of the steps (host calls included); prefills and gaps are outside it.

Steady state, not a cold start: before an on-run's clock starts, the shadow is told each
session's turns before the served ones and its idle window reads them, as it would have while
following those agents all along. So the run measures what following 16 busy agents costs, not
what catching up on 16 new sessions costs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.ab_cost.engine import TurnTiming, _sync
from shadow.backends.qwen35 import ModelState, Qwen35

BUCKET = 1024


class BatchDecoder:
    """``prefill(slot, ids)`` then ``launch(tokens)`` for all ``agents`` slots at once (CUDA)."""

    def __init__(self, model: Qwen35, grid: int, agents: int, max_len: int) -> None:
        from shadow.backends.qwen35 import kernels
        from shadow.backends.qwen35.fast.forward import FastForward
        from shadow.backends.qwen35.fast.slots import StateSlots
        from shadow.backends.qwen35.fast.staging import Rows

        if model.device.type != "cuda":
            raise SystemExit("--agents needs CUDA: the batched decode step is a captured graph")
        cfg = model.config
        self.model, self.agents, self.grid = model, agents, grid
        # a prefill's padded pass writes up to a grid past the prompt; whole buckets
        self.max_len = -(-(max_len + grid) // BUCKET) * BUCKET
        self.fast = FastForward(model, grid, batches=(1,))
        dev, dt = model.device, model.dtype
        kvh, hd = cfg.num_key_value_heads, cfg.head_dim
        shape = (agents, self.max_len, kvh, hd)
        self.k = [torch.zeros(shape, device=dev, dtype=dt) for _ in cfg.full_layers]
        self.v = [torch.zeros(shape, device=dev, dtype=dt) for _ in cfg.full_layers]
        # every agent's conv and recurrent state in its own slot, for good: no copies per step
        self.own = StateSlots(cfg, agents, grid, dev, dt)
        self.conv, self.rec = self.own.conv, self.own.recurrent
        self.fresh = ModelState.empty(cfg, dev, dt)  # a new sequence's conv and recurrent state (read only)
        self.lengths = [0] * agents
        self.rows = Rows.make(agents, 1, torch.zeros(agents, cfg.num_attention_heads, hd, device=dev, dtype=dt), dev)
        if self.fast.chunked(agents):
            self.rows.solve = torch.zeros(1, agents, cfg.linear_num_value_heads, kernels.FLA_CHUNK, device=dev,
                                          dtype=dt)
        self.positions = torch.arange(self.max_len, device=dev)
        self.slots = torch.arange(agents, device=dev)
        self.tokens = torch.zeros(agents, dtype=torch.long, device=dev)
        # one graph per attended length, in steps of BUCKET rows: a step reads the KV rows up to the
        # longest session's, not the whole padded buffer
        self.graphs: dict[int, Any] = {}
        self.capture_s = 0.0

    def warm_up(self) -> float:
        """The fast path's own graphs (prefill), then the batched step's graph."""
        t0 = time.perf_counter()
        self.fast.warm_up()
        r, dev = self.rows, self.model.device
        r.valid.fill_(1)
        r.starts.zero_()
        stream = torch.cuda.Stream(dev)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(dev))
        with self.fast.on_slots(self.own):  # the step's graph keeps the agents' slots' addresses
            for rows in range(self.max_len, 0, -BUCKET):  # largest first: the pool is shared
                with torch.cuda.stream(stream):
                    self._step(rows)  # compile and settle the allocator first
                torch.cuda.current_stream(dev).wait_stream(stream)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.fast.graphs.pool, stream=stream):
                    self._step(rows)
                self.graphs[rows] = g
        _sync(dev)
        self.capture_s = time.perf_counter() - t0
        return self.capture_s

    def _step(self, rows: int) -> None:
        fast, r, cfg = self.fast, self.rows, self.model.config
        kvh, hd = cfg.num_key_value_heads, cfg.head_dim
        group = cfg.num_attention_heads // kvh
        for j in range(fast.n_attn):
            fast.piece(r, j)
            q, k, v = r.qkv[j]
            starts = r.starts
            self.k[j].index_put_((self.slots, starts), k)
            self.v[j].index_put_((self.slots, starts), v)
            hidden = (self.positions[None, :rows] > starts[:, None])[:, None, :]  # [agents, 1, rows]
            q4 = q.view(self.agents, kvh, group, hd)
            out = r.attn.view(self.agents, kvh, group, hd)
            for h in range(kvh):  # strided batched GEMMs over each slot's rows: the KV is read once, in place
                scores = torch.bmm(q4[:, h], self.k[j][:, :rows, h].transpose(1, 2)).float() * hd ** -0.5
                p = scores.masked_fill_(hidden, float("-inf")).softmax(-1).to(q.dtype)
                out[:, h].copy_(torch.bmm(p, self.v[j][:, :rows, h]))
        fast.piece(r, fast.n_attn)
        assert r.h is not None and r.delta is not None
        x = torch.empty_like(r.h)
        from shadow.backends.qwen35 import kernels

        kernels.rms_norm(r.h, fast.final_norm, fast.eps, x, add=r.delta)
        self.tokens.copy_(F.linear(x, self.model.lm_head).argmax(-1))

    def prefill(self, slot: int, ids: Sequence[int]) -> int:
        """A new sequence in ``slot``: the prompt through the fast path's fork (slot 0 of its own
        buffers), its KV rows straight into the slot's, then its conv and recurrent state moved in."""
        state = ModelState(self.model.config, self.model.device, self.model.dtype, 0,
                           [k[slot] for k in self.k], [v[slot] for v in self.v], self.fresh.conv,
                           self.fresh.recurrent)
        if len(ids) + self.grid > self.max_len:
            raise ValueError(f"a prompt of {len(ids)} ids does not fit max_len {self.max_len}")
        fork = self.fast.fork(list(ids), state)
        self.conv[:, slot].copy_(self.fast.slots.conv[:, 0])
        self.rec[:, slot].copy_(self.fast.slots.recurrent[:, 0])
        self.lengths[slot] = len(ids)
        assert fork.logits is not None
        return int(fork.logits.reshape(-1, fork.logits.shape[-1])[-1].argmax())

    def launch(self, tokens: Sequence[int], active: Sequence[int]) -> Callable[[], list[int]]:
        """One token for every slot (``tokens[slot]``; the others' rows are padding whose writes land
        above their length, scratch until their next prefill); returns what waits and reads back."""
        r = self.rows
        r.stage(torch.tensor(list(tokens), dtype=torch.long), self.lengths, 1)
        longest = max(self.lengths[a] for a in active) + 1
        self.graphs[min(-(-longest // BUCKET) * BUCKET, self.max_len)].replay()
        for a in active:
            self.lengths[a] += 1
        return lambda: self.tokens.tolist()


@dataclass
class Agent:
    slot: int
    name: str  # the session's name for the shadow in this run
    turns: list[tuple[list[int], list[int]]]
    next_turn: int = 0
    ready_at: float = 0.0  # perf_counter time its next request arrives
    rid: str = ""
    pos: int = 0  # output ids produced in the turn in flight (0: none in flight)
    timing: dict[str, Any] = field(default_factory=dict)


def serve_agents(dec: BatchDecoder, host: Any, sessions: Sequence[tuple[str, list[tuple[list[int], list[int]]]]],
                 gap_s: float, overlap: bool) -> tuple[list[TurnTiming], float, int, int]:
    """One run: every agent serves its turns; returns (turn timings, steps' wall seconds, decode
    tokens, steps)."""
    agents = [Agent(i, name, turns) for i, (name, turns) in enumerate(sessions)]
    start = time.perf_counter()
    for a in agents:
        a.ready_at = start
    done: list[TurnTiming] = []
    steps_s, tokens, steps = 0.0, 0, 0
    calls_s: dict[str, float] = {}

    def call(rid: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        got = fn()
        calls_s[rid] = calls_s.get(rid, 0.0) + time.perf_counter() - t0
        return got

    def round_ended(a: Agent, new: int) -> None:
        call(a.rid, lambda: host.round_ended(a.rid, [new]))

    def finish(a: Agent) -> None:
        prompt, output = a.turns[a.next_turn]
        if host is not None:
            if overlap:
                round_ended(a, output[-1])
            done_turn = host.finished(a.rid)
            a.timing["ration_ms"], a.timing["chunks"] = done_turn.spent_s * 1e3, done_turn.chunks  # its account
        t = a.timing
        end, end_ns = time.perf_counter(), time.time_ns()
        done.append(TurnTiming(a.rid, a.name, len(prompt), len(output), t["ttft_s"], end - t["first"],
                               len(output) - 1, calls_s.get(a.rid, 0.0), t["start_calls_s"], t["ration_ms"],
                               t["chunks"], t["first_ns"], end_ns))
        a.next_turn += 1
        a.pos = 0
        a.ready_at = end + gap_s

    while True:
        now = time.perf_counter()
        for a in agents:  # arrivals: prefill each (the engine pauses its decode for it)
            if a.pos == 0 and a.next_turn < len(a.turns) and a.ready_at <= now:
                prompt, output = a.turns[a.next_turn]
                a.rid = f"{a.name}-t{a.next_turn}"
                t_arr = time.perf_counter()
                if host is not None:
                    host.arrived(a.rid)
                    host.started(a.rid, a.name, ids=list(prompt))
                t_fed = time.perf_counter()
                dec.prefill(a.slot, prompt)
                a.timing = {"ttft_s": time.perf_counter() - t_arr, "first": time.perf_counter(),
                            "first_ns": time.time_ns(), "start_calls_s": t_fed - t_arr, "ration_ms": 0.0, "chunks": 0}
                a.pos = 1
                if host is not None:
                    call(a.rid, functools.partial(host.first_token, a.rid))
                    if not overlap:
                        round_ended(a, output[0])
                if len(output) == 1:
                    finish(a)
        active = [a for a in agents if a.pos > 0]
        if not active:
            waiting = [a.ready_at for a in agents if a.next_turn < len(a.turns)]
            if not waiting:
                break
            time.sleep(max(0.0, min(waiting) - time.perf_counter()))  # the tools run: the idle window's turn
            continue
        feed = [0] * dec.agents
        for a in active:
            feed[a.slot] = a.turns[a.next_turn][1][a.pos - 1]
        t0 = time.perf_counter()
        wait = dec.launch(feed, [a.slot for a in active])
        if host is not None and overlap:
            for a in active:
                round_ended(a, a.turns[a.next_turn][1][a.pos - 1])  # the round before, while this step runs
        wait()
        if host is not None and not overlap:
            for a in active:
                round_ended(a, a.turns[a.next_turn][1][a.pos])
        steps_s += time.perf_counter() - t0
        tokens += len(active)
        steps += 1
        for a in active:
            a.pos += 1
            if a.pos == len(a.turns[a.next_turn][1]):
                finish(a)
    return done, steps_s, tokens, steps


# ---- the benchmark ---------------------------------------------------------------------------


def default_sessions(raw: Path) -> list[str]:
    """Every session under ``raw`` (``file#k`` for each session of a file with several), sorted."""
    from shadow.adapters.transcripts import load_transcript

    names = []
    for path in sorted(p for p in raw.rglob("*") if p.is_file() and p.name not in ("LICENSE", "SOURCES.md")):
        try:
            found = load_transcript(path)
        except Exception:  # not a session file (a licence, notes): skipped
            continue
        rel = str(path.relative_to(raw))
        names += [rel] if len(found) == 1 else [f"{rel}#{k}" for k in range(len(found))]
    return names


def build_decoder(name: str, device: torch.device, dtype: torch.dtype, grid: int, agents: int, max_len: int,
                  seed: int = 1) -> tuple[BatchDecoder, dict[str, Any]]:
    """Random weights at shape ``name`` (as ``engine.build_main``), decoding ``agents`` at once."""
    from benchmarks.ab_cost.engine import random_model

    t0 = time.perf_counter()
    model, params = random_model(name, device, dtype, seed)
    dec = BatchDecoder(model, grid, agents, max_len)
    _sync(device)
    built = time.perf_counter() - t0
    capture = dec.warm_up()
    return dec, {"shape": name, "params": params, "build_s": built, "capture_s": capture,
                 "path": f"fast: prefill through the fork's graphs, decode in one graph of {agents} rows",
                 "agents": agents, "max_len": dec.max_len, "grid": grid, "dtype": str(dtype).removeprefix("torch.")}


def feed_history(service: Any, names: Sequence[str], history: Sequence[list[tuple[list[int], list[int]]]],
                 grid: int, timeout_s: float) -> float:
    """Tell the shadow each session's turns before the served ones and let its idle window read
    them (the steady state of agents followed all along); seconds taken."""
    t0 = time.perf_counter()
    for name, turns in zip(names, history, strict=True):
        for prompt, output in turns:
            service.feed_prompt(name, list(prompt))
            service.feed_output(name, list(output))
    shadow = service.slot.get()
    while any(shadow.backlogs().get(n, 0) >= grid for n in names) and time.perf_counter() - t0 < timeout_s:
        time.sleep(0.02)
    return time.perf_counter() - t0


def agents_main(args: Any) -> int:
    """``ab_cost --agents N``: as ``ab_cost.main``, with N agents decoding at once."""
    import gc
    import tempfile

    from benchmarks.ab_cost.arithmetic import chunk_spans, overlaps, trace_cost
    from benchmarks.ab_cost.run import (
        ARMS,
        Run,
        build_service,
        common_fields,
        drain,
        load_sessions,
        summarise,
        write_result,
    )
    from benchmarks.common import environment, keep_newest
    from shadow.adapters.telemetry import read_jsonl

    t_start = time.perf_counter()
    if not torch.cuda.is_available():
        raise SystemExit("--agents needs CUDA (the batched decode step is a captured graph)")
    device, dtype = torch.device("cuda"), torch.bfloat16
    env = environment()
    names = args.sessions or default_sessions(args.raw)
    if not names:
        raise SystemExit(f"--agents: no session under {args.raw}")
    served = load_sessions(args.raw, names, args.turns + args.history, args.max_output)
    served = [s for s in served if len(s.turns) > args.history]
    # sessions that fit: the step attends up to the longest session's rows (a paged engine reads
    # each session's own), so one very long session would slow every step of the main model
    long = [s.name for s in served if max(len(p) + len(o) for p, o in s.turns) > args.max_len]
    served = [s for s in served if s.name not in long]
    if not served:
        raise SystemExit(f"--agents: no session within --max-len {args.max_len}")
    picks = [served[i % len(served)] for i in range(args.agents)]
    max_len = max(len(p) + len(o) for s in picks for p, o in s.turns)
    dec, main_info = build_decoder(args.main_shape, device, dtype, args.main_grid, args.agents, max_len)
    print(f"[{time.perf_counter() - t_start:6.1f} s] main model built, graphs captured in "
          f"{main_info['capture_s']:.1f} s; {args.agents} agents over {len(served)} sessions", flush=True)
    suffix = "-agents" + "".join(tag for tag, on in (("-overlap", args.overlap), ("-caller", args.stream == "caller"),
                                                     ("-smoke", args.smoke)) if on)
    stem = f"ab_cost{suffix}"
    args.out.mkdir(parents=True, exist_ok=True)
    keep_newest(args.out / f"{stem}.json", (".trace.jsonl",))
    trace_path = args.out / f"{stem}.trace.jsonl"
    trace_path.unlink(missing_ok=True)
    runs: list[Run] = []
    steps: dict[int, tuple[float, int, int, float]] = {}  # run -> (steps' seconds, tokens, steps, history s)
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="ab_cost-") as tmp:
        container, service, shadow_info = build_service(Path(tmp), args.shadow_shape or "0.8b", device, dtype,
                                                        args.grid, args.ration, trace_path, args.stream)
        print(f"[{time.perf_counter() - t_start:6.1f} s] shadow loaded and warm in "
              f"{shadow_info['load_and_warm_s']:.1f} s", flush=True)
        try:
            schedule = [(arm, True) for _ in range(args.warmup) for arm in ARMS]
            schedule += [(arm, False) for _ in range(args.runs) for arm in ARMS]
            for i, (arm, warm) in enumerate(schedule):
                run = Run(i, arm, warm)
                agent_names = [f"ab-{i:02d}-{arm}-a{j}" for j in range(args.agents)]
                hist_s = 0.0
                if arm == "on":
                    hist_s = feed_history(service, agent_names, [s.turns[:args.history] for s in picks],
                                          args.grid, args.drain_timeout_s)
                run.start_ns = time.time_ns()
                sessions = [(n, s.turns[args.history:]) for n, s in zip(agent_names, picks, strict=True)]
                run.turns, secs, tokens, n_steps = serve_agents(dec, service if arm == "on" else None, sessions,
                                                                args.gap_s, args.overlap)
                run.end_ns = time.time_ns()
                run.steps_s, run.step_tokens = secs, tokens
                steps[i] = (secs, tokens, n_steps, hist_s)
                if arm == "on":
                    run.drain_s, run.sessions = drain(service, agent_names, args.grid, args.drain_timeout_s)
                runs.append(run)
                print(f"[{time.perf_counter() - t_start:6.1f} s] run {i + 1}/{len(schedule)} {arm}"
                      f"{' (warm-up)' if warm else ''}: {run.decode_tps:.1f} tok/s over {n_steps} steps "
                      f"({tokens / max(n_steps, 1):.1f} agents a step)", flush=True)
                gc.collect()
                time.sleep(args.pause_s)
        finally:
            service.stop()
            container.shutdown_resources()
    spans = read_jsonl(trace_path) if trace_path.exists() else []
    for run in runs:
        run.chunks_during = sum(overlaps(s, [(run.start_ns, run.end_ns)]) for s in chunk_spans(spans))
        if run.arm == "on":
            t = trace_cost(spans, run.turns, args.overlap)
            # the turns overlap in time: the shares are over the steps' wall time, not the turns' sum
            host_ms = t["trace_host_pct"] / 100 * sum(x.decode_s for x in run.turns) * 1e3
            t["trace_chunks_pct"] = 100 * (t["ration_ms"] + t["idle_in_decode_ms"]) / (1e3 * run.steps_s)
            t["trace_host_pct"] = 100 * host_ms / (1e3 * run.steps_s)
            t["trace_cost_pct"] = t["trace_chunks_pct"] if args.overlap else t["trace_host_pct"]
            run.trace = t
    notes = [f"left out, longer than --max-len {args.max_len} ids: {long}"] if long else []
    notes += [f"{args.agents} agents over {len(served)} sessions (agent j serves session j mod {len(served)} under "
             f"its own name); turns {args.history}..{args.history + args.turns - 1} served, the turns before "
             "read by the shadow before each on-run's clock starts"]
    result: dict[str, Any] = {
        "benchmark": "ab_cost", **env, "agents": args.agents, "smoke": args.smoke, **summarise(runs),
        "main": main_info, "shadow": shadow_info,
        "sessions": [{"name": s.name, "source": s.source, "turns": len(s.turns) - args.history} for s in served],
        "steps": {str(i): {"steps_s": a, "tokens": b, "steps": c, "history_s": d} for i, (a, b, c, d) in steps.items()},
        **common_fields(args, runs, notes, t_start),
    }
    return write_result(result, runs, notes, args.out / f"{stem}.json", trace_path)
