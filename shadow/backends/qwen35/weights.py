"""Qwen3.5 weights: the expected tensors, memory-mapped loading, and the weights hash.

Tensors are read straight from the safetensors files through ``mmap``: a tensor whose dtype
and device already match is a view of the mapped file, so host RAM holds no second copy.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

import torch

from shadow.core.errors import CheckpointError

from ..tensor_file import ByteRange, open_header
from .config import FULL, Qwen35Config

# Key prefixes of the text model in the published layouts: the multimodal release, a text-only
# CausalLM export, and MLX conversions. Order matters: the longest match wins.
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
_LM_HEAD_KEYS = ("lm_head.weight", "language_model.lm_head.weight")
# Parts of the releases a text forward never needs.
_IGNORED_PREFIXES = ("model.visual.", "visual.", "vision_tower.", "mtp.", "model.mtp.")

_DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
}


def expected_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    """Canonical name (no prefix) -> shape, for every tensor the text forward reads."""
    h, v = cfg.hidden_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (v, h), "norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, cfg.intermediate_size)
        if kind == FULL:
            a = p + "self_attn."
            shapes[a + "q_proj.weight"] = (cfg.num_attention_heads * cfg.head_dim * 2, h)
            shapes[a + "k_proj.weight"] = (cfg.num_key_value_heads * cfg.head_dim, h)
            shapes[a + "v_proj.weight"] = (cfg.num_key_value_heads * cfg.head_dim, h)
            shapes[a + "o_proj.weight"] = (h, cfg.num_attention_heads * cfg.head_dim)
            shapes[a + "q_norm.weight"] = (cfg.head_dim,)
            shapes[a + "k_norm.weight"] = (cfg.head_dim,)
        else:
            g = p + "linear_attn."
            nv = cfg.linear_num_value_heads
            shapes[g + "in_proj_qkv.weight"] = (cfg.conv_dim, h)
            shapes[g + "in_proj_z.weight"] = (cfg.value_dim, h)
            shapes[g + "in_proj_a.weight"] = (nv, h)
            shapes[g + "in_proj_b.weight"] = (nv, h)
            shapes[g + "out_proj.weight"] = (h, cfg.value_dim)
            shapes[g + "conv1d.weight"] = (cfg.conv_dim, 1, cfg.linear_conv_kernel_dim)
            shapes[g + "norm.weight"] = (cfg.linear_value_head_dim,)
            shapes[g + "A_log"] = (nv,)
            shapes[g + "dt_bias"] = (nv,)
    return shapes


def canonical_name(key: str) -> str | None:
    """The text model's name for a checkpoint key, or None for a part the text forward ignores."""
    if key.startswith(_IGNORED_PREFIXES):
        return None
    if key in _LM_HEAD_KEYS:
        return "lm_head.weight"
    for prefix in _TEXT_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key  # unexpected: reported by name by the caller


