"""The forward against transformers' own Qwen3.5, on the same checkpoint folders."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from shadow.backends.qwen35 import Qwen35
from shadow.backends.qwen35.checkpoint import write_checkpoint

from .tiny import CONFIGS

transformers = pytest.importorskip("transformers")

LENGTHS = [1, 2, 63, 64, 65, 129, 333, 700]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    """(our model, transformers' model, text config) on one fp32 checkpoint folder."""
    tc = CONFIGS[request.param]
    folder = write_checkpoint(tmp_path_factory.mktemp(request.param), tc, dtype=torch.float32, seed=7)
    ours = Qwen35.from_pretrained(folder, device="cpu", dtype=torch.float32)
    ref = transformers.Qwen3_5ForCausalLM.from_pretrained(
        folder, config=transformers.Qwen3_5TextConfig(**tc), dtype=torch.float32
    ).eval()
    return ours, ref, tc


def _close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-4) -> None:
    """fp32 agreement, scaled to the tensor's own magnitude (later layers carry earlier rounding)."""
    assert got.shape == want.shape
    assert (got.float() - want.float()).abs().max() <= rel * want.float().abs().max()


def _ref_logits(ref, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref(input_ids=ids[None]).logits[0].float()


def _rounding_response(ref, ids: torch.Tensor) -> torch.Tensor:
    """Per row, how far transformers' logits move, computed in fp64, when the input embeddings move
    by less than fp32's rounding (relative 1e-7, three draws). A random tiny model has rows where
    that is large: at six-layers-tied, 700 ids, rows 572-574 move by up to 0.030 (the median row by
    7e-5), and there two fp32 forwards agree only as far as their rounding happens to fall, which
    changes with the CPU's kernels (oneDNN's conv on an AMX machine against an AVX2 one)."""
    ref64 = ref.to(torch.float64)
    try:
        with torch.no_grad():
            emb = ref64.get_input_embeddings()(ids[None])
            base = ref64(inputs_embeds=emb).logits[0]
            moved = []
            for seed in range(3):
                noise = torch.randn(emb.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
                moved.append((ref64(inputs_embeds=emb * (1 + 1e-7 * noise)).logits[0] - base).abs().amax(-1))
        return torch.stack(moved).amax(0).float()
    finally:
        ref.to(torch.float32)


@pytest.mark.parametrize("length", LENGTHS)
def test_logits_equal_transformers(pair, length):
    """Within 1e-4 of the logits' scale on every row, plus twice what sub-rounding noise does to that
    row (``_rounding_response``: well under 1e-5 of the scale on a typical row)."""
    ours, ref, tc = pair
    ids = torch.randint(0, tc["vocab_size"], (length,), generator=torch.Generator().manual_seed(length))
    got = ours.logits(ids)
    want = _ref_logits(ref, ids)
    assert got.shape == (length, tc["vocab_size"]) and got.dtype == torch.float32
    bound = 1e-4 * want.abs().max() + 2 * _rounding_response(ref, ids)
    assert ((got - want).abs().amax(-1) <= bound).all()


def test_split_prefill_equals_one_piece_and_transformers_cache(pair):
    ours, ref, tc = pair
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, tc["vocab_size"], (300,), generator=gen)
    cuts = [0, 1, 5, 64, 77, 200, 300]  # pieces of 1, 4, 59, 13, 123 and 100 ids
    state = ours.new_state()
    pieces = [ours.forward(ids[a:b], state, logits_at=slice(None)) for a, b in pairwise(cuts)]
    split = torch.cat(pieces)
    whole = ours.logits(ids)
    _close(split, whole)
    assert state.length == 300

    with torch.no_grad():
        out = ref(input_ids=ids[None], use_cache=True)
    cache = out.past_key_values
    cfg = ours.config
    for j, layer in enumerate(cfg.linear_layers):
        conv = cache.layers[layer].conv_states[0][0]
        rec = cache.layers[layer].recurrent_states[0][0]
        _close(state.conv[j], conv)
        _close(state.recurrent[j], rec)
    for j, layer in enumerate(cfg.full_layers):
        keys = cache.layers[layer].keys[0].permute(1, 0, 2)  # [T, kv_heads, hd]
        values = cache.layers[layer].values[0].permute(1, 0, 2)
        _close(state.k[j][:300], keys)
        _close(state.v[j][:300], values)


def test_logits_only_where_asked(pair):
    ours, _, tc = pair
    ids = torch.randint(0, tc["vocab_size"], (50,), generator=torch.Generator().manual_seed(1))
    last = ours.forward(ids, ours.new_state(), logits_at=[-1])
    assert last is not None and last.shape == (1, tc["vocab_size"])
    _close(last[0], ours.logits(ids)[-1], rel=1e-5)  # one row through the head rounds like all rows
    assert ours.forward(ids, ours.new_state()) is None


def test_bf16_forward_close_to_fp32(tmp_path):
    tc = CONFIGS["gva-untied"]
    folder = write_checkpoint(tmp_path, tc, dtype=torch.bfloat16, seed=2)
    ids = torch.randint(0, tc["vocab_size"], (130,), generator=torch.Generator().manual_seed(0))
    lo = Qwen35.from_pretrained(folder, dtype="bfloat16").logits(ids)
    hi = Qwen35.from_pretrained(folder, dtype="float32").logits(ids)
    rel = (lo - hi).norm() / hi.norm()
    assert rel < 6e-2, rel  # bf16 activations over 4 random layers; a sanity bound, not an exactness claim
