"""The CUDA path: fla's GDN against the torch form, bits that do not move, exact replay on the grid."""

from __future__ import annotations

import random

import pytest
import torch

from shadow import ShadowSettings, build_shadow
from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.backends.qwen35.gdn import gated_delta_rule, gated_delta_rule_chunked

pytestmark = pytest.mark.gpu


def _inputs(length: int, hk: int, hv: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(length, hk, 128, generator=gen, device="cuda").bfloat16() for _ in range(2))
    v = torch.randn(length, hv, 128, generator=gen, device="cuda").bfloat16()
    g = -torch.rand(length, hv, generator=gen, device="cuda") * 2 - 0.01
    beta = torch.rand(length, hv, generator=gen, device="cuda").bfloat16()
    s0 = torch.randn(hv, 128, 128, generator=gen, device="cuda") * 0.05
    return q, k, v, g, beta, s0


@pytest.mark.parametrize(("length", "hk", "hv"), [(37, 16, 16), (512, 16, 16), (1000, 16, 32)])
def test_fla_path_agrees_with_torch_form(length, hk, hv):
    args = _inputs(length, hk, hv, seed=length)
    o, s = gated_delta_rule(*args)  # fla on CUDA
    o_ref, s_ref = gated_delta_rule_chunked(*args)
    assert ((o.float() - o_ref.float()).norm() / o_ref.float().norm()) < 1e-2  # bf16 storage inside fla
    assert ((s - s_ref).norm() / s_ref.norm()) < 1e-2


def test_no_fla_kernel_is_left_to_choose_by_timing():
    from shadow.backends.qwen35 import gdn_fla

    assert gdn_fla.available()
    assert gdn_fla.unpinned() == []
    # every configuration the data file chose exists in this fla and was the one pinned
    chosen = gdn_fla._chosen_configs()
    assert {name: gdn_fla.PINNED.get(name) for name in chosen} == {name: "chosen" for name in chosen}


def test_fla_path_same_inputs_same_bits():
    args = _inputs(2048, 16, 16, seed=3)
    first = gated_delta_rule(*args)
    for _ in range(3):
        again = gated_delta_rule(*args)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("fused", [False, True], ids=["fla", "fused"])
@pytest.mark.parametrize(("length", "hv"), [(32, 16), (512, 16), (1000, 32)])
def test_fla_below_its_wrapper_gives_the_wrappers_bits(length, hv, fused):
    """The fast path's call below fla's wrapper (state moved on in place, a solve buffer reused
    across calls), with fla's state and output kernels or ours fused in their place, against the
    wrapper, fed the same chunk sums: the same bits, call after call (a ragged last chunk and value
    heads sharing key heads included)."""
    from fla.ops.utils import chunk_local_cumsum

    from shadow.backends.qwen35 import gdn_fla

    solve = torch.zeros(1, length, hv, 64, dtype=torch.bfloat16, device="cuda")
    for seed in (length, length + 1):  # the second call finds the buffer as the first left it
        q, k, v, g, beta, s0 = _inputs(length, 16, hv, seed=seed)
        q, k = (torch.nn.functional.normalize(x.float(), dim=-1).bfloat16() for x in (q, k))
        o_want, s_want = gdn_fla.gated_delta_rule(q, k, v, g, beta, s0, normalized=True)
        sums = chunk_local_cumsum(g[None], chunk_size=64, scale=1.4426950408889634)[0]
        state = s0.clone()
        o = gdn_fla.chunk_rule_in_place(q, k, v, sums, beta, state, solve, fused=fused)
        assert torch.equal(o, o_want) and torch.equal(state, s_want)


def test_replay_on_cuda_equals_fresh_prefill(tmp_path):
    ckpt = write_checkpoint(tmp_path / "m", demo_text_config(), dtype=torch.bfloat16)
    sh = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device="cuda", dtype="bfloat16",
                                     grid=512, disk="off"))
    rng = random.Random(0)
    ids = [rng.randrange(248000) for _ in range(5000)]
    sh.feed_prompt("s", ids[:1800])
    sh.read()
    sh.feed_output("s", ids[1800:2300])
    sh.read()
    sh.feed_prompt("s", ids[:2000] + ids[2100:5000])  # a rollback
    sh.read()
    got, want = sh.export_state("s"), sh.fresh_state(list(sh.session_ids("s")))
    assert sh.position("s").rollbacks == 1
    for name in want:
        assert torch.equal(got[name], want[name]), name


def _session_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(248000) for _ in range(n)]


def _two_attention_layers() -> dict:
    """8 layers, so two full-attention layers: two pieces hand q, k, v to the eager step (a model
    with one could not tell one piece's tensors from another's)."""
    from .tiny import tiny

    return tiny(layers=8, k_heads=2, v_heads=4, vocab=248320, hidden=64, heads=4, kv_heads=2)


