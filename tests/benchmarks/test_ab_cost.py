"""``benchmarks/ab_cost.py`` on the CPU: the paired arithmetic, the cost read back from real chunk
spans, the turn driver calling a real service through the host interface in an engine's order on a
real session's turns, and the smoke run of the whole script (a tiny main model and shadow)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.ab_cost.arithmetic import pct_changes, spread, trace_cost
from benchmarks.ab_cost.engine import TurnTiming, build_main, serve_turn
from benchmarks.ab_cost.run import Run, build_service, load_sessions, main, summarise
from shadow.adapters.telemetry import SpanTelemetry, span_record
from shadow.core.records import ChunkRead

SESSION = "mini-swe-agent-gemini3-swebench/django__django-16527.traj.json"  # 1.4k-id first prompts
CPU = torch.device("cpu")


def test_paired_changes_and_their_spread() -> None:
    assert pct_changes([100.0, 50.0, 20.0], [98.0, 51.0, 20.0]) == pytest.approx([-2.0, 2.0, 0.0])
    s = spread([3.0, -1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["mean"]) == (2.5, -1.0, 10.0, 3.5)
    with pytest.raises(ValueError, match="as many runs"):
        pct_changes([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="not positive"):
        pct_changes([0.0], [1.0])


def _turn(rid: str, decode_s: float, tokens: int, ttft_s: float, start_ns: int = 0) -> TurnTiming:
    return TurnTiming(rid, "s", 10, tokens + 1, ttft_s, decode_s, tokens,
                      decode_start_ns=start_ns, decode_end_ns=start_ns + int(decode_s * 1e9))


def test_summary_pairs_runs_in_order_and_leaves_out_the_warm_up() -> None:
    runs = []
    # (arm, warm, decode seconds for 100 tokens, TTFT): the warm-up pair is wildly off and must not count
    for i, (arm, warm, dec, ttft) in enumerate([("off", True, 9.0, 5.0), ("on", True, 1.0, 0.1),
                                                 ("off", False, 1.00, 0.200), ("on", False, 1.02, 0.202),
                                                 ("off", False, 1.00, 0.200), ("on", False, 1.01, 0.198)]):
        run = Run(i, arm, warm, [_turn(f"r{i}", dec, 100, ttft)])
        run.trace = {"trace_cost_pct": 1.5 if arm == "on" else 0.0}
        runs.append(run)
    got = summarise(runs)
    assert got["runs_per_arm"] == 2
    loss = [100 * (100 - 100 / 1.02) / 100, 100 * (100 - 100 / 1.01) / 100]
    assert got["decode_loss"]["values"] == pytest.approx(loss)  # positive: the on-run decodes slower
    assert got["decode_loss_pct"] == pytest.approx(sum(loss) / 2)
    assert got["ttft_delta"]["values"] == pytest.approx([1.0, -1.0])
    assert got["trace_cost_pct"] == 1.5
    assert got["arms"]["off"]["decode_tps"]["median"] == pytest.approx(100.0)


def _span_records(chunks: list[tuple[str, ChunkRead, int, int, dict[str, Any] | None]],
                  turns: tuple[tuple[str, float], ...] = ()) -> list[dict[str, Any]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = SpanTelemetry(provider, "m")
    for window, chunk, t0, t1, attrs in chunks:
        telemetry.chunk(window, chunk, 0, t0, t1, attrs)  # type: ignore[arg-type]
    for request_id, host_ms in turns:  # what the service writes when a request finishes
        with telemetry.span("shadow.turn", {"gen_ai.conversation.id": "x", "shadow.request.id": request_id,
                                            "shadow.turn.host_ms": host_ms}):
            pass
    return [span_record(s) for s in exporter.get_finished_spans()]


def test_trace_cost_counts_the_runs_ration_and_idle_chunks_inside_its_decodes() -> None:
    s = 10**9
    turns = [_turn("a", 1.0, 50, 0.1, start_ns=10 * s), _turn("b", 1.0, 50, 0.1, start_ns=20 * s)]
    records = _span_records([
        ("ration", ChunkRead("x", 0, 512, 0.010), 10 * s + 1000, 10 * s + 2000, {"shadow.request.id": "a"}),
        ("ration", ChunkRead("x", 512, 512, 0.004), 20 * s + 1000, 20 * s + 2000, {"shadow.request.id": "b"}),
        ("ration", ChunkRead("y", 0, 512, 0.500), 20 * s + 1000, 20 * s + 2000, {"shadow.request.id": "other"}),
        ("idle", ChunkRead("x", 1024, 512, 0.006), 21 * s - 1000, 21 * s + 1000, None),  # overlaps b's decode
        ("idle", ChunkRead("x", 1536, 512, 0.300), 15 * s, 16 * s, None),  # in the gap: not during a decode
    ], turns=(("a", 30.0), ("b", 10.0), ("other", 900.0)))
    got = trace_cost(records, turns)
    assert got["ration_chunks"] == 2 and got["ration_ms"] == pytest.approx(14.0)
    assert got["idle_in_decode_chunks"] == 1 and got["idle_in_decode_ms"] == pytest.approx(6.0)
    assert got["trace_chunks_pct"] == pytest.approx(100 * 0.020 / 2.0)
    # a host that waits on its calls pays their time: 40 ms of these two requests' 2 s of decode
    assert got["turn_spans"] == 2 and got["trace_host_pct"] == pytest.approx(100 * 0.040 / 2.0)
    assert got["trace_cost_pct"] == got["trace_host_pct"]
    assert trace_cost(records, turns, overlap=True)["trace_cost_pct"] == got["trace_chunks_pct"]
    assert got["ration_share_max_pct"] == pytest.approx(1.0)  # request a: 10 ms of its 1 s decode


class Recorder:
    """The real service, with every host call it receives written down."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.spent_ms = 0.0  # what the rounds' results said the ration read
        self.account: Any = None  # the turn's own account, as ``finished`` gave it

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.service, name)

        def call(*args: Any, **kw: Any) -> Any:
            self.calls.append((name, args, kw))
            got = target(*args, **kw)
            if name == "round_ended":
                self.spent_ms += got.spent_ms
            elif name == "finished":
                self.account = got
            return got
        return call


