"""The parked-file format, apart from where files live: what a file holds, its checksum, and every
check made on opening and loading one. DiskStore uses it; a later store (an object store) can too.

A file is safetensors: the committed KV rows, the conv and recurrent state, the checkpoints, the ids
read, and in its metadata: format version, the model's weights hash, the grid, the dtype, the
fingerprint of the arithmetic that made it (``backends/fingerprint.py``), the layout
of each tensor kind, the session's name and bookkeeping, when it was parked, and a BLAKE2b checksum
over every tensor and every other metadata field. The checksum is not keyed: it finds damage, not
forgery (whoever can write the folder can write any session; the README says who owns it).

Nothing here raises out on a bad file: ``open_header`` and ``load`` raise ``Refused`` with the
reason, whatever went wrong underneath (a deep JSON nesting's RecursionError included), and every
metadata field is bounded in length before it is parsed.

Nothing a file claims is trusted before it is checked (``Layout``): the header's length and tensor
count are bounded by what a park of this model can hold, every name is one a park of this model
has, every dtype, rank and dimension is the model's (a KV tensor's rows and the ids' count are free
up to the store's cap, then checked against the book), and every byte range lies inside the file,
all before a byte of data is read or allocated. A file refused costs time linear in its size; a
file loaded costs memory for exactly what its checked book says the session holds, and a file
with holes (fewer bytes on disk than it claims) has its checksum checked a block at a time first.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import TensorSpec, serialize_file

from shadow.backends import tensor_file
from shadow.core.session import MAX_CHECKPOINTS, SessionBook, checked_meta

# 2: the checksum covers the metadata; 3: the fingerprint (files of 2 do not say which arithmetic made them)
FORMAT_VERSION = "shadow-session-3"
FINGERPRINT = "fingerprint"  # the metadata field: the reader's fingerprint when it parked the session
LAYOUT = {
    "k": "[rows, kv_heads, head_dim] per full-attention layer, committed rows only",
    "v": "[rows, kv_heads, head_dim] per full-attention layer, committed rows only",
    "conv": "[conv_dim, kernel] per GDN layer: the last `kernel` pre-conv inputs",
    "recurrent": "[value_heads, key_dim, value_dim] fp32 per GDN layer (S, keys first)",
    "ids": "[n] int32: every id the session holds",
}
SUFFIX = ".safetensors"
FUTURE_SLACK_S = 60.0  # a wall clock stepped back (NTP) must not refuse a file parked just before
META_KEYS = {"format", "weights_hash", "grid", "dtype", FINGERPRINT, "session", "parked_at", "book", "layout",
             "checksum"}
# Longest each metadata field may be, checked before anything parses it. The book's lists are
# bounded by the ids (one wanted line per grid line at most): 4 MiB holds 2M ids on a grid of 16.
MAX_CHARS = {"format": 64, "weights_hash": 128, "grid": 16, "dtype": 32, FINGERPRINT: 64, "session": 4096,
             "parked_at": 40, "book": 4 * 2**20, "layout": 4096, "checksum": 64}


class Refused(Exception):
    """A file that must not load; the message says why."""


ROWS = ("k", "v")  # the tensor kinds whose first dimension is the committed rows
SAVED = ("conv", "recurrent")  # the kinds a checkpoint holds a copy of
ENTRY_BYTES = 256  # a header entry's JSON: a name of at most 40 characters, its dtype, shape and range
HEADER_SLACK = 4096  # the header's braces, quotes and the metadata's keys


class Layout:
    """What a park of this model may hold, by name, from the reader's ``state_specs`` (each state
    tensor's safetensors dtype and shape, a KV tensor's with 0 rows): the ``Expect`` a parked file's
    header is checked against before any of its data is read. ``max_bytes``: the store's cap (a
    file past it is never a park the store keeps)."""

    def __init__(self, specs: dict[str, tuple[str, tuple[int, ...]]], grid: int, max_bytes: int) -> None:
        self.grid = grid
        self.specs: dict[str, tensor_file.Spec] = {
            name: (dtype, (None, *shape[1:]) if name.split(".")[0] in ROWS else shape)
            for name, (dtype, shape) in specs.items()}
        self.specs["ids"] = ("I32", (None,))
        saved = sum(name.split(".")[0] in SAVED for name in specs)
        tensors = len(self.specs) + MAX_CHECKPOINTS * saved
        # The book is ASCII JSON inside a JSON string: each of its characters at most 2 bytes
        # there (a quote escaped); any other field's character at most 6 (``\u00XX``).
        meta = 2 * MAX_CHARS["book"] + 6 * sum(n for k, n in MAX_CHARS.items() if k != "book")
        self.expect = tensor_file.Expect(max_header=meta + ENTRY_BYTES * tensors + HEADER_SLACK,
                                         max_tensors=tensors, spec=self.spec, max_dim=max_bytes,
                                         max_data=max_bytes)

    def spec(self, name: str) -> tensor_file.Spec | None:
        """The dtype and shape ``name`` must have, or None for a name no park of this model holds. A
        checkpoint's name is ``checkpoint.<line>.<conv|recurrent>.<layer>``, at a grid line."""
        if not name.startswith("checkpoint."):
            return self.specs.get(name)
        _, line, rest = (name.split(".", 2) + ["", ""])[:3]
        if not (line.isdecimal() and line.isascii() and len(line) <= 12 and line[0] != "0"
                and int(line) % self.grid == 0 and rest.split(".")[0] in SAVED):
            return None
        return self.specs.get(rest)


