"""ModelState's KV buffers: growth keeps the held rows bit for bit; rows above them are never
written (the tests' ``torch.empty`` gives NaN, so no code can mistake one for a zero row)."""

from __future__ import annotations

from array import array

import pytest
import torch

from shadow.backends.qwen35 import KV_STEP, ModelState
from shadow.backends.qwen35.checkpoint import demo_text_config
from shadow.backends.qwen35.config import Qwen35Config


def test_reserve_keeps_held_rows_and_leaves_the_rest_unwritten() -> None:
    cfg = Qwen35Config.from_dict(demo_text_config())
    s = ModelState.empty(cfg, "cpu", torch.float32)
    s.reserve(100)
    assert s.capacity == KV_STEP
    rows = torch.randn(100, *s.k[0].shape[1:])
    s.k[0][:100].copy_(rows)
    s.length = 100
    s.reserve(KV_STEP + 1)  # one step more: the held rows are copied into the grown buffer
    assert s.capacity == 2 * KV_STEP
    assert torch.equal(s.k[0][:100], rows)
    assert torch.isnan(s.k[0][100:]).all() and torch.isnan(s.v[0]).all()


def test_a_sessions_bytes_count_every_tensor_it_holds_checkpoints_included(checkpoint) -> None:
    """``SessionTensors.nbytes`` counts a checkpoint as a copy of the conv and recurrent state: the
    same as summing every tensor, and a parked file whose checkpoint has another shape is refused."""

    from shadow.backends.qwen35 import Qwen35
    from shadow.backends.reader import TorchReader
    from shadow.core.session import SessionBook

    reader = TorchReader(Qwen35.from_pretrained(checkpoint, device="cpu", dtype="float32"), grid=64)
    t = reader.new_session()
    s = t.state

    def summed() -> int:
        parts = [*s.k, *s.v, *s.conv, *s.recurrent] + [x for saved in t.checkpoints.values() for p in saved for x in p]
        return sum(x.numel() * x.element_size() for x in parts)

    s.reserve(64)
    assert t.nbytes() == summed()
    for pos in (64, 128, 192):
        t.checkpoints[pos] = s.save_recurrent()
        assert t.nbytes() == summed()
    del t.checkpoints[128], t.checkpoints[192]
    assert t.nbytes() == summed()

    s.length = 64
    book = SessionBook(grid=64, ids=array("i", range(64)), committed=64)
    book.checkpoints.append(64)
    data = reader.serialise(book, t)
    back = reader.deserialise(book, data)
    assert back.nbytes() == t.nbytes() and torch.equal(back.checkpoints[64][1][0], s.recurrent[0])
    data["checkpoint.64.recurrent.0"] = data["checkpoint.64.recurrent.0"][:1]
    with pytest.raises(ValueError, match=r"checkpoint\.64\.recurrent\.0 has shape"):
        reader.deserialise(book, data)


def test_a_reads_table_is_each_chunks_row_and_follows_grown_buffers() -> None:
    """``read_table`` keeps each session's checked KV addresses between passes (``ModelState.memo``):
    its rows are the backend's ``table_row``'s for every layer, session and chunk, in that order, and
    when ``reserve`` replaces the buffers the next table points at the new ones and the memo lets
    the old ones go."""
    import gc
    import weakref

    from shadow.backends.qwen35.attention.triton import BM, TritonAttention
    from shadow.backends.qwen35.fast.staging import read_table

    attention = TritonAttention()
    cfg = Qwen35Config.from_dict(demo_text_config())
    heads = cfg.num_attention_heads
    grid, layers = 64, len(cfg.full_layers)
    states = [ModelState.empty(cfg, "cpu", torch.float32) for _ in range(3)]
    like = states[0].k[0][:1]  # the KV rows' kind: heads, head dim, dtype and device
    for s, depth in zip(states, (0, 128, 4096), strict=True):
        s.reserve(depth + 2 * grid)
        s.length = depth

    def by_rows(seg: int) -> list[int]:
        return [x for i in range(layers) for s in states for at in range(s.length, s.length + seg, grid)
                for x in attention.table_row(at, grid, heads, s.k[i], s.v[i])]

    for seg in (grid, 2 * grid):
        assert read_table(states, [s.length for s in states], seg, grid, layers, heads, like, BM) == by_rows(seg)
    old = weakref.ref(states[2].k[0])
    states[2].length = KV_STEP - grid
    states[2].reserve(KV_STEP + grid)  # grown: new buffers at new addresses
    gc.collect()
    assert old() is None, "the memo still holds a buffer its state dropped"
    assert read_table(states, [s.length for s in states], grid, grid, layers, heads, like, BM) == by_rows(grid)
    states[1].length = states[1].capacity  # a state whose buffers are short of its chunk is refused
    with pytest.raises(ValueError, match="KV buffers hold"):
        read_table(states, [s.length for s in states], grid, grid, layers, heads, like, BM)
