"""The fast path on the CPU: each fused kernel (under Triton's interpreter) against the torch lines it
replaces, the whole fast forward against the torch forward, and exactness on the fast path itself
(incremental equals fresh, a fork leaves the committed state alone), torch.equal on every tensor.
The CUDA graphs themselves are exercised by the GPU tests (tests/backends/test_gpu.py)."""

from __future__ import annotations

import gc
import math
import random

import pytest
import torch

pytest.importorskip("triton", reason="the fast path's kernels need triton (pip install -e '.[dev]')")

import torch.nn.functional as F

from shadow import ShadowSettings, build_shadow
from shadow.backends.qwen35 import Qwen35, kernels
from shadow.backends.qwen35.checkpoint import write_checkpoint
from shadow.backends.qwen35.model import _gated_rms_norm, _rms_norm_1p, _rotate_half

from .tiny import tiny

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = (got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12)
    assert err < tol, f"relative error {err:.2e} over {tol:.0e}"


def _randn(*shape: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEV, dtype)


@pytest.mark.parametrize("add", [False, True])
def test_rms_norm(add):
    h, d, w = _randn(7, 96, seed=1), _randn(7, 96, seed=2), _randn(96, seed=3) * 0.1
    stream = h.clone()
    out = torch.full_like(h, float("nan"))
    kernels.rms_norm(stream, (1.0 + w.float()), 1e-6, out, add=d if add else None)
    want_stream = h + d if add else h
    if DEV == "cuda":  # rounds once to bf16, as torch's add does (the interpreter's cast truncates)
        assert torch.equal(stream, want_stream)
    _close(stream, want_stream, 1e-2)
    _close(out, _rms_norm_1p(want_stream, w, 1e-6), 1e-2)


def test_silu_mul():
    gu = _randn(5, 2 * 1100, seed=4)
    out = torch.full((5, 1100), float("nan"), dtype=gu.dtype, device=DEV)
    kernels.silu_mul(gu, out)
    _close(out, F.silu(gu[:, :1100]) * gu[:, 1100:], 1e-2)


def test_qk_norm_rope_and_output_gate():
    n, heads, kvh, hd, rd, start = 6, 2, 1, 32, 8, 1000
    proj = _randn(n, heads * 2 * hd + 2 * kvh * hd, seed=5)
    qw, kw = _randn(hd, seed=6) * 0.1, _randn(hd, seed=7) * 0.1
    inv_freq = (1.0 / (10_000 ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))).to(DEV)
    q, k, v = (torch.full((n, h, hd), float("nan"), dtype=proj.dtype, device=DEV) for h in (heads, kvh, kvh))
    kernels.qk_norm_rope(proj, 1.0 + qw.float(), 1.0 + kw.float(), inv_freq,
                         torch.tensor([start], device=DEV), 1e-6, q, k, v)
    # the torch forward's lines (model.py _attention)
    qg = proj[:, :heads * 2 * hd].view(n, heads, 2 * hd)
    pos = torch.arange(start, start + n, dtype=torch.float32, device=DEV)
    emb = torch.cat([pos[:, None] * inv_freq[None]] * 2, dim=-1)
    c, s = emb.cos().to(proj.dtype)[:, None], emb.sin().to(proj.dtype)[:, None]

    def rope(x):
        return torch.cat((x[..., :rd] * c + _rotate_half(x[..., :rd]) * s, x[..., rd:]), dim=-1)

    _close(q, rope(_rms_norm_1p(qg[..., :hd], qw, 1e-6)), 1e-2)
    kraw = proj[:, heads * 2 * hd:heads * 2 * hd + kvh * hd].view(n, kvh, hd)
    _close(k, rope(_rms_norm_1p(kraw, kw, 1e-6)), 1e-2)
    assert torch.equal(v, proj[:, heads * 2 * hd + kvh * hd:].view(n, kvh, hd))

    attn, gated = _randn(n, heads, hd, seed=8), torch.empty(n, heads, hd, dtype=proj.dtype, device=DEV)
    kernels.output_gate(attn, proj, gated)
    _close(gated, attn * torch.sigmoid(qg[..., hd:]), 1e-2)


# the Triton kernel (the GPU's) and the torch form the fast path takes off CUDA
CONV_FORMS = {"triton": kernels.conv_silu, "torch": kernels.conv_silu_torch}