@pytest.fixture(scope="module")
def real_turns(shared_data: Path) -> list[tuple[list[int], list[int]]]:
    served = load_sessions(shared_data / "sessions" / "raw", [SESSION], turns=2, max_output=8)
    assert served[0].source.startswith(SESSION) and len(served[0].turns) == 2
    return served[0].turns


@pytest.mark.parametrize(("overlap", "thread"), [pytest.param(False, False, marks=pytest.mark.slow), (True, True)],
                         ids=["blocking-ration-in-round", "overlapped-ration-thread"])
def test_a_turn_reports_to_the_host_as_an_engine_does(real_turns, tmp_path: Path, overlap: bool, thread: bool,
                                                      monkeypatch) -> None:
    """Blocking or overlapped (each round reported while the next step runs): the same calls, the
    same ids in the same order, and the shadow holds what was served. The turn's ration is the
    turn's own account; read in the round, the rounds' results add up to it, and read on the
    ration's thread, a round only decides (its result carries no time)."""
    monkeypatch.setenv("QWEN38_SHADOW_RATION_THREAD", "true" if thread else "false")
    main_model, info = build_main("tiny", CPU, torch.float32, 512, fast=False)
    assert info["path"] == "eager" and info["capture_s"] == 0.0
    container, service, _ = build_service(tmp_path, "tiny", CPU, torch.float32, 512, 0.02, tmp_path / "t.jsonl")
    try:
        host = Recorder(service)
        held: list[int] = []
        for k, (prompt, output) in enumerate(real_turns):
            rid = f"req-{k}"
            t = serve_turn(main_model, host, rid, "sess", prompt, output, overlap)  # type: ignore[arg-type]
            names = [c[0] for c in host.calls]
            assert names == ["arrived", "started", "first_token"] + ["round_ended"] * len(output) + ["finished"]
            assert host.calls[0][1] == (rid,)
            assert host.calls[1][1] == (rid, "sess") and host.calls[1][2] == {"ids": prompt}
            rounds = [c[1] for c in host.calls if c[0] == "round_ended"]
            assert rounds == [(rid, [i]) for i in output]  # one round a token, the real ids in order
            assert host.calls[-1][1] == (rid,)
            assert t.calls == ["arrived", "started", "first_token", f"round_ended x{len(output)}", "finished"]
            assert t.decode_tokens == len(output) - 1 and t.output_ids == len(output) == 8
            assert 0 < t.start_calls_s < t.ttft_s and 0 < t.calls_s < t.decode_s
            assert t.ration_ms == pytest.approx(host.account.spent_s * 1e3)
            assert t.ration_chunks == host.account.chunks
            if thread:
                assert host.spent_ms == 0.0
            else:
                assert t.ration_ms == pytest.approx(host.spent_ms)
            assert t.decode_start_ns < t.decode_end_ns
            assert main_model.state.length == 0  # the sequence is ended; the next prefill starts afresh
            # the shadow holds exactly what the host served: what the new prompt keeps, then the outputs
            held = prompt + output
            assert list(service.slot.get().session_ids("sess")) == held
            host.calls.clear()
            host.spent_ms = 0.0
        off = serve_turn(main_model, None, "req-off", "sess-off", *real_turns[0])
        assert off.calls == [] and off.calls_s == 0.0 and off.ration_ms == 0.0
        assert off.decode_tokens == len(real_turns[0][1]) - 1
        assert "sess-off" not in service.slot.get().sessions()
    finally:
        service.stop()
        container.shutdown_resources()


