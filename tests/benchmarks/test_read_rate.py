"""``benchmarks/read_rate.py`` on the CPU: the smoke run walks every path (ours, eager, the peer in
transformers' torch fallback, a real session's exactness with a fresh prefill in another process)
and writes the results file; and the FLOP count it divides by is the count the forward runs."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.read_rate import floor
from benchmarks.read_rate.run import main
from shadow.backends.qwen35 import Qwen35, Qwen35Config
from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.backends.qwen35.config import reference_shape
from shadow.backends.qwen35.weights import expected_shapes

SESSION = "sessions/raw/mini-swe-agent-gemini3-swebench/django__django-16527.traj.json"
ROW_KEYS = {"model", "figure", "depth", "ours_ms", "eager_ms", "peer_ms", "floor_ms", "floor_bound"}


@pytest.mark.slow
def test_cpu_smoke_run_writes_every_figure_and_an_exact_session(shared_data, tmp_path, capsys):
    session = shared_data / SESSION
    code = main(["--out", str(tmp_path), "--device", "cpu", "--quick", "--session", str(session)])
    out = capsys.readouterr().out
    files = list(tmp_path.glob("read_rate*.json"))
    assert len(files) == 1, out
    r = json.loads(files[0].read_text())
    assert code == 0, out

    assert {"gpu", "commit", "date", "torch", "exact", "startup", "matmul_tflops", "rows"} <= r.keys()
    assert files[0].name == "read_rate-quick-cpu.json"
    assert r["gpu"] == "cpu" and r["commit"] and r["date"]
    assert r["matmul_tflops"] > 0 and r["copy_tbps"] > 0
    assert r["notes"] == [], r["notes"]

    e = r["exact"]
    assert e["equal"] is True and e["incremental_equals_fresh"] is True and e["other_process_equal"] is True
    assert e["digest"] == e["other_process_digest"]
    assert e["tensors"] == 8 and e["turns"] >= 3 and e["rollbacks"] >= 1  # 1 attention + 3 GDN layers
    assert e["session"].endswith("django__django-16527.traj.json")
    assert e["fast_vs_eager"]["bit_equal_tensors"] == 8  # no fast path on the CPU: both sides are eager

    start = r["startup"]["tiny"]
    for side in ("ours", "eager"):
        assert start[side]["warm_up_s"] > 0 and start[side]["timed_pass_s"] > 0
        assert "fast_report" in start[side]
    assert start["peer"]["load_s"] > 0 and start["peer"]["fla_installed"] is False

    assert all(row.keys() == ROW_KEYS for row in r["rows"])
    got = {(row["figure"], row["depth"]) for row in r["rows"]}
    assert got == {("chunk", 0), ("chunk", 512), ("question300", 512), ("fork_decode_token", 512)}
    for row in r["rows"]:
        assert row["model"] == "tiny" and row["floor_ms"] > 0
        for side in ("ours_ms", "eager_ms", "peer_ms"):
            assert isinstance(row[side], float), (row, side)  # measured; decode's difference may be noise
        if row["figure"] != "fork_decode_token":
            assert row["ours_ms"] > 0 and row["eager_ms"] > 0 and row["peer_ms"] > 0

    tail = out.strip().splitlines()
    assert tail[-2].startswith("exact: yes") and "other process: True" in tail[-2]
    assert tail[-1].startswith("tiny: warm_up")


def test_flop_count_is_what_the_forward_multiplies():
    """The dense products and the GDN rule's batched products of a 512-row chunk, as torch's flop
    counter sees the CPU forward (attention there is one fused kernel it does not count)."""
    text = demo_text_config()
    cfg = Qwen35Config.from_dict(text)
    with tempfile.TemporaryDirectory() as tmp:
        model = Qwen35.from_pretrained(write_checkpoint(Path(tmp) / "m", text, dtype=torch.float32))
        state = model.new_state()
        model.forward(torch.arange(1024), state)
        counter = FlopCounterMode(display=False)
        with counter:
            model.forward(torch.arange(512), state)
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    assert counts["aten.mm"] == floor.projection_flops(cfg, 512)
    assert counts["aten.bmm"] == floor.gdn_products(cfg, 512)


def test_attention_counts_causal_keys_and_bytes_count_every_weight_once():
    cfg = Qwen35Config.from_dict(reference_shape("0.8B"))
    n, d = 512, 32768
    pairs = sum(d + i + 1 for i in range(n))
    per_pair = 4 * cfg.num_attention_heads * cfg.head_dim  # QK^T and PV, a multiply-add each
    assert floor.attention_flops(cfg, n, d) == per_pair * pairs * len(cfg.full_layers)

    weights = sum(torch.Size(s).numel() for name, s in expected_shapes(cfg).items()
                  if len(s) > 1 and name != "embed_tokens.weight")
    c = floor.cost(cfg, 1, 0, logits=False, elem_bytes=1)
    kv = 2 * cfg.num_key_value_heads * cfg.head_dim * len(cfg.full_layers)
    state = 8 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    assert c.bytes == weights + kv + state * len(cfg.linear_layers)
    with_logits = floor.cost(cfg, 1, 0, logits=True, elem_bytes=1)
    assert with_logits.bytes - c.bytes == cfg.vocab_size * cfg.hidden_size  # the tied head, read once
    assert floor.cost(cfg, 512, 0, logits=False, elem_bytes=2).floor_ms(7e14, 4e12)[1] == "flops"
    assert floor.cost(cfg, 1, d, logits=True, elem_bytes=2).floor_ms(7e14, 4e12)[1] == "bytes"


@pytest.mark.slow
def test_attention_read_compares_each_session_with_its_own_call(monkeypatch):
    """``attention_read`` times the table form a read's pass runs; its ``equal`` must hold where every
    session's rows are its own ``attend`` call's, and fail where one is not (on the CPU: the Triton
    kernel under the interpreter, the graph replaced by calling the launch)."""
    from benchmarks.read_rate import batch as read_rate_batch
    from shadow.backends.qwen35.attention.triton import TritonAttention

    attention = TritonAttention()
    class Eager:
        def __init__(self, launch):
            self.replay = launch
            launch()

    monkeypatch.setattr(read_rate_batch, "captured", Eager)
    monkeypatch.setattr(read_rate_batch, "device_ms_per_call", lambda fn: (fn(), 2.0)[1])
    gen = torch.Generator().manual_seed(3)
    depth, rows = 128, 64
    q = torch.randn(rows, 8, 32, generator=gen)
    k, v = (torch.randn(depth + rows, 2, 32, generator=gen) for _ in range(2))
    alone = torch.empty_like(q)
    attention.attend(q, k, v, depth, alone)

    row = read_rate_batch._attention_read(attention, q, k, v, depth, alone, flops=1e9, b=3)
    assert row["equal"] and row["pass_ms"] == 2.0 and row["ours_ms"] == 2.0 / 3
    assert row["tflops"] == 3 * 1e9 / 2.0 / 1e9
    wrong = alone.clone()
    wrong[0, 0, 0] += 1
    assert not read_rate_batch._attention_read(attention, q, k, v, depth, wrong, flops=1e9, b=1)["equal"]