@pytest.mark.parametrize("form", CONV_FORMS)
@pytest.mark.parametrize(("n", "valid"), [(37, 37), (3, 3), (32, 20), (8, 2)])
def test_conv_silu_and_its_state(n, valid, form):
    kd, vd, kernel = 32, 64, 4
    c = 2 * kd + vd
    proj = _randn(n, c + 40, seed=9)  # wider than the conv's columns, as the merged projection is
    weight = _randn(c, kernel, seed=10) * 0.5
    state = _randn(c, kernel, seed=11)
    out = torch.full((n * c,), float("nan"), dtype=proj.dtype, device=DEV)
    held = state.clone()
    head = 16
    CONV_FORMS[form](proj, state, weight, kd, head, torch.tensor([valid], dtype=torch.long, device=DEV), out)
    cols = torch.cat((held, proj[:, :c].t()), dim=1)
    want = F.silu(F.conv1d(cols[None].float(), weight.float()[:, None, :], groups=c)[0, :, 1:]).t()
    qk = want[:, :2 * kd].reshape(n, -1, head)  # q and k leave l2-normalised per head (gdn._l2norm)
    want[:, :2 * kd] = (qk * torch.rsqrt((qk * qk).sum(-1, keepdim=True) + 1e-6)).reshape(n, -1)
    got = torch.cat((out[:n * kd].view(n, kd), out[n * kd:2 * n * kd].view(n, kd), out[2 * n * kd:].view(n, vd)), 1)
    _close(got, want, 1e-2)
    assert torch.equal(state, cols[:, valid:valid + kernel])  # moved on by the real rows only



@pytest.mark.parametrize("form", CONV_FORMS)
@pytest.mark.parametrize(("seg", "valid"), [(16, 16), (16, 11), (1, 1)])
def test_conv_silu_batched_equals_each_session_alone(seg, valid, form):
    """Sessions of ``seg`` rows in one launch (``seg`` 1: single-row sessions, as a batched decode
    runs them, one row a program): each session's output rows and moved state are the bits of the
    session read alone."""
    kd, vd, kernel, head, sessions = 32, 64, 4, 16, 3
    c = 2 * kd + vd
    n = seg * sessions
    proj = _randn(n, c + 40, seed=31)
    weight = _randn(c, kernel, seed=32) * 0.5
    states = _randn(sessions, c, kernel, seed=33)
    moved = states.clone()
    out = torch.full((n * c,), float("nan"), dtype=proj.dtype, device=DEV)
    real = torch.tensor([valid], dtype=torch.long, device=DEV)
    block_t = 8 if seg % 8 == 0 else 1

    def conv(p: torch.Tensor, s: torch.Tensor, o: torch.Tensor) -> None:
        if form == "triton":
            kernels.conv_silu(p, s, weight, kd, head, real, o, block_t=block_t)
        else:
            kernels.conv_silu_torch(p, s, weight, kd, head, real, o)

    conv(proj, moved, out)

    def rows(flat: torch.Tensor, count: int, b: int) -> torch.Tensor:
        q, k, v = flat[:count * kd].view(count, kd), flat[count * kd:2 * count * kd].view(count, kd), \
            flat[2 * count * kd:].view(count, vd)
        return torch.cat((q, k, v), 1)[b * seg:(b + 1) * seg]

    for b in range(sessions):
        alone_state = states[b].clone()
        alone = torch.full((seg * c,), float("nan"), dtype=proj.dtype, device=DEV)
        conv(proj[b * seg:(b + 1) * seg], alone_state, alone)
        assert torch.equal(rows(out, n, b), rows(alone, seg, 0))
        assert torch.equal(moved[b], alone_state)

