"""The safetensors reader of parked files (``backends/tensor_file.py``) beside safetensors' own: the same
tensors and metadata bit for bit, nothing left alive per read, and a damaged file a ValueError."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from shadow.backends import tensor_file


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "k.0": torch.randn(5, 2, 8, generator=g).to(torch.bfloat16),
        "recurrent.3": torch.randn(4, 8, 8, generator=g),
        "conv.1": torch.randn(12, 4, generator=g).to(torch.float16),
        "ids": torch.randint(0, 150_000, (37,), generator=g, dtype=torch.int32),
        "mask": torch.rand(9, generator=g) > 0.5,
        "empty": torch.empty(0, 3, dtype=torch.float32),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "odd": torch.arange(3, dtype=torch.uint8),
    }


def test_a_file_reads_as_safetensors_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    save_file(_tensors(), str(path), metadata={"session": "s", "book": "{}"})
    header, got = tensor_file.read(path)
    with safe_open(str(path), framework="pt") as f:
        want = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a mapping)
        assert header.metadata == f.metadata()
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name
    got["k.0"][0, 0, 0] = 7  # writable, and its own bytes only
    assert torch.equal(got["recurrent.3"], want["recurrent.3"])
    for name, t in got.items():  # each owns its memory: one kept does not keep the file's other bytes alive
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name


def test_reading_leaves_nothing_alive(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    save_file(_tensors(), str(path), metadata={"session": "s"})
    for _ in range(20):
        tensor_file.read(path)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(300):
            tensor_file.read(path)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    here = tracemalloc.Filter(True, tensor_file.__file__)
    kept = sum(s.count_diff for s in after.filter_traces([here]).compare_to(before.filter_traces([here]), "filename"))
    # safetensors' get_tensor keeps two ints a tensor: 300 reads of 8 tensors would keep 4,800
    assert kept < 20


def _file(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I32", "shape": [1], "data_offsets": [8, 12]}}


@pytest.mark.parametrize(("case", "content"), [
    ("cut data", _file(GOOD, bytes(10))),
    ("data too long", _file(GOOD, bytes(16))),
    ("header past the end", (10**6).to_bytes(8, "little") + b"{}"),
    ("no length field", b"\x01\x02"),
    ("not json", (3).to_bytes(8, "little") + b"{x}"),
    ("a list", _file([], b"")),  # type: ignore[arg-type]
    ("unknown dtype", _file({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, bytes(4))),
    ("size against shape", _file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(4))),
    ("overlap", _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(4))),
    ("gap", _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8))),
    ("negative dim", _file({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"")),
    ("metadata not strings", _file({"__metadata__": {"x": 1}}, b"")),
])
def test_a_damaged_file_is_a_value_error(tmp_path: Path, case: str, content: bytes) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        tensor_file.read(path)


def test_the_good_layout_of_the_damaged_cases_reads(tmp_path: Path) -> None:
    path = tmp_path / "good.safetensors"
    path.write_bytes(_file(GOOD, torch.tensor([1.0, 2.0]).numpy().tobytes() + torch.tensor([5], dtype=torch.int32)
                           .numpy().tobytes()))
    _, t = tensor_file.read(path)
    assert torch.equal(t["a"], torch.tensor([1.0, 2.0])) and torch.equal(t["b"], torch.tensor([5], dtype=torch.int32))
