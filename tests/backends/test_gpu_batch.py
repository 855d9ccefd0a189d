"""Batched reads on CUDA, at the 0.8B's shapes (random weights: cuBLAS picks its GEMM kernels by shape,
so the shapes are the real ones): 8 real sessions fed turn by turn with their rollbacks and read in
mixed batches at different depths; every tensor of every session equals the same session read alone
(each round), a fresh prefill of its ids here (at the end) and in another process (by SHA-256)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shadow.backends.qwen35 import Qwen35
from shadow.backends.qwen35.checkpoint import random_tensors, write_checkpoint
from shadow.backends.qwen35.config import Qwen35Config, reference_shape
from shadow.backends.reader import TorchReader

from .batching import Followed, read_batch_and_compare

pytestmark = pytest.mark.gpu

GRID = 512
SESSIONS = (
    "mini-swe-agent-gemini3-swebench/django__django-16527.traj.json",
    "mini-swe-agent-gemini3-swebench/sympy__sympy-12489.traj.json",
    "mini-swe-agent-gemini3-swebench/astropy__astropy-13033.traj.json",
    "mini-swe-agent-gemini3-swebench/psf__requests-2931.traj.json",
    "mini-swe-agent-gemini3-swebench/sphinx-doc__sphinx-9320.traj.json",
    "openhands-examples/output.jsonl",
    "swe-agent-test-trajectories/pydicom__pydicom-1458.traj",
    "claude-code-moredip-session-share/4b2030ed-5563-49ea-b703-6a002f2d3cc8.jsonl",
)
MAX_IDS = 24_000  # each session's turns up to this many ids: 8 sessions, ~350 chunks, mixed depths to 24k
BATCHES = (8, 3, 5, 2, 7, 1, 4, 6, 16, 12)  # asked for in turn: every size is a captured pass of its own


def _digest(state: dict[str, torch.Tensor]) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _turns(shared_data: Path) -> list[list]:
    from shadow.adapters.transcripts import load_transcript, render_turns

    out = []
    for rel in SESSIONS:
        path = shared_data / "sessions" / "raw" / rel
        if path.is_dir():
            path = sorted(p for p in path.rglob("*") if p.suffix in (".json", ".jsonl", ".traj"))[0]
        turns, total = [], 0
        for turn in render_turns(load_transcript(path)[0]):
            total = len(turn.prompt_ids) + len(turn.output_ids)
            if total > MAX_IDS:
                break
            turns.append(turn)
        out.append(turns)
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    shape = reference_shape("0.8B")
    folder = tmp_path_factory.mktemp("b08") / "m"
    tensors = {k: v.cpu() for k, v in random_tensors(Qwen35Config.from_dict(shape), seed=18, device="cuda").items()}
    return write_checkpoint(folder, shape, tensors, dtype=torch.bfloat16, layout="text", extras=False)


def test_real_sessions_read_in_mixed_batches_equal_alone_and_fresh(full_data, checkpoint, tmp_path):
    model = Qwen35.from_pretrained(checkpoint, device="cuda", dtype="bfloat16")
    reader = TorchReader(model, GRID, fast=True)
    reader.warm_up()
    report = reader.fast_report()
    print(json.dumps({k: report[k] for k in ("batches", "max_batch", "static_bytes", "state_slot_bytes",
                                             "capture_reserved_bytes", "capture_s", "check_s", "mlp")}))
    # every captured size reads a session as it reads alone on the H200 (the warm-up check refused none)
    assert set(report["batches"].values()) == {"ok"}, report["batches"]
    _fused_mlp_gives_cublas_bits(reader.fast, report["mlp"])

    all_turns = _turns(full_data)
    assert all(len(t) >= 2 for t in all_turns), [len(t) for t in all_turns]
    sessions = [Followed.new(reader) for _ in all_turns]
    fed = [0] * len(sessions)
    rollbacks = 0
    rng = random.Random(18)
    rounds = 0
    while True:
        # each session with no whole chunk left takes its next turn (prompt, maybe a rollback; output)
        for i, s in enumerate(sessions):
            while s.book.pending < GRID and fed[i] < len(all_turns[i]):
                turn = all_turns[i][fed[i]]
                rollbacks += s.feed_prompt(reader, turn.prompt_ids)
                s.book.feed_output(turn.output_ids)
                fed[i] += 1
        ready = [s for s in sessions if s.book.pending >= GRID]
        if not ready:
            break
        rng.shuffle(ready)
        batch = ready[:BATCHES[rounds % len(BATCHES)]]
        read_batch_and_compare(reader, batch, f"round {rounds}")
        rounds += 1
    assert rollbacks >= 2, "the sessions should roll back on some turns"
    depths = sorted(s.book.committed for s in sessions)
    assert depths[-1] >= 8 * GRID and len(set(depths)) >= 4, depths

    digests, ids_files = [], []
    for i, s in enumerate(sessions):
        ids = s.book.ids[:s.book.committed]
        got, want = reader.export(s.tensors), reader.fresh(ids)
        for name in want:
            assert torch.equal(got[name], want[name]), f"session {i}: {name} differs from a fresh prefill"
        digests.append(_digest(got))
        ids_files.append(tmp_path / f"ids{i}.txt")
        ids_files[-1].write_text(" ".join(map(str, ids)))
    child = (
        "import sys, hashlib, torch\n"
        "from shadow.backends.qwen35 import Qwen35\n"
        "from shadow.backends.reader import TorchReader\n"
        "from tests.backends.test_gpu_batch import _digest\n"
        f"r = TorchReader(Qwen35.from_pretrained({str(checkpoint)!r}, device='cuda', dtype='bfloat16'), {GRID},"
        " fast=True)\n"
        "r.warm_up()\n"
        f"for f in {[str(f) for f in ids_files]!r}:\n"
        "    print(_digest(r.fresh([int(x) for x in open(f).read().split()])))\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split()[-len(digests):] == digests
    print(json.dumps({"rounds": rounds, "rollbacks": rollbacks, "depths": depths}))


def _fused_mlp_gives_cublas_bits(fast, forms: dict[str, str]) -> None:
    """Where warm-up took the fused MLP GEMM, it gives cuBLAS + ``silu_mul``'s bits on rows it did not
    see (other seeds), every layer; every read row count has a form and a reason."""
    from shadow.backends.qwen35.fast import gate_up

    assert set(forms) == {str(b * GRID) for b in fast.batches}, forms
    gen = torch.Generator(device="cuda").manual_seed(1858)
    for n in (int(k) for k, why in forms.items() if why == "fused"):
        x = torch.randn(n, fast.cfg.hidden_size, device="cuda", generator=gen).to(torch.bfloat16)
        ours = torch.empty(n, fast.cfg.intermediate_size, device="cuda", dtype=torch.bfloat16)
        theirs = torch.empty_like(ours)
        for i, lw in enumerate(fast.layers):
            gate_up.gate_up_silu(x, lw.gate_up, ours)
            gate_up.unfused(x, lw.gate_up, theirs)
            assert torch.equal(ours, theirs), f"{n} rows, layer {i}"


def test_a_real_session_read_in_spans_equals_one_chunk_a_pass(full_data, checkpoint):
    """One real session's chunks read in spans of 16, 2, 8, 1 and 4 chunks a pass (the spans captured
    and checked at warm-up) give every tensor of the same chunks read one pass each."""
    from shadow.backends.qwen35.fast import graphs
    from shadow.backends.qwen35.fast.forward import FastForward

    model = Qwen35.from_pretrained(checkpoint, device="cuda", dtype="bfloat16")
    fast = FastForward(model, GRID, spans=(2, 4, 8, 16))
    fast.warm_up()
    assert fast.report()["spans"] == {"2": "ok", "4": "ok", "8": "ok", "16": "ok"}, fast.graphs.refused_spans
    last = _turns(full_data)[1][-1]
    ids = torch.tensor(last.prompt_ids + last.output_ids, dtype=torch.long)
    chunks = ids.shape[0] // GRID
    assert chunks >= 31, chunks
    spanned, alone = model.new_state(), model.new_state()
    at, asked = 0, [16, 2, 8, 1, 4]
    while at < chunks:
        k = max(s for s in (1, 2, 4, 8, 16) if s <= min(asked[0], chunks - at))
        asked = asked[1:] + asked[:1]
        fast.read_chunks([(ids[at * GRID:(at + k) * GRID], spanned)])
        at += k
    for c in range(chunks):
        fast.read_chunk(ids[c * GRID:(c + 1) * GRID], alone)
    assert graphs.same_state(spanned, alone)