def test_gates_and_gated_norm():
    n, hv, dv, off = 9, 4, 16, 10
    proj = _randn(n, off + hv * dv + 2 * hv + 3, seed=12)
    neg_a, dt_bias = -_randn(hv, dtype=torch.float32, seed=13).exp(), _randn(hv, seed=14)
    g = torch.full((n, hv), float("nan"), device=DEV)
    beta = torch.full((n, hv), float("nan"), dtype=proj.dtype, device=DEV)
    b_off, a_off = off + hv * dv, off + hv * dv + hv
    kernels.gates(proj, b_off, a_off, neg_a, dt_bias, torch.tensor([6], dtype=torch.long, device=DEV), g, beta)
    want_g = neg_a * F.softplus(proj[:, a_off:a_off + hv].float() + dt_bias)
    _close(g[:6], want_g[:6], 1e-5)
    _close(beta[:6], torch.sigmoid(proj[:6, b_off:b_off + hv]), 1e-2)
    assert not g[6:].any() and not beta[6:].any()  # padding: no decay, no write

    # fla's form: summed within 64-row chunks, in log2 units, padding rows adding nothing
    rows = 150
    long = _randn(rows, off + hv * dv + 2 * hv + 3, seed=17)
    sums = torch.full((rows, hv), float("nan"), device=DEV)
    kernels.gates(long, b_off, a_off, neg_a, dt_bias, torch.tensor([140], dtype=torch.long, device=DEV), sums,
                  torch.empty(rows, hv, dtype=long.dtype, device=DEV), chunk_sums=True)
    raw = neg_a * F.softplus(long[:, a_off:a_off + hv].float() + dt_bias)
    raw[140:] = 0
    want = torch.cat([c.cumsum(0) for c in raw.split(kernels.FLA_CHUNK)]) / math.log(2)
    _close(sums, want, 1e-5)
    assert torch.equal(sums[140:], sums[139:140].expand(10, hv))  # flat over the padding

    o, w = _randn(n, hv, dv, seed=15), _randn(dv, seed=16)
    out = torch.full((n, hv * dv), float("nan"), dtype=o.dtype, device=DEV)
    kernels.gated_norm(o, proj, off, w, 1e-6, out)
    z = proj[:, off:off + hv * dv].view(n, hv, dv)
    _close(out, _gated_rms_norm(o, z, w, 1e-6).reshape(n, -1), 1e-2)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast")
    cfg = tiny(vocab=248320, hidden=32, heads=2, kv_heads=1, layers=4, k_heads=2, v_heads=4)
    return {dtype: write_checkpoint(root / dtype, cfg, dtype=getattr(torch, dtype), seed=3)
            for dtype in ("float32", "bfloat16")}


def _run(ckpt, dtype: str, fast: bool, ids: torch.Tensor):
    """A chunk of 64 read, then 40 more ids as a fork: (state, fork logits)."""
    from shadow.backends.qwen35.fast.forward import FastForward

    model = Qwen35.from_pretrained(ckpt, device=DEV, dtype=dtype)
    state = model.new_state()
    if not fast:
        model.forward(ids[:64], state)
        saved = state.save_recurrent()
        logits = model.forward(ids[64:], state, logits_at=[-1])
        assert logits is not None
        state.truncate(64)
        state.load_recurrent(saved)
        return state, logits[0]
    ff = FastForward(model, grid=64)
    ff.read_chunk(ids[:64], state)
    fork = ff.fork(ids[64:].tolist(), state)  # one padded pass of 64 rows for 40 ids
    assert fork.logits is not None
    logits = fork.logits.clone()
    fork.close()
    assert state.length == 64
    return state, logits


def test_fast_forward_agrees_with_the_torch_forward(checkpoints):
    """In fp32 the fast forward is the torch forward's function to 1e-4: merged weights, pieces,
    padding and state all line up. Its bf16 accuracy is the GPU test's to judge
    (test_gpu.test_fast_path_agrees_with_the_torch_forward): the interpreter's casts to bf16
    truncate where the GPU's round to nearest, so bf16 error here says nothing about the GPU."""
    ids = torch.randint(0, 248000, (64 + 40,), generator=torch.Generator().manual_seed(1))
    ref_state, ref_logits = _run(checkpoints["float32"], "float32", False, ids)
    fast_state, fast_logits = _run(checkpoints["float32"], "float32", True, ids)
    _close(fast_logits, ref_logits, 1e-4)
    for got, want in ((fast_state.k[0][:64], ref_state.k[0][:64]), (fast_state.recurrent[-1], ref_state.recurrent[-1]),
                      (fast_state.conv[-1], ref_state.conv[-1])):
        _close(got, want, 1e-4)