def file_name(session: str) -> str:
    """A digest of the session's name: any name makes a safe file name, and a file names its session."""
    return hashlib.sha256(session.encode()).hexdigest()[:40] + SUFFIX


def identity(weights_hash: str, grid: int, dtype: str) -> dict[str, str]:
    """The fields a file must match to be opened under this reader. The fingerprint is apart
    (``FINGERPRINT``, given to ``encode`` with these): a file under another is whole and holds the
    session's ids, so it is opened, and its state refused on restoring."""
    return {"format": FORMAT_VERSION, "weights_hash": weights_hash, "grid": str(grid), "dtype": dtype}


def checksum(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """BLAKE2b of each tensor (name, dtype, shape, bytes) on a thread pool (hashlib lets go of the
    GIL on large buffers), then BLAKE2b over those digests in name order and every metadata field
    but the checksum itself: the session's name, its book and its ids are covered as its tensors are."""

    def one(name: str) -> bytes:
        t = tensors[name].contiguous()
        h = hashlib.blake2b(digest_size=32)
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.view(torch.uint8).reshape(-1).numpy().data)
        return h.digest()

    return _top(sorted(tensors), one, meta)


def _top(names: list[str], one: Callable[[str], bytes], meta: dict[str, str]) -> str:
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(one, names))
    top = hashlib.blake2b(digest_size=32)
    for d in digests:
        top.update(d)
    top.update(json.dumps({k: v for k, v in meta.items() if k != "checksum"}, sort_keys=True).encode())
    return top.hexdigest()


STREAM_BLOCK = 8 * 2**20  # bytes hashed at a time when a file is checked before it is read


def file_checksum(path: Path, header: tensor_file.Header, meta: dict[str, str]) -> str:
    """``checksum`` of the file's tensors as they lie on disk, read a block at a time: memory for
    one block a thread, whatever the file claims (what a file with holes is checked with before
    anything is allocated for it)."""
    base = path.stat().st_size - header.data_len

    def one(name: str) -> bytes:
        s = header.slots[name]
        h = hashlib.blake2b(digest_size=32)
        h.update(f"{name}|{tensor_file.DTYPES[s.dtype]}|{list(s.shape)}|".encode())
        with open(path, "rb", buffering=0) as f:
            at, end = base + s.begin, base + s.end
            while at < end:
                block = os.pread(f.fileno(), min(STREAM_BLOCK, end - at), at)
                if not block:
                    raise ValueError(f"tensor {name!r} is cut short")
                h.update(block)
                at += len(block)
        return h.digest()

    return _top(sorted(header.slots), one, meta)


