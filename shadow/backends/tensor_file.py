"""A safetensors file read without safetensors' reader: its header, and its tensors, each read into
memory of its own. Shared by the weights (``qwen35/weights.py``, headers only) and the parked format
(``stores/parked.py``).

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
A caller that knows what the file should hold passes an ``Expect``: the header's length, the
tensor count, each name, dtype, rank and dimension are then checked against it as the header is
walked, before any product of dimensions is taken and before a byte of data is read. Every step is
linear in the header's size (the dimensions' product stops as soon as it passes the data's size:
a thousand huge dimensions cost a thousand comparisons, not big-number products).
Anything else raises ``ValueError`` (or ``OSError`` from the disk); the caller refuses the file.

Each tensor is read into a tensor of its own (``readinto`` its bytes): a tensor kept after the read
(a restored checkpoint) holds its own bytes, never a view that keeps the whole file alive.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

MAX_HEADER_BYTES = 100_000_000  # safetensors' own bound
MAX_RANK = 16  # no tensor of the weights or of a park has more dimensions
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
NAMES = {t: name for name, t in DTYPES.items()}  # torch dtype -> its safetensors name


@dataclass(frozen=True)
class ByteRange:
    """One tensor of a file: its dtype's safetensors name, its shape, its bytes in the data section."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    metadata: dict[str, str]
    slots: dict[str, ByteRange]
    data_len: int


# A name's expected dtype and shape; ``None`` in a shape: a free dimension (rows), at most ``max_dim``.
Spec = tuple[str, tuple[int | None, ...]]


@dataclass(frozen=True)
class Expect:
    """What a file may hold, checked on the header before anything is allocated for its data.

    ``spec(name)`` gives the name's dtype and shape, or None for a name the file may not hold.
    ``max_data`` bounds the data section (what the caller may hold in memory for it)."""

    max_header: int
    max_tensors: int
    spec: Callable[[str], Spec | None]
    max_dim: int
    max_data: int


def _checked_shape(name: str, shape: Any, dtype: str, expect: Expect | None) -> tuple[int, ...]:
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise ValueError(f"tensor {name[:80]!r}: shape {str(shape)[:80]}")
    if expect is not None:
        spec = expect.spec(name)
        if spec is None:
            raise ValueError(f"tensor {name[:80]!r}: not a name this file may hold")
        want_dtype, want = spec
        if dtype != want_dtype or len(shape) != len(want):
            raise ValueError(f"tensor {name[:80]!r}: {dtype} of rank {len(shape)}, expected {want_dtype} "
                             f"of rank {len(want)}")
        for d, w in zip(shape, want, strict=True):
            if type(d) is not int or (d != w if w is not None else not 0 <= d <= expect.max_dim):
                raise ValueError(f"tensor {name[:80]!r}: dimension {str(d)[:40]}, expected "
                                 f"{w if w is not None else f'at most {expect.max_dim}'}")
    elif not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"tensor {name[:80]!r}: shape {str(shape)[:80]}")
    return tuple(shape)


def _nbytes(shape: tuple[int, ...], itemsize: int, limit: int) -> int | None:
    """The tensor's size in bytes, or None once it passes ``limit``: the product stops early, so its
    numbers stay small whatever the dimensions."""
    if 0 in shape:
        return 0
    size = itemsize
    for d in shape:
        size *= d
        if size > limit:
            return None
    return size


def _small_int(text: str) -> int:
    """A header's integer: a dimension or an offset, never past 2**64 (20 digits). Longer ones are
    refused before Python converts them (quadratic in their digits)."""
    if len(text) > 20:
        raise ValueError(f"an integer of {len(text)} digits in the header")
    return int(text)


def _no_number(text: str) -> Any:
    raise ValueError(f"a number the format never holds in its header: {text[:40]}")


def read_header(f: BinaryIO, file_len: int, expect: Expect | None = None) -> Header:
    head = f.read(8)
    if len(head) != 8:
        raise ValueError("shorter than the header's length field")
    n = int.from_bytes(head, "little")
    bound = MAX_HEADER_BYTES if expect is None else min(MAX_HEADER_BYTES, expect.max_header)
    if n > min(bound, file_len - 8):
        raise ValueError(f"header of {n} bytes in a file of {file_len} (at most {bound} here)")
    data_len = file_len - 8 - n
    if expect is not None and data_len > expect.max_data:
        raise ValueError(f"{data_len} bytes of data, more than the {expect.max_data} this file may hold")
    raw = json.loads(f.read(n), parse_int=_small_int, parse_float=_no_number, parse_constant=_no_number)
    if not isinstance(raw, dict):
        raise ValueError("header is not a JSON object")
    metadata = raw.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("__metadata__ is not a map of strings")
    if expect is not None and len(raw) > expect.max_tensors:
        raise ValueError(f"{len(raw)} tensors, at most {expect.max_tensors} here")
    slots: dict[str, ByteRange] = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict) or spec.get("dtype") not in DTYPES:
            raise ValueError(f"tensor {name[:80]!r}: no known dtype")
        shape = _checked_shape(name, spec.get("shape"), spec["dtype"], expect)
        offsets = spec.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise ValueError(f"tensor {name[:80]!r}: data_offsets {str(offsets)[:80]}")
        begin, end = offsets
        if end > data_len:
            raise ValueError(f"tensor {name[:80]!r}: the tensors run past the end of the file (to byte {end} of "
                             f"a data section of {data_len}: cut short?)")
        size = _nbytes(shape, DTYPES[spec["dtype"]].itemsize, data_len)
        if size is None or not 0 <= begin <= end or end - begin != size:
            raise ValueError(f"tensor {name[:80]!r}: bytes {begin}..{end} for shape {str(shape)[:80]} "
                             f"in a data section of {data_len}")
        slots[name] = ByteRange(spec["dtype"], shape, begin, end)
    at = 0
    for slot in sorted(slots.values(), key=lambda s: (s.begin, s.end)):
        if slot.begin != at:
            raise ValueError(f"the data's byte ranges leave a gap or overlap at {at}")
        at = slot.end
    if at != data_len:
        raise ValueError(f"the tensors cover {at} bytes of a data section of {data_len}")
    return Header(metadata, slots, data_len)


def open_header(path: Path, expect: Expect | None = None) -> Header:
    with open(path, "rb") as f:
        return read_header(f, path.stat().st_size, expect)


def read(path: Path, expect: Expect | None = None,
         check: Callable[[Header], None] | None = None) -> tuple[Header, dict[str, torch.Tensor]]:
    """The header and every tensor, each read into memory of its own, in the file's order (one pass
    over the data). ``expect`` as for ``open_header``; ``check``: the caller's own look at the header
    (raising to refuse it). Both come before a byte of data is read or allocated."""
    with open(path, "rb") as f:
        header = read_header(f, path.stat().st_size, expect)
        if check is not None:
            check(header)
        base = f.tell()
        tensors: dict[str, torch.Tensor] = {}
        for name, s in sorted(header.slots.items(), key=lambda kv: kv[1].begin):
            t = torch.empty(s.shape, dtype=DTYPES[s.dtype])
            if s.end > s.begin:
                f.seek(base + s.begin)
                view, got = t.view(-1).view(torch.uint8).numpy().data, 0  # the tensor's own bytes
                while got < len(view):
                    n = f.readinto(view[got:])
                    if not n:
                        raise ValueError(f"the data ends at {s.begin + got} of {header.data_len} bytes")
                    got += n
            tensors[name] = t
    return header, tensors