def test_fast_graphs_replay_the_eager_kernels_bit_for_bit(tmp_path):
    """The captured pieces give the bits of the same pieces run eagerly, chunk after chunk."""
    from shadow.backends.qwen35 import Qwen35
    from shadow.backends.qwen35.fast.forward import FastForward

    ckpt = write_checkpoint(tmp_path / "m", _two_attention_layers(), dtype=torch.bfloat16)
    ids = torch.tensor(_session_ids(3 * 512, 1))
    states = []
    for graphs in (False, True):
        model = Qwen35.from_pretrained(ckpt, device="cuda", dtype=torch.bfloat16)
        fast = FastForward(model, 512, graphs=graphs)
        fast.warm_up()
        st = model.new_state()
        for c in range(3):
            fast.read_chunk(ids[c * 512:(c + 1) * 512], st)
        states.append(st)
    eager, captured = states
    for a, b in zip(eager.k + eager.v + eager.conv + eager.recurrent,
                    captured.k + captured.v + captured.conv + captured.recurrent, strict=True):
        assert torch.equal(a[:1536] if a.dim() == 3 and a.shape[0] >= 1536 else a,
                           b[:1536] if b.dim() == 3 and b.shape[0] >= 1536 else b)


def test_fast_path_agrees_with_the_torch_forward(tmp_path):
    """Fast and torch forwards on the same weights compute the same function: against the torch
    forward in fp32, the fast path in bf16 is no further off than the torch forward in bf16."""
    ckpt = write_checkpoint(tmp_path / "m", _two_attention_layers(), dtype=torch.bfloat16)
    ids = _session_ids(2 * 512 + 100, 2)
    out = {}
    for fast, dtype in (("off", "float32"), ("off", "bfloat16"), ("auto", "bfloat16")):
        sh = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device="cuda", dtype=dtype,
                                         grid=512, disk="off", fast=fast))
        sh.warm_up()
        sh.feed_prompt("s", ids)
        sh.read()
        out[fast, dtype] = (sh.export_state("s"), sh.ask("s", ids[:40], ["A", "B"]).probs["A"])
    ref, p_ref = out["off", "float32"]
    for name in ref:
        errs = [float((out[k][0][name].float() - ref[name]).norm() / ref[name].norm())
                for k in (("off", "bfloat16"), ("auto", "bfloat16"))]
        print(f"{name}: torch bf16 {errs[0]:.2e}, fast bf16 {errs[1]:.2e}")
        assert errs[1] <= max(1.5 * errs[0], 1e-2), f"{name}: fast {errs[1]:.2e} vs torch bf16 {errs[0]:.2e}"
    assert abs(out["auto", "bfloat16"][1] - p_ref) <= max(1.5 * abs(out["off", "bfloat16"][1] - p_ref), 1e-2)


def test_fast_path_real_session_equals_fresh_prefill_in_another_process(tmp_path):
    """The shipped OpenHands session fed turn by turn on the fast path equals a fresh prefill, here
    and in a fresh process (compared by digest)."""
    import hashlib
    import subprocess
    import sys

    from shadow.adapters.replay import verify
    from shadow.adapters.transcripts import demo_transcript
    from shadow.adapters.transcripts.render import render_turns

    ckpt = write_checkpoint(tmp_path / "m", _two_attention_layers(), dtype=torch.bfloat16)
    turns = render_turns(demo_transcript())
    sh = build_shadow(ShadowSettings(_env_file=None, model=str(ckpt), device="cuda", dtype="bfloat16",
                                     grid=512, disk="off"))
    sh.warm_up()
    report = verify(sh, "s", turns)
    assert report.equal, (report.worst_tensor, report.largest_difference)
    ids = list(sh.session_ids("s"))
    got = sh.export_state("s")

    def digest(state) -> str:
        h = hashlib.sha256()
        for name in sorted(state):
            h.update(state[name].contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    ids_file = tmp_path / "ids.txt"
    ids_file.write_text(" ".join(map(str, ids)))
    child = (
        "import sys, hashlib, torch\n"
        "from shadow import ShadowSettings, build_shadow\n"
        f"sh = build_shadow(ShadowSettings(_env_file=None, model={str(ckpt)!r}, device='cuda', dtype='bfloat16',"
        " grid=512, disk='off'))\n"
        "sh.warm_up()\n"
        f"st = sh.fresh_state([int(x) for x in open({str(ids_file)!r}).read().split()])\n"
        "h = hashlib.sha256()\n"
        "for name in sorted(st): h.update(st[name].contiguous().view(torch.uint8).numpy().tobytes())\n"
        "print(h.hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == digest(got)


def test_a_read_waits_for_its_own_stream_only(tmp_path):
    """With a long kernel queued on the caller's stream (an engine's decode step, in a process it
    shares with the shadow), reads return before that kernel ends, and give the bits of reads with
    nothing else queued."""
    import time

    from shadow.backends.qwen35 import Qwen35
    from shadow.backends.reader import TorchReader
    from shadow.core.session import SessionBook

    ckpt = write_checkpoint(tmp_path / "m", _two_attention_layers(), dtype=torch.bfloat16)
    reader = TorchReader(Qwen35.from_pretrained(ckpt, device="cuda", dtype=torch.bfloat16), 512, fast=True)
    reader.warm_up()
    ids = _session_ids(3 * 512, 7)

    def read_three() -> dict[str, torch.Tensor]:
        book, tensors = SessionBook(grid=512, ids=list(ids)), reader.new_session()
        for _ in range(3):
            reader.read_chunk(book, tensors)
        return reader.export(tensors)

    alone = read_three()
    torch.cuda.synchronize()
    torch.cuda._sleep(4_000_000_000)  # about 2 s of spinning on this thread's (the caller's) stream
    t0 = time.perf_counter()
    beside = read_three()
    took = time.perf_counter() - t0
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_busy, f"the reads took {took:.3f} s: they waited for the caller's stream"
    assert alone.keys() == beside.keys() and all(torch.equal(alone[k], beside[k]) for k in alone)
