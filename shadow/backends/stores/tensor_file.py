"""A safetensors file read without safetensors' reader: its header, and its tensors as views of one
buffer read from the file.

Why not ``safe_open(...).get_tensor``: with ``framework="pt"`` each call leaves two Python int
objects alive for the life of the process (safetensors 0.7.0 and 0.8.0; the numpy framework and the
header calls leave none). A server restores parked files all day: the 60-minute soak at 22c0a0e
grew by 37 MiB an hour, and pymalloc's 32-byte size class held the growth
(``benchmarks/probes/server_memory.py``; ``tests/backends/test_tensor_file.py`` checks this reader
leaves nothing). Writing stays with safetensors (``serialize_file``), and the format is small and
fixed: 8 bytes of little-endian header length, the header's JSON (each tensor's dtype, shape and
byte range in the data; ``__metadata__``: strings), then the data.

The checks are the format's own (the ones safetensors makes on opening): a bounded header, known
dtypes, each range as long as its shape says, the ranges covering the data exactly and in order.
Anything else raises ``ValueError`` (or ``OSError`` from the disk); the caller refuses the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

MAX_HEADER_BYTES = 100_000_000  # safetensors' own bound
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


@dataclass(frozen=True)
class Slot:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    metadata: dict[str, str]
    slots: dict[str, Slot]
    data_len: int


def read_header(f: BinaryIO, file_len: int) -> Header:
    head = f.read(8)
    if len(head) != 8:
        raise ValueError("shorter than the header's length field")
    n = int.from_bytes(head, "little")
    if n > min(MAX_HEADER_BYTES, file_len - 8):
        raise ValueError(f"header of {n} bytes in a file of {file_len}")
    raw = json.loads(f.read(n))
    if not isinstance(raw, dict):
        raise ValueError("header is not a JSON object")
    metadata = raw.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("__metadata__ is not a map of strings")
    data_len = file_len - 8 - n
    slots: dict[str, Slot] = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict) or spec.get("dtype") not in DTYPES:
            raise ValueError(f"tensor {name[:80]!r}: no known dtype")
        shape, offsets = spec.get("shape"), spec.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"tensor {name[:80]!r}: shape {str(shape)[:80]}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise ValueError(f"tensor {name[:80]!r}: data_offsets {str(offsets)[:80]}")
        begin, end = offsets
        size = math.prod(shape) * DTYPES[spec["dtype"]].itemsize
        if not 0 <= begin <= end or end - begin != size:
            raise ValueError(f"tensor {name[:80]!r}: bytes {begin}..{end} for {size}")
        slots[name] = Slot(spec["dtype"], tuple(shape), begin, end)
    at = 0
    for slot in sorted(slots.values(), key=lambda s: (s.begin, s.end)):
        if slot.begin != at:
            raise ValueError(f"the data's byte ranges leave a gap or overlap at {at}")
        at = slot.end
    if at > data_len:
        raise ValueError(f"the tensors run past the end of the file ({at} bytes of data, {data_len} there: "
                         "cut short?)")
    if at != data_len:
        raise ValueError(f"the tensors cover {at} bytes of a data section of {data_len}")
    return Header(metadata, slots, data_len)


def open_header(path: Path) -> Header:
    with open(path, "rb") as f:
        return read_header(f, path.stat().st_size)


def read(path: Path) -> tuple[Header, dict[str, torch.Tensor]]:
    """The header and every tensor: one read of the data into a writable buffer, each tensor a view of
    it (a range not aligned to its dtype is copied out on its own)."""
    with open(path, "rb") as f:
        header = read_header(f, path.stat().st_size)
        buf = bytearray(header.data_len)
        view, got = memoryview(buf), 0
        while got < header.data_len:
            n = f.readinto(view[got:])
            if not n:
                raise ValueError(f"the data ends at {got} of {header.data_len} bytes")
            got += n
    tensors = {}
    for name, s in header.slots.items():
        dtype = DTYPES[s.dtype]
        if s.end == s.begin:
            tensors[name] = torch.empty(s.shape, dtype=dtype)
        elif s.begin % dtype.itemsize:
            tensors[name] = torch.frombuffer(bytearray(view[s.begin:s.end]), dtype=dtype).view(s.shape)
        else:
            tensors[name] = torch.frombuffer(buf, dtype=dtype, count=(s.end - s.begin) // dtype.itemsize,
                                             offset=s.begin).view(s.shape)
    return header, tensors
