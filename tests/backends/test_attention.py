"""The fast path's chunk attention: the Triton kernel against the naive fp32 form (Triton's
interpreter on the CPU, with the small tiles it takes there, so the split and the merge run), the
table launch, and the registry that picks a backend (the Gluon backends' self-checks run on a
Hopper: tests/backends/test_gpu_attention.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from shadow.backends.qwen35.attention import naive
from shadow.backends.qwen35.attention import triton as attention
from shadow.backends.qwen35.attention.table import write_rows

TRITON = attention.TritonAttention()


def _inputs(n: int, start: int, heads: int, kv: int, d: int, seed: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, heads, d, generator=gen).to(dtype)
    # Rows past start + n hold garbage that must not be read.
    k = torch.randn(start + n + 7, kv, d, generator=gen).to(dtype)
    v = torch.randn(start + n + 7, kv, d, generator=gen).to(dtype)
    k[start + n:] = float("nan")
    v[start + n:] = float("nan")
    return q, k, v


@pytest.mark.parametrize(("n", "start", "heads", "kv"), [(16, 0, 4, 2), (24, 40, 8, 2), (17, 150, 4, 1)])
def test_attend_matches_the_reference(n, start, heads, kv):
    q, k, v = _inputs(n, start, heads, kv, 32, seed=n + start, dtype=torch.float32)
    out = torch.empty_like(q)
    attention.attend(q, k, v, start, out)
    assert torch.allclose(out, naive.attend(q, k, v, start), atol=1e-5, rtol=1e-5)


def test_splits_change_only_rounding_and_repeat_bit_for_bit():
    n, start = 16, 200
    q, k, v = _inputs(n, start, 4, 2, 32, seed=3, dtype=torch.bfloat16)
    ref = naive.attend(q, k, v, start)
    for min_split in (64, 10_000):  # four splits merged, then one pass
        out = torch.empty_like(q)
        attention.attend(q, k, v, start, out, min_split=min_split)
        assert (out.float() - ref).abs().max() < 2e-2
        again = torch.empty_like(q)
        attention.attend(q, k, v, start, again, min_split=min_split)
        assert torch.equal(out, again)
    assert attention.split_len(n * 2, 2, start + n, min_split=64) < start + n  # the first really split


def test_fits_only_what_it_serves():
    assert attention.fits(512, 8, 2, 256)
    assert not attention.fits(1, 8, 2, 256)  # decode stays on torch's flash kernel
    assert not attention.fits(512, 8, 2, 96)  # not a power of two


def test_the_split_count_fills_one_wave_of_the_sms_or_two_where_two_fill_them_better():
    def splits(rows: int, end: int) -> int:  # the GPU's shapes: 64-row blocks, 4 query heads a KV head, 2 KV heads
        return -(-end // attention.split_len(rows * 4, 2, end, bm=64, bn=64, min_split=1024))

    assert splits(512, 33280) == 2  # 64 blocks: 128 programs, one wave
    assert splits(384, 33152) == 5  # 48 blocks: 96 programs fill 73 %, 240 fill 91 % of two waves
    assert splits(304, 33072) == 3  # 38 blocks: 114 programs, as full as 228 in two waves
    assert splits(512, 2048) == 2 and splits(512, 1024) == 1  # at least MIN_SPLIT keys a split
    assert splits(16, 100352) == 66  # 2 blocks: one wave of 132 programs
    # the rule before, for the probes: about 264 programs
    assert -(-33280 // attention.split_len(2048, 2, 33280, bm=128, bn=64, min_split=1024, target=264)) == 8


def test_a_table_launch_gives_each_entry_the_bits_of_its_own_call():
    """Entries of one launch (sessions at different depths, and two chunks of one session, as a
    span reads them) against ``attend`` called per chunk after the same rows were written."""
    heads, kv, d, n = 4, 2, 32, 16
    gen = torch.Generator().manual_seed(7)
    caps, starts = [96, 300, 64], [40, 200, 0]
    entries = [(0, 40), (1, 200), (2, 0), (1, 216)]  # (session, start): session 1 twice, a span of 2

    def buffers():
        g = torch.Generator().manual_seed(11)
        return [(torch.randn(c, kv, d, generator=g).to(torch.bfloat16),
                 torch.randn(c, kv, d, generator=g).to(torch.bfloat16)) for c in caps]

    q = torch.randn(len(entries) * n, heads, d, generator=gen).to(torch.bfloat16)
    k_new = torch.randn(len(entries) * n, kv, d, generator=gen).to(torch.bfloat16)
    v_new = torch.randn(len(entries) * n, kv, d, generator=gen).to(torch.bfloat16)
    assert starts  # the depths above are each session's first entry's start

    table_kv = buffers()
    table = torch.tensor([TRITON.table_row(at, n, heads, *table_kv[b]) for b, at in entries])
    write_rows(k_new, v_new, table)
    out = torch.full_like(q, float("nan"))
    attention.attend_table(q, table, table_kv[0][0], out)

    alone_kv = buffers()
    for e, (b, at) in enumerate(entries):
        alone_kv[b][0][at:at + n] = k_new[e * n:(e + 1) * n]
        alone_kv[b][1][at:at + n] = v_new[e * n:(e + 1) * n]
    alone = torch.full_like(q, float("nan"))
    for e, (b, at) in enumerate(entries):
        attention.attend(q[e * n:(e + 1) * n], *alone_kv[b], at, alone[e * n:(e + 1) * n])

    assert torch.equal(out, alone)
    for (k1, v1), (k2, v2) in zip(table_kv, alone_kv, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert int(table[1, 2]) > 1 and int(table[2, 2]) == 1  # the deep entry split, the shallow one did not


def test_a_table_entry_refuses_rows_it_cannot_address():
    k = torch.zeros(32, 2, 8, 4).select(3, 0)  # not contiguous
    with pytest.raises(ValueError, match="contiguous KV rows"):
        TRITON.table_row(0, 16, 4, k, k)
    k = torch.zeros(20, 2, 8)
    with pytest.raises(ValueError, match="contiguous KV rows"):
        TRITON.table_row(8, 16, 4, k, k)  # 24 rows needed


def test_the_split_rule_follows_the_kernel_that_reads_the_chunk():
    """A table's split rule is the rule of the kernel that reads its chunks: the Gluon backends'
    128-row programs split a chunk their own way, but only bf16 chunks of head dim 256 on the GPU go
    to them; every other chunk keeps the Triton kernel's 64-row rule (c974d7e's GPU tests failed
    where a head-dim-32 table carried the 128-row rule into the Triton kernel). The Gluon backends'
    classes are built here to ask their rule; their kernels run only on a Hopper."""
    from shadow.backends.qwen35.attention import backend_class

    bf16 = torch.bfloat16
    assert TRITON.block_rows("cuda", bf16, 256) == attention.BM
    narrow = attention.split_len(512 * 4, 2, 33280)
    assert attention.split_fields(32768, 512, 8, 2, attention.BM) == (32768, narrow, -(-33280 // narrow))
    keys = torch.zeros(33280, 2, 256, dtype=bf16)
    try:
        gluons = [backend_class(name)() for name in ("gluon-wg", "gluon-ws")]
    except ImportError:  # a Triton without Gluon's Hopper module
        pytest.skip("this Triton has no Gluon Hopper module")
    for gluon in gluons:  # both Gluon kernels: 128-row programs, one rule
        wide = attention.split_len(512 * 4, 2, 33280, gluon.BM)
        assert wide != narrow
        assert gluon.block_rows("cuda", bf16, 256) == gluon.BM == 128
        for kind in (("cuda", bf16, 32), ("cuda", torch.float32, 256), ("cpu", bf16, 256)):
            assert gluon.block_rows(*kind) == attention.BM, (gluon.name, kind)
        # off the GPU the Triton kernel reads the chunk, so the table carries its rule
        assert gluon.table_row(32768, 512, 8, keys, keys)[:3] == [32768, narrow, -(-33280 // narrow)]
        assert not gluon.serves("cpu", bf16, 256)


def test_the_registry_resolves_each_setting_once_and_refuses_what_cannot_run():
    """``auto`` takes the available backend of the highest priority (on the CPU: triton, the only
    one the interpreter runs); a named backend that cannot run here is a clear error, not a
    silent fallback: it would read other bits than the setting says."""
    from shadow.backends.qwen35.attention import SETTINGS, choose, why_unavailable

    cpu = torch.device("cpu")
    assert SETTINGS == ("auto", "triton", "gluon-wg", "gluon-ws")
    assert choose("auto", cpu).name == "triton" and choose("triton", cpu).name == "triton"
    for name in ("gluon-wg", "gluon-ws"):
        assert why_unavailable(name, cpu)
        with pytest.raises(ValueError, match=f"attention '{name}' cannot run on cpu"):
            choose(name, cpu)
    with pytest.raises(ValueError, match="attention must be one of auto, triton, gluon-wg, gluon-ws"):
        choose("ws", cpu)


def test_the_triton_backend_passes_its_self_check():
    """The self-check every backend has (``pytest -m gpu`` runs each on the GPU): the reference
    within rounding, the same bits called again, and a table launch equal to each chunk's call."""
    TRITON.self_check(torch.device("cpu"))


def test_a_self_check_fails_a_backend_whose_table_launch_differs_from_its_calls():
    """The check can fail: a backend whose table launch is off by one ulp somewhere is refused."""
    from shadow.backends.qwen35.attention.backend import AttentionCheckFailed

    class Drifting(attention.TritonAttention):
        name = "drifting"

        def attend_table(self, q: torch.Tensor, table: torch.Tensor, like: torch.Tensor, out: torch.Tensor) -> None:
            super().attend_table(q, table, like, out)
            out[0, 0, 0] = torch.nextafter(out[0, 0, 0], torch.tensor(float("inf")))

    with pytest.raises(AttentionCheckFailed, match="drifting: a table launch gave other bits"):
        Drifting().self_check(torch.device("cpu"))