def _fast_shadow(checkpoints, dtype: str, grid: int):
    return build_shadow(ShadowSettings(_env_file=None, model=str(checkpoints[dtype]), device=DEV,
                                       dtype=dtype, grid=grid, disk="off", fast="on"))


@pytest.mark.slow
def test_fast_path_replay_equals_fresh_and_forks_are_pure(checkpoints):
    sh = _fast_shadow(checkpoints, "bfloat16", 64)
    rng = random.Random(7)
    ids = [rng.randrange(248000) for _ in range(700)]
    sh.feed_prompt("s", ids[:150])
    sh.read()
    sh.feed_output("s", ids[150:230])
    sh.read()
    before = sh.export_state("s")
    sh.ask("s", ids[600:650], ["A", "B"])
    assert sh.decode("s", ids[650:660], max_new=5)
    after = sh.export_state("s")
    for name in before:
        assert torch.equal(before[name], after[name]), f"a fork changed {name}"
    sh.feed_prompt("s", ids[:200] + ids[300:520])  # a rollback below the read rows
    sh.read()
    book_ids = list(sh.session_ids("s"))
    got, want = sh.export_state("s"), sh.fresh_state(book_ids)
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs from a fresh prefill on the fast path"


def test_device_decode_equals_the_token_by_token_loop(checkpoints):
    """``_Fork.decode`` feeds each argmax on the device and looks at the tokens in batches: it must
    give the tokens of the plain loop (argmax on the host, one pass each), cut at the first stop id
    even when that id lands inside a batch, and leave the committed rows alone."""
    from shadow.backends.qwen35.fast.forward import FastForward

    model = Qwen35.from_pretrained(checkpoints["float32"], device=DEV, dtype="float32")
    ff = FastForward(model, grid=64)
    state = model.new_state()
    ids = torch.randint(0, 248000, (64 + 9,), generator=torch.Generator().manual_seed(5))
    ff.read_chunk(ids[:64], state)

    fork = ff.fork(ids[64:].tolist(), state)
    loop: list[int] = []
    for _ in range(5):
        assert fork.logits is not None
        loop.append(int(fork.logits.argmax()))
        fork.extend([loop[-1]])
    fork.close()
    assert state.length == 64

    fork = ff.fork(ids[64:].tolist(), state)
    assert fork.decode(5, stop=set(), look_every=3) == loop
    fork.close()
    fork = ff.fork(ids[64:].tolist(), state)
    got = fork.decode(5, stop={loop[1]}, look_every=3)  # the stop id lands inside the first batch
    fork.close()
    assert got == loop[:loop.index(loop[1]) + 1]
    assert state.length == 64


@pytest.mark.parametrize("dtype", [pytest.param("bfloat16", marks=pytest.mark.slow), "float32"])
def test_forks_through_a_table_give_the_piecewise_bits_from_16_rows(checkpoints, dtype):
    """A fork's pass from a one-entry table (its graph's form) against the piecewise pass: from 16
    rows the same kernel on the same numbers, so the same logits and scratch KV rows bit for bit, a
    question longer than the grid included; below 16 rows (a decode step, a small question) the
    piecewise pass takes torch's attention, so the two agree to rounding (fp32) and each decodes as
    its own token-by-token loop. The committed rows and state stay as they were either way."""
    from shadow.backends.qwen35.fast.forward import FastForward
    from shadow.backends.qwen35.fast.graphs import clone_state, same_state

    model = Qwen35.from_pretrained(checkpoints[dtype], device=DEV, dtype=dtype)
    ids = torch.randint(0, 248000, (64 + 90,), generator=torch.Generator().manual_seed(21)).tolist()
    forms = {}
    for tables in (True, False):
        ff = FastForward(model, grid=64)
        ff.fork_tables = tables
        assert ff.whole_forks is tables
        state = model.new_state()
        ff.read_chunk(torch.tensor(ids[:64]), state)
        before = clone_state(state)
        got = {}
        for n in (1, 5, 20, 40, 64, 90):  # sizes 1, 8, 32, 64, 64 and a pass of 64 then one of 32
            fork = ff.fork(ids[64:64 + n], state)
            assert fork.logits is not None
            got[n] = (fork.logits.clone(), state.k[-1][64:64 + n].clone())
            fork.close()
        fork = ff.fork(ids[64:70], state)
        got["decode"] = fork.decode(4, stop=set())
        fork.close()
        assert same_state(state, before)
        forms[tables] = got
    for n in (20, 40, 64, 90):
        assert torch.equal(forms[True][n][0], forms[False][n][0]), f"{n} ids: logits differ"
        assert torch.equal(forms[True][n][1], forms[False][n][1]), f"{n} ids: K rows differ"
    if dtype == "float32":
        for n in (1, 5):
            _close(forms[True][n][0], forms[False][n][0], 1e-5)
        assert forms[True]["decode"] == forms[False]["decode"]


