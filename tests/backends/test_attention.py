"""The fast path's chunk attention kernel against the fp32 torch form beside it (Triton's
interpreter on the CPU, with the small tiles it takes there, so the split and the merge run)."""

from __future__ import annotations

import pytest
import torch

from shadow.backends.qwen35 import attention

pytest.importorskip("triton")


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
    assert torch.allclose(out, attention.attend_reference(q, k, v, start), atol=1e-5, rtol=1e-5)


def test_splits_change_only_rounding_and_repeat_bit_for_bit():
    n, start = 16, 200
    q, k, v = _inputs(n, start, 4, 2, 32, seed=3, dtype=torch.bfloat16)
    ref = attention.attend_reference(q, k, v, start)
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