@dataclass(frozen=True, slots=True)
class _Entry:
    file: Path
    key: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def _read_header(path: Path) -> tuple[int, dict[str, ByteRange]]:
    """Where the data starts, and each tensor's slot: the one safetensors reader of the project
    (``tensor_file``), whose checks are the format's own; a file it refuses is a clear error."""
    try:
        header = open_header(path)
    except ValueError as e:  # the format's checks, and json's errors (ValueErrors too)
        raise CheckpointError(f"{path.name}: not a valid safetensors file: {e}") from e
    return path.stat().st_size - header.data_len, header.slots


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: no weight_map ({e})") from e
        files = sorted({folder / name for name in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{index} names {f.name}, which is missing")
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{folder}: no model.safetensors and no model.safetensors.index.json")
    return found


def scan(folder: str | Path, cfg: Qwen35Config) -> dict[str, _Entry]:
    """Read every header and check names and shapes against the config; nothing is loaded yet."""
    folder = Path(folder)
    entries: dict[str, _Entry] = {}
    for file in _weight_files(folder):
        data_start, slots = _read_header(file)
        for key, slot in slots.items():
            name = canonical_name(key)
            if name is None:
                continue
            if slot.dtype not in _DTYPES:
                raise CheckpointError(f"{file.name}: tensor {key!r} has unsupported dtype {slot.dtype}")
            if name in entries:
                raise CheckpointError(f"tensor {key!r} appears twice in the checkpoint")
            entries[name] = _Entry(file, key, slot.dtype, slot.shape, data_start + slot.begin, data_start + slot.end)
    if cfg.tie_word_embeddings and "lm_head.weight" in entries:
        # Some exports write the tied head out anyway; it must be the embedding to be ignorable.
        entries.pop("lm_head.weight")
    want = expected_shapes(cfg)
    unexpected = sorted(set(entries) - set(want))
    if unexpected:
        raise CheckpointError(f"unexpected tensor {entries[unexpected[0]].key!r}{_more(unexpected)}")
    missing = sorted(set(want) - set(entries))
    if missing:
        raise CheckpointError(f"missing tensor {missing[0]!r}{_more(missing)}")
    for name, shape in want.items():
        e = entries[name]
        if e.shape != shape:  # (each byte range matches its shape and dtype: the reader checked)
            raise CheckpointError(f"tensor {e.key!r} has shape {list(e.shape)}, expected {list(shape)}")
    return entries


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


def _mapped_tensor(entry: _Entry, storages: dict[Path, torch.UntypedStorage]) -> torch.Tensor:
    if entry.file not in storages:
        size = entry.file.stat().st_size
        # shared=False maps the file copy-on-write: pages are read on demand and never duplicated.
        storages[entry.file] = torch.UntypedStorage.from_file(  # type: ignore[assignment]
            str(entry.file), shared=False, nbytes=size)
    storage = storages[entry.file]
    dtype = _DTYPES[entry.dtype]
    if entry.start % dtype.itemsize:
        # A misaligned tensor cannot be a typed view of the map; copy its bytes (rare, small).
        raw = torch.empty(0, dtype=torch.uint8).set_(storage, entry.start, (entry.end - entry.start,), (1,))
        return raw.clone().view(dtype).reshape(entry.shape)
    t = torch.empty(0, dtype=dtype)
    strides = [1] * len(entry.shape)
    for i in range(len(entry.shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * entry.shape[i + 1]
    return t.set_(storage, entry.start // dtype.itemsize, entry.shape, strides)


def load(
    folder: str | Path, cfg: Qwen35Config, device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Canonical name -> tensor on ``device``. Float tensors take ``dtype``, except ``A_log``,
    which the forward always reads in fp32 (docs/model.md: releases disagree on its stored dtype)."""
    entries = scan(folder, cfg)
    storages: dict[Path, torch.UntypedStorage] = {}
    out: dict[str, torch.Tensor] = {}
    for name, entry in entries.items():
        t = _mapped_tensor(entry, storages)
        want = torch.float32 if name.endswith("A_log") else dtype
        out[name] = t.to(device=device, dtype=want)
    return out


def weights_hash(folder: str | Path, cfg: Qwen35Config) -> str:
    """A hex digest that identifies the text model's weights.

    BLAKE2b-256 over, for each tensor in order of canonical name (the key with its layout prefix
    removed): the name, its dtype, its shape, and its raw bytes as stored. Sharding, key prefix,
    file order and ignored parts (vision, MTP) do not enter it, so the same weights hash the same
    however they are packaged; any changed value changes it. The files are streamed in 16 MiB reads:
    1.8 s for the 0.8B (1.5 GB) on a 2-core CPU (benchmarks/results/cpu_weights_hash.json).
    """
    entries = scan(folder, cfg)
    digest = hashlib.blake2b(digest_size=32)
    buf = bytearray(1 << 24)
    view = memoryview(buf)
    files: dict[Path, BinaryIO] = {}
    try:
        for name in sorted(entries):
            e = entries[name]
            f = files.get(e.file)
            if f is None:
                f = files[e.file] = e.file.open("rb")
            digest.update(f"{name}|{e.dtype}|{list(e.shape)}|".encode())
            f.seek(e.start)
            left = e.end - e.start
            while left:
                got = cast(io.BufferedReader, f).readinto(view[:min(left, len(buf))])
                if not got:
                    raise CheckpointError(f"{e.file.name}: tensor {e.key!r} is cut short")
                digest.update(view[:got])
                left -= got
    finally:
        for f in files.values():
            f.close()
    return digest.hexdigest()