def test_batched_read_equals_each_session_read_alone(checkpoints):
    """A batch mixing a session just rolled back, a deep one and a new one reads each of them as
    ``read_chunk`` reads it alone, bit for bit (tensors and checkpoints); 3 sessions, a size the
    path does not take, read in a pass of 4 with an empty slot, twice; a refused size is not used,
    and the report says why."""
    from shadow.backends.reader import TorchReader

    from .batching import Followed, read_batch_and_compare

    model = Qwen35.from_pretrained(checkpoints["bfloat16"], device=DEV, dtype="bfloat16")
    reader = TorchReader(model, grid=64, fast=True)
    assert reader.fast is not None and reader.fast.batches == (1, 2, 4) and reader.max_batch == 4
    rng = random.Random(18)
    ids = [rng.randrange(248000) for _ in range(400)]
    rolled, deep, new = Followed.new(reader), Followed.new(reader), Followed.new(reader)
    rolled.feed_prompt(reader, ids[:140])  # a checkpoint is wanted at 128
    deep.feed_prompt(reader, ids[200:400])
    for _ in range(2):
        reader.read_chunks([(rolled.book, rolled.tensors), (deep.book, deep.tensors)])
    assert rolled.book.checkpoints == [128] and deep.book.committed == 128
    # the next turn's prompt differs at id 100: back to the start, with the new prompt pending
    assert rolled.feed_prompt(reader, ids[:100] + ids[300:400])
    assert rolled.book.committed == 0 and rolled.book.pending >= 128
    new.feed_prompt(reader, ids[150:230])
    passes: list[tuple[int, int | None]] = []
    fast_read = reader.fast.read_chunks
    reader.fast.read_chunks = lambda chunks, size=None: (passes.append((len(chunks), size)), fast_read(chunks, size))
    read_batch_and_compare(reader, [rolled, deep, new], "rolled back, deep, new")
    assert passes[-1] == (3, 4)  # one pass of 4, its last slot empty (``pass_plan``), not 2 then 1
    empty, = reader.fast.slots.placeholders
    assert empty.length == 0 and empty.capacity == reader.grid  # ready for the next, no KV growth
    assert not new.feed_prompt(reader, ids[150:230] + ids[:64])
    assert not deep.feed_prompt(reader, ids[200:400] + ids[:64])
    read_batch_and_compare(reader, [new, rolled, deep], "again, on what the empty slot's state became")
    del reader.fast.read_chunks

    reader.fast.graphs.refused[4] = "refused by the test"
    assert reader.max_batch == 2
    report = reader.fast_report()
    assert report is not None and report["batches"]["4"] == "refused by the test" and report["max_batch"] == 2
    with pytest.raises(ValueError, match="appears twice"):
        reader.read_chunks([(deep.book, deep.tensors), (deep.book, deep.tensors)])