@pytest.mark.slow
def test_the_cpu_smoke_run_writes_the_paired_result(shared_data: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    # the ration in the round: every slice ends inside its turn, so the turns' accounts and the spans
    # must agree to the chunk (on its own thread, a slice that ends after its turn is in spans only)
    monkeypatch.setenv("QWEN38_SHADOW_RATION_THREAD", "false")
    code = main(["--out", str(tmp_path), "--main-shape", "tiny", "--smoke", "--raw",
                 str(shared_data / "sessions" / "raw"), "--sessions", SESSION, "--max-output", "12"])
    out = capsys.readouterr().out
    files = list(tmp_path.glob("ab_cost*.json"))
    assert len(files) == 1, out
    r = json.loads(files[0].read_text())
    assert code == 0, (out, r["notes"])
    assert files[0].name == "ab_cost-smoke-cpu.json"
    assert r["gpu"] == "cpu" and r["commit"] and r["date"] and r["smoke"] is True
    assert r["runs_per_arm"] == 1
    for key in ("decode_loss_pct", "ttft_delta_pct", "trace_cost_pct", "calls_pct"):
        assert isinstance(r[key], float), key
    assert r["main"]["path"] == "eager" and r["shadow"]["shape"] == "tiny"
    off, on = r["runs"]
    assert (off["arm"], on["arm"]) == ("off", "on") and not off["warm_up"]
    assert off["decode_tokens"] == on["decode_tokens"] == 2 * 11
    # the off-run made no call and no chunk was read while it ran
    assert all(t["calls"] == [] for t in off["turns"]) and off["chunks_during_run"] == 0
    # the on-run's session was read to its last whole chunk, by the idle window or the ration
    (name, sess), = on["sessions"].items()
    assert sess["read_all"] and sess["committed"] >= 512 and name.startswith("ab-01-on")
    # the spans and the host's round results see the same chunks
    assert on["ration_ms"] == pytest.approx(on["host_ration_ms"], rel=1e-6)
    assert on["ration_chunks"] == on["host_ration_chunks"]
    assert on["trace_cost_pct"] == pytest.approx(r["trace_cost_pct"])
    # every request's account came back as a span, and it saw about the time the host timed
    assert on["turn_spans"] == 2 and on["trace_cost_pct"] == on["trace_host_pct"]
    assert 0.5 * on["calls_pct"] <= on["trace_host_pct"] <= 1.5 * on["calls_pct"]
    assert r["decode_loss"]["values"] == pytest.approx([100 * (off["decode_tps"] - on["decode_tps"])
                                                        / off["decode_tps"]])
    trace = tmp_path / files[0].name.replace(".json", ".trace.jsonl")
    assert trace.is_file() and trace.stat().st_size > 0
    assert "decode loss, paired" in out


@pytest.mark.gpu
def test_the_gpu_smoke_run_decodes_on_the_captured_step(tmp_path: Path) -> None:
    code = main(["--out", str(tmp_path), "--main-shape", "0.8b", "--smoke", "--sessions", "demo"])
    r = json.loads((tmp_path / "ab_cost-smoke.json").read_text())
    assert code == 0, r["notes"]
    assert r["main"]["path"] == "fast, CUDA graphs" and r["main"]["capture_s"] > 0
    assert r["shadow"]["fast_report"]["graphs"] is True


class StepRecorder:
    """``BatchDecoder``'s interface without a model: each launch's tokens and active slots kept."""

    def __init__(self, agents: int) -> None:
        self.agents = agents
        self.prefills: list[tuple[int, int]] = []
        self.launches: list[tuple[list[int], list[int]]] = []

    def prefill(self, slot: int, ids: list[int]) -> int:
        self.prefills.append((slot, len(ids)))
        return 0

    def launch(self, tokens: list[int], active: list[int]) -> Any:
        self.launches.append((list(tokens), list(active)))
        return lambda: [0] * self.agents


@pytest.mark.parametrize("overlap", [False, True])
def test_agents_decode_together_and_report_as_an_engine_does(real_turns, tmp_path: Path, overlap: bool) -> None:
    """``--agents``: every agent's turns are served with each step advancing all agents in flight;
    each request's host calls come in an engine's order with the real ids, a step feeds each agent
    its previous real id, and the decode counts every agent's tokens once."""
    from benchmarks.ab_cost.agents import serve_agents

    container, service, _ = build_service(tmp_path, "tiny", CPU, torch.float32, 512, 0.02, tmp_path / "t.jsonl")
    try:
        host = Recorder(service)
        dec = StepRecorder(3)
        sessions = [(f"a{j}", real_turns) for j in range(3)]
        done, secs, tokens, steps = serve_agents(dec, host, sessions, gap_s=0.01, overlap=overlap)  # type: ignore[arg-type]
        outputs = [len(o) for _, o in real_turns]
        assert len(done) == 3 * len(real_turns) and tokens == 3 * sum(n - 1 for n in outputs) and secs > 0
        assert sum(len(active) for _, active in dec.launches) == tokens and steps == len(dec.launches)
        assert max(len(active) for _, active in dec.launches) == 3  # the agents decode together
        assert sorted(dec.prefills) == sorted((j, len(p)) for j in range(3) for p, _ in real_turns)
        for j in range(3):
            for k, (_, output) in enumerate(real_turns):
                rid = f"a{j}-t{k}"
                mine = [(c[0], c[1]) for c in host.calls if c[1] and c[1][0] == rid]
                assert [n for n, _ in mine] == ["arrived", "started", "first_token"] + ["round_ended"] * len(output) \
                    + ["finished"]
                assert [args[1] for n, args in mine if n == "round_ended"] == [[i] for i in output]
            fed = [tokens[j] for tokens, active in dec.launches if j in active]
            assert fed == [i for _, o in real_turns for i in o[:-1]]  # teacher forcing: the previous real id
            assert list(service.slot.get().session_ids(f"a{j}")) == real_turns[-1][0] + real_turns[-1][1]
    finally:
        service.stop()
        container.shutdown_resources()


@pytest.mark.gpu
def test_the_gpu_agents_smoke_run_decodes_all_agents_in_one_step(tmp_path: Path) -> None:
    """``--agents``: the main model decodes its agents in one captured step of one row each, and
    the shadow follows every agent's session to its last whole chunk."""
    code = main(["--out", str(tmp_path), "--main-shape", "0.8b", "--smoke", "--sessions", "demo", "--agents", "3"])
    r = json.loads((tmp_path / "ab_cost-agents-smoke.json").read_text())
    assert code == 0, r["notes"]
    assert r["agents"] == 3 and r["main"]["agents"] == 3 and r["main"]["capture_s"] > 0
    off, on = r["runs"]
    assert off["decode_tokens"] == on["decode_tokens"] > 0 and off["chunks_during_run"] == 0
    assert max(s["tokens"] / s["steps"] for s in r["steps"].values()) > 1  # agents shared the steps
    assert len(on["sessions"]) == 3 and all(s["read_all"] for s in on["sessions"].values())
