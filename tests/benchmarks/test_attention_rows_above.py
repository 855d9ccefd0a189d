"""The rows-above probe's own checks, run on the Triton kernel under the interpreter (small shapes,
fp32): a chunk's attention ignores what the session's rows above it hold, and each chunk of a span
read from one table equals that chunk read from a table of its own."""

import pytest
import torch

import benchmarks.probes.attention_rows_above as probe


# a chunk the split rule splits; at 512 the 64-row and 128-row rules split it differently
@pytest.mark.slow  # under Triton's interpreter (15 s and more of the inner loop)
@pytest.mark.parametrize(("kernel", "start"), [("triton", 64), ("gluon-wg", 512)])
def test_a_chunk_ignores_the_rows_above_it_and_a_span_equals_its_chunks(monkeypatch, kernel, start):
    """With the ``gluon-wg`` backend the CPU's chunks still go to the Triton kernel, and their tables
    must carry its split rule (at c974d7e they carried the Gluon kernel's, and the table and the call
    disagreed). The backend is built here, not chosen: ``choose`` refuses Gluon off a Hopper."""
    from shadow.backends.qwen35.attention import backend_class

    try:
        backend = backend_class(kernel)()
    except ImportError:
        pytest.skip("this Triton has no Gluon Hopper module")
    monkeypatch.setattr(probe, "DEVICE", "cpu")
    monkeypatch.setattr(probe, "ROWS", 32)
    monkeypatch.setattr(probe, "DIM", 16)
    monkeypatch.setattr(torch.Tensor, "bfloat16", lambda self: self.float())  # the interpreter's products are fp32
    gen = torch.Generator().manual_seed(1)
    row = probe._chunk(backend, start, gen)
    assert row["splits"] > 1
    for pair in ("call_zero_vs_random", "call_zero_vs_nan", "table_one_vs_call"):
        assert row[pair]["equal"], (pair, row[pair])
    assert len(row["span_entries_vs_alone"]) == probe.SPAN
    assert all(entry["equal"] for entry in row["span_entries_vs_alone"]), row["span_entries_vs_alone"]