def test_a_batch_size_that_differs_is_refused_logged_and_not_used(checkpoints, monkeypatch, caplog):
    """The warm-up check (``Graphs.check``, run here on the eager path): a batch size whose passes
    give a session other bits than its chunk read alone is refused, the log and the report say
    why, and the reader reads such batches in passes of the sizes left."""
    import logging

    from shadow.backends.qwen35.fast.forward import FastForward
    from shadow.backends.reader import TorchReader

    from .batching import Followed

    real = FastForward._linear

    def off_by_one_ulp_in_pairs(self, r, x, w):  # a GEMM that rounds another way at 2 sessions
        out = real(self, r, x, w)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if r.sessions == 2 else out

    monkeypatch.setattr(FastForward, "_linear", off_by_one_ulp_in_pairs)
    model = Qwen35.from_pretrained(checkpoints["float32"], device=DEV, dtype="float32")
    reader = TorchReader(model, grid=64, fast=True)
    assert reader.fast is not None
    reader.fast.batches = (1, 2)
    with caplog.at_level(logging.WARNING, logger="shadow.backends.qwen35.fast.graphs"):
        refused = reader.fast.graphs.check()
    assert list(refused) == [2] and "differs from its chunk read alone" in refused[2]
    assert "batch size 2 not used" in caplog.text
    report = reader.fast_report()
    assert report is not None and report["batches"] == {"1": "ok", "2": refused[2]} and reader.max_batch == 1

    a, b = Followed.new(reader), Followed.new(reader)
    a.feed_prompt(reader, list(range(1000, 1064)))
    b.feed_prompt(reader, list(range(2000, 2064)))
    passes = []
    monkeypatch.setattr(reader.fast, "read_chunks", lambda chunks, size=None: passes.append(len(chunks)))
    reader.read_chunks([(a.book, a.tensors), (b.book, b.tensors)])
    assert passes == [1, 1]


def test_a_span_reads_a_sessions_chunks_in_the_bits_of_one_pass_each(checkpoints, monkeypatch):
    """One session's next 2 chunks in one pass give the tensors of 2 passes of one chunk
    (torch.equal, every tensor, bf16): at depth, so the second chunk attends over the first in
    the same pass. The warm-up check passes the span; a refused span and passes the path does not
    take are errors, and nothing is read."""
    from shadow.backends.qwen35.fast import graphs
    from shadow.backends.qwen35.fast.forward import FastForward

    model = Qwen35.from_pretrained(checkpoints["bfloat16"], device=DEV, dtype="bfloat16")
    ff = FastForward(model, grid=64, spans=(2,))
    gen = torch.Generator().manual_seed(19)
    ids = torch.randint(0, 248000, (3 * 64,), generator=gen)
    base = model.new_state()
    ff.read_chunk(ids[:64], base)
    alone, spanned = graphs.clone_state(base), graphs.clone_state(base)
    ff.read_chunk(ids[64:128], alone)
    ff.read_chunk(ids[128:], alone)
    ff.read_chunks([(ids[64:], spanned)])
    assert alone.length == spanned.length == 3 * 64 and graphs.same_state(spanned, alone)
    assert ff.graphs.check_spans() == {} and ff.report()["spans"] == {"2": "unchecked"}

    with pytest.raises(ValueError, match="2 chunks or more"):
        FastForward(model, grid=64, spans=(1,))
    other = graphs.clone_state(base)
    for bad in ([(ids[:], other)],  # 3 chunks: not a span this path takes
                [(ids[64:], other), (ids[:128], graphs.clone_state(base))]):  # spans of two sessions
        with pytest.raises(ValueError, match="span of"):
            ff.read_chunks(bad)
    real = FastForward._linear

    def off_by_one_ulp_in_spans(self, r, x, w):  # a GEMM that rounds another way over two chunks
        out = real(self, r, x, w)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if r.seg > self.grid else out

    monkeypatch.setattr(FastForward, "_linear", off_by_one_ulp_in_spans)
    assert list(ff.graphs.check_spans()) == [2] and "differs" in ff.graphs.refused_spans[2]
    with pytest.raises(ValueError, match="span of"):
        ff.read_chunks([(ids[64:], other)])
    assert graphs.same_state(other, base)


