"""Random Qwen3.5 checkpoints written in the releases' Hugging Face format.

Tests, benchmarks and the demo use these: ``config.json`` in the multimodal form (or a plain text
config), safetensors with the real key names (optionally sharded with an index), and stand-ins
for the vision tower and MTP head that a text forward must ignore.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .config import Qwen35Config, text_config
from .weights import expected_shapes

_PREFIX = {"multimodal": "model.language_model.", "text": "model.", "mlx": "language_model.model."}
_HEAD = {"multimodal": "lm_head.weight", "text": "lm_head.weight", "mlx": "language_model.lm_head.weight"}


def demo_text_config() -> dict[str, Any]:
    """A small Qwen3.5 with the real vocabulary (so real token ids pass) and every structural part:
    3 GDN layers with value heads = 2 x key heads, one gated full-attention layer, tied head.
    Attention is kept narrow so CPU replays of 100k-token sessions stay quick."""
    return text_config(
        hidden_size=64, num_hidden_layers=4, intermediate_size=128, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=True,
    )


def random_tensors(cfg: Qwen35Config, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                   device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Canonical name -> tensor, scaled so activations stay O(1) through many layers.

    ``device`` draws them there (the benchmarks draw the large shapes on the GPU rather than on
    the CPU); each device has its own random stream, so the same seed gives other values there."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, torch.Tensor] = {}

    def randn(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device)

    def uniform(shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
        return torch.empty(shape, device=device).uniform_(lo, hi, generator=gen)

    for name, shape in expected_shapes(cfg).items():
        if name.endswith("A_log"):
            t = uniform(shape, 1.0, 16.0).log()
        elif name.endswith("dt_bias"):
            t = uniform(shape, -1.0, 1.0)
        elif name.endswith("linear_attn.norm.weight"):
            t = 1.0 + 0.1 * randn(shape)  # plain-weight norm: around 1
        elif name.endswith("norm.weight"):
            t = 0.1 * randn(shape)  # (1 + w) norms: around 0
        elif name.endswith("conv1d.weight"):
            t = randn(shape) * 0.5
        elif name in ("embed_tokens.weight", "lm_head.weight"):
            t = randn(shape)
        else:
            t = randn(shape) / math.sqrt(shape[-1])
        out[name] = t.to(dtype)
    return out


def write_checkpoint(
    folder: str | Path,
    text_config: dict[str, Any],
    tensors: dict[str, torch.Tensor] | None = None,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    layout: str = "multimodal",
    shards: int = 1,
    extras: bool = True,
) -> Path:
    """Write a checkpoint folder; returns its path. ``tensors`` default to ``random_tensors``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = Qwen35Config.from_dict(text_config)
    if tensors is None:
        tensors = random_tensors(cfg, seed, dtype)
    prefix = _PREFIX[layout]
    keyed = {(_HEAD[layout] if name == "lm_head.weight" else prefix + name): t.contiguous()
             for name, t in tensors.items()}
    if extras:  # parts of the release the text model must skip
        keyed["mtp.fc.weight"] = torch.zeros(4, 4, dtype=dtype)
        if layout == "multimodal":
            keyed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3, dtype=dtype)
    if layout == "multimodal":
        config: dict[str, Any] = {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": text_config,
            "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 16,
                              "num_heads": 2, "intermediate_size": 16, "out_hidden_size": 16},
            "tie_word_embeddings": text_config.get("tie_word_embeddings", False),
            "image_token_id": 248056,
            "video_token_id": 248057,
            "vision_start_token_id": 248053,
            "vision_end_token_id": 248054,
        }
    else:
        config = {**text_config, "architectures": ["Qwen3_5ForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config, indent=2))

    names = sorted(keyed)
    if shards <= 1:
        save_file(keyed, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    per = -(-len(names) // shards)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: keyed[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in keyed.values())},
             "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return folder