def _has_holes(path: Path) -> bool:
    """Fewer bytes on disk than the file's size: what it claims was never written (a sparse file).
    A park is written whole; a compressing file system may say the same of one, which then only
    costs a second read."""
    st = os.stat(path)
    return st.st_blocks * 512 < st.st_size


def ids_tensor(ids: array[int]) -> torch.Tensor:
    """The book's int32 ids as a tensor of their own bytes: no int object made per id. A copy, at
    once: ``frombuffer``'s view would point into the book's buffer even after the array moves it."""
    return torch.frombuffer(ids, dtype=torch.int32).clone() if ids else torch.empty(0, dtype=torch.int32)


def ids_array(ids: torch.Tensor) -> array[int]:
    """A file's int32 ids tensor as the ``array("i")`` a book holds, from its bytes."""
    out = array("i")
    out.frombytes(ids.contiguous().view(torch.uint8).numpy().data)
    return out


def encode(name: str, book: SessionBook, state: dict[str, torch.Tensor], ident: dict[str, str],
           now: float) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of ``name``'s file (``state``: the reader's serialised tensors)."""
    data = {"ids": ids_tensor(book.ids), **state}
    meta = {**ident, "session": name, "parked_at": repr(now), "book": json.dumps(book.meta()),
            "layout": json.dumps(LAYOUT)}
    meta["checksum"] = checksum(data, meta)
    return data, meta


def write(path: Path, data: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    """The file at ``path``, written from each tensor's own bytes (CPU, contiguous).

    Not ``safetensors.torch.save_file``: it views each tensor through ``np.ctypeslib.as_array``,
    which makes a ctypes array type and a pointer type for each byte length it meets, and ctypes
    keeps them for the life of the process. A park's sizes follow the session's length, so a
    server that parks all the day long grew by about three classes a park (the soak, 16 minutes:
    +1,065 classes in 80 s, RSS growing with them); this path makes none."""
    held = {k: t.detach().to("cpu").contiguous() for k, t in data.items()}
    empty = torch.empty(1, dtype=torch.uint8)  # an address for a tensor of no bytes (never read)
    specs = {k: TensorSpec(dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape),
                           data_ptr=t.data_ptr() if t.numel() else empty.data_ptr(),
                           data_len=t.numel() * t.element_size())
             for k, t in held.items()}
    serialize_file(specs, str(path), metadata=meta)  # ``held`` keeps every address valid meanwhile


def open_header(path: Path, ident: dict[str, str], layout: Layout, now: float) -> dict[str, str]:
    """The file's metadata, every field checked against the others, the tensors' shapes and this
    reader (``layout``: what its parks hold). Raises Refused, and nothing else."""
    try:
        header = tensor_file.open_header(path, layout.expect)
        meta = header.metadata
    except Exception as e:  # whatever a damaged file makes the reader raise refuses it
        raise Refused(f"unreadable: {type(e).__name__}: {str(e)[:200]}") from None
    try:
        for key, want in ident.items():
            if meta.get(key) != want:
                raise Refused(f"{key} is {str(meta.get(key))[:80]!r}, this reader has {want!r}")
        book = _checked_meta(path, meta, layout.grid, now)
        _check_tensors(header, book, layout)
    except Refused:
        raise
    except Exception as e:  # ValueError, TypeError, RecursionError, ...: all refuse the file
        raise Refused(f"bad metadata: {type(e).__name__}: {str(e)[:200]}") from None
    return meta


def _checked_meta(path: Path, meta: dict[str, str], grid: int, now: float) -> dict[str, Any]:
    if set(meta) != META_KEYS:
        raise ValueError(f"fields {sorted(meta)[:20]}, expected {sorted(META_KEYS)}")
    long = {k: len(v) for k, v in meta.items() if not isinstance(v, str) or len(v) > MAX_CHARS[k]}
    if long:
        raise ValueError(f"fields longer than allowed: {long} (at most {({k: MAX_CHARS[k] for k in long})})")
    name = meta["session"]
    if not name or path.name != file_name(name):
        raise ValueError(f"holds session {name[:80]!r}, whose file is {file_name(name)}, not {path.name}")
    if meta["layout"] != json.dumps(LAYOUT):
        raise ValueError("layout differs from this format's")
    for key, what in (("checksum", "BLAKE2b-256"), (FINGERPRINT, "SHA-256")):
        if len(meta[key]) != 64 or set(meta[key]) - set("0123456789abcdef"):
            raise ValueError(f"{key} {meta[key]!r} is not a {what} hex digest")
    parked_at = float(meta["parked_at"])
    if not math.isfinite(parked_at) or parked_at > now + FUTURE_SLACK_S:
        raise ValueError(f"parked_at {meta['parked_at']} is not a time at or before now ({now!r})")
    return checked_meta(json.loads(meta["book"]), grid)


def _check_tensors(header: tensor_file.Header, book: dict[str, Any], layout: Layout) -> None:
    """The tensors are the ones a session of this book holds: the ids, every KV tensor with the
    committed rows, the conv and recurrent state, each checkpoint's copy of them (their dtypes,
    ranks and other dimensions are the ``Layout``'s, checked as the header was read)."""
    shapes = {k: s.shape for k, s in header.slots.items()}
    if shapes.get("ids") != (book["n_ids"],):
        raise ValueError(f"ids are {shapes.get('ids')}, the book holds {book['n_ids']} int32 ids")
    rows = {s[0] for k, s in shapes.items() if k.split(".")[0] in ROWS}
    if rows and rows != {book["committed"]}:
        raise ValueError(f"KV rows are {sorted(rows)}, the book commits {book['committed']}")
    held = {int(k.split(".")[1]) for k in shapes if k.startswith("checkpoint.")}
    if held != set(book["checkpoints"]):
        raise ValueError(f"checkpoint tensors at {sorted(held)}, the book holds {book['checkpoints']}")
    state = [k for k in layout.specs if k != "ids"]
    want = {"ids", *state, *(f"checkpoint.{line}.{k}" for line in held for k in state if k.split(".")[0] in SAVED)}
    if set(shapes) != want:
        missing = sorted(want - set(shapes))
        raise ValueError(f"tensors missing: {missing[:8]}{'...' if len(missing) > 8 else ''}")