def test_the_reader_reads_a_span_as_its_chunks_one_pass_each(checkpoints):
    """``read_span``: a session's next 2 chunks in one pass end in the tensors, book and checkpoints
    of two ``read_chunk`` calls, the checkpoint wanted at the span's end taken; a span that would
    step over a wanted checkpoint line, a size the path does not take, or chunks not pending are
    refused with nothing read."""
    from shadow.backends.reader import TorchReader

    from .batching import Followed, assert_same

    model = Qwen35.from_pretrained(checkpoints["bfloat16"], device=DEV, dtype="bfloat16")
    reader = TorchReader(model, grid=64, fast=True, spans=(2,))
    assert reader.spans == (2,)
    rng = random.Random(20)
    ids = [rng.randrange(248000) for _ in range(300)]
    spanned = Followed.new(reader)
    spanned.feed_prompt(reader, ids[:140])  # a checkpoint is wanted at 128: the span's end
    alone = spanned.copy()
    reader.read_span(spanned.book, spanned.tensors, 2)
    reader.read_chunk(alone.book, alone.tensors)
    reader.read_chunk(alone.book, alone.tensors)
    assert spanned.book.checkpoints == [128]
    assert_same(reader, spanned, alone, "a span of 2 against 2 chunks")

    later = Followed.new(reader)
    later.feed_prompt(reader, ids[:100])  # wanted at 64
    later.book.feed_output(ids[100:300])
    before = later.copy()
    for chunks, match in ((2, "inside the span"), (3, "a span is one of"), (4, "a span is one of")):
        with pytest.raises(ValueError, match=match):
            reader.read_span(later.book, later.tensors, chunks)
    assert_same(reader, later, before, "nothing read")
    with pytest.raises(ValueError, match="not pending"):
        reader.read_span(spanned.book, spanned.tensors, 2)  # 12 ids pending past 128


def test_reads_through_the_table_give_the_bits_of_one_attention_call_a_chunk(checkpoints):
    """A read's pass as its graph holds it (K and V rows written, and attention over each chunk,
    from a table of starts and addresses) against the piecewise pass (a copy and an ``attend`` call
    a chunk): sessions at different depths in a batch, and a span, bit for bit."""
    from shadow.backends.qwen35.fast.forward import FastForward
    from shadow.backends.qwen35.fast.graphs import same_state

    model = Qwen35.from_pretrained(checkpoints["bfloat16"], device=DEV, dtype="bfloat16")
    ids = torch.randint(0, 248000, (5, 64), generator=torch.Generator().manual_seed(9))
    results = []
    for table in (True, False):
        ff = FastForward(model, grid=64, spans=(2,))
        assert ff.table_reads
        ff.table_reads = table
        a, b = model.new_state(), model.new_state()
        ff.read_chunk(ids[0], a)
        ff.read_chunks([(ids[1], a), (ids[2], b)])  # depths 64 and 0
        ff.read_chunks([(torch.cat([ids[3], ids[4]]), b)])  # a span of 2 chunks from 64
        results.append((a, b))
    assert all(same_state(got, want) for got, want in zip(*results, strict=True))
    assert results[0][0].length == 128 and results[0][1].length == 192


def test_states_move_into_the_slots_in_one_launch_or_a_layer_at_a_time(checkpoints):
    """Stacked states (every state ``new_state`` makes) move through one launch a kind, from the
    addresses staged with the pass; a batch holding any state that is not stacked moves each a layer
    at a time. Either way each session reads as it would alone, bit for bit."""
    from shadow.backends.qwen35.fast.forward import FastForward
    from shadow.backends.qwen35.fast.graphs import same_state
    from shadow.backends.qwen35.state import ModelState

    model = Qwen35.from_pretrained(checkpoints["bfloat16"], device=DEV, dtype="bfloat16")
    fast = FastForward(model, grid=64)
    gen = torch.Generator().manual_seed(7)
    chunks = [torch.randint(0, 248000, (64,), generator=gen) for _ in range(2)]
    alone, stacked, other = model.new_state(), model.new_state(), model.new_state()
    loose = ModelState(model.config, model.device, model.dtype, 0, [t.clone() for t in stacked.k],
                       [t.clone() for t in stacked.v], [t.clone() for t in stacked.conv],
                       [t.clone() for t in stacked.recurrent])
    assert fast.slots.sources([stacked, other]) and not fast.slots.sources([loose, other])
    for ids in chunks:
        fast.read_chunks([(ids, alone)])
        fast.read_chunks([(ids, stacked), (ids.flip(0), other)])  # one launch a kind each way
        fast.read_chunks([(ids, loose)])  # a layer at a time
    assert same_state(stacked, alone) and same_state(loose, alone)
    assert alone.length == 2 * 64 and not torch.equal(alone.recurrent[0], torch.zeros_like(alone.recurrent[0]))


def test_captures_run_with_the_collector_paused_and_restored():
    """A capture must not meet Python's collector (freeing a graph is a CUDA call a capture forbids);
    afterwards the collector is as it was, an error inside included."""
    from shadow.backends.qwen35.fast.graphs import collector_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # one that was off stays off
    finally:
        gc.enable()