def load(path: Path, meta: dict[str, str], name: str, vocab_size: int, layout: Layout,
         expect_checksum: str | None = None) -> tuple[SessionBook, dict[str, torch.Tensor]]:
    """The book and tensors of a file whose header passed ``open_header``, for session ``name``:
    the header checked again as it is read (the file may have changed since), the checksum
    re-computed (and, given ``expect_checksum``, that of the park this process made), the session
    and the ids checked. Raises Refused, and nothing else."""
    if expect_checksum is not None and meta["checksum"] != expect_checksum:  # known from the header alone
        raise Refused("a valid file, but not the last park this process made of the session")

    def same(header: tensor_file.Header) -> None:  # the file may have changed since open_header
        if header.metadata != meta:
            raise ValueError("the header changed since it was opened")
        _check_tensors(header, checked_meta(json.loads(meta["book"]), layout.grid), layout)

    try:
        if _has_holes(path):  # its claims are not on disk: checked a block at a time before they are allocated
            header = tensor_file.open_header(path, layout.expect)
            same(header)
            if file_checksum(path, header, meta) != meta["checksum"]:
                raise Refused("checksum mismatch")
        _, data = tensor_file.read(path, layout.expect, same)  # not safetensors' get_tensor, which leaks
    except Refused:
        raise
    except Exception as e:  # a file cut or changed since its header was read
        raise Refused(f"unreadable: {type(e).__name__}: {str(e)[:200]}") from None
    try:
        if checksum(data, meta) != meta["checksum"]:
            raise Refused("checksum mismatch")
        if meta["session"] != name:  # a file that is not this session's, whatever else it gets right
            raise Refused(f"holds session {meta['session'][:80]!r}, not {name!r}")
        ids = data.pop("ids")
        if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < vocab_size):
            raise Refused(f"ids outside the vocabulary [0, {vocab_size})")
        return SessionBook.from_meta(json.loads(meta["book"]), ids_array(ids)), data
    except Refused:
        raise
    except Exception as e:  # nothing a file holds may raise out of the store
        raise Refused(f"bad file: {type(e).__name__}: {str(e)[:200]}") from None
