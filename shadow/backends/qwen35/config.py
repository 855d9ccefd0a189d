"""Qwen3.5 text-model configuration, read from a Hugging Face checkpoint folder.

Accepts the multimodal form the releases ship (``Qwen3_5ForConditionalGeneration`` with the
text model under ``text_config``) and a plain text config (``model_type: qwen3_5_text``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadow.core.errors import CheckpointError

LINEAR = "linear_attention"
FULL = "full_attention"
_LAYER_TYPES = (LINEAR, FULL)
_TEXT_MODEL_TYPES = ("qwen3_5_text",)
_MULTIMODAL_MODEL_TYPES = ("qwen3_5",)


@dataclass(frozen=True, slots=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    layer_types: tuple[str, ...]
    rope_theta: float
    partial_rotary_factor: float
    rms_norm_eps: float
    tie_word_embeddings: bool

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise CheckpointError(
                f"layer_types has {len(self.layer_types)} entries for num_hidden_layers={self.num_hidden_layers}"
            )
        for i, kind in enumerate(self.layer_types):
            if kind not in _LAYER_TYPES:
                raise CheckpointError(f"layer_types[{i}] is {kind!r}; Qwen3.5 knows only {_LAYER_TYPES}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise CheckpointError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise CheckpointError(f"partial_rotary_factor {self.partial_rotary_factor} gives a bad rotary dim")

    # Derived sizes, named as transformers' Qwen3.5 config names them.
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Qwen35Config:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{folder}: no config.json")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not JSON ({e})") from e
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> Qwen35Config:
        model_type = raw.get("model_type")
        if "text_config" in raw or model_type in _MULTIMODAL_MODEL_TYPES:
            if model_type not in _MULTIMODAL_MODEL_TYPES:
                raise CheckpointError(f"{source}: model_type {model_type!r} is not a Qwen3.5 model")
            text = dict(raw.get("text_config") or {})
            # The multimodal class ties on its own top-level flag; fall back to the text block's.
            tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        elif model_type in _TEXT_MODEL_TYPES:
            text = dict(raw)
            tie = raw.get("tie_word_embeddings", False)
        else:
            raise CheckpointError(
                f"{source}: model_type {model_type!r} is not a Qwen3.5 model "
                f"(expected one of {_MULTIMODAL_MODEL_TYPES + _TEXT_MODEL_TYPES})"
            )

        def need(key: str) -> Any:
            if key not in text:
                raise CheckpointError(f"{source}: missing {key!r}")
            return text[key]

        n_layers = int(need("num_hidden_layers"))
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = int(text.get("full_attention_interval", 4))
            layer_types = [LINEAR if (i + 1) % interval else FULL for i in range(n_layers)]
        rope = text.get("rope_parameters") or {}
        theta = rope.get("rope_theta", text.get("rope_theta"))
        if theta is None:
            raise CheckpointError(f"{source}: missing rope_parameters.rope_theta")
        if rope.get("rope_type", "default") != "default":
            raise CheckpointError(f"{source}: rope_type {rope.get('rope_type')!r} is not supported")
        partial = rope.get("partial_rotary_factor", text.get("partial_rotary_factor")) or 0.25
        n_heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        return cls(
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=int(need("num_key_value_heads")),
            head_dim=int(text.get("head_dim") or hidden // n_heads),
            linear_num_key_heads=int(need("linear_num_key_heads")),
            linear_num_value_heads=int(need("linear_num_value_heads")),
            linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
            linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
            layer_types=tuple(str(t) for t in layer_types),
            rope_theta=float(theta),
            partial_rotary_factor=float(partial),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(tie),
        )


def reference_shape(size: str) -> dict[str, Any]:
    """The text_config of a published size (docs/model.md, "Sizes"), for benchmarks and generated checkpoints."""
    shapes = {
        "0.8B": dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=3584, num_attention_heads=8,
                     num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16, tie=True),
        "2B": dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=6144, num_attention_heads=8,
                   num_key_value_heads=2, linear_num_key_heads=16, linear_num_value_heads=16, tie=True),
        "4B": dict(hidden_size=2560, num_hidden_layers=32, intermediate_size=9216, num_attention_heads=16,
                   num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=32, tie=True),
        "9B": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=12288, num_attention_heads=16,
                   num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=32, tie=False),
    }
    if size not in shapes:
        raise ValueError(f"unknown size {size!r}; known: {sorted(shapes)}")
    s = dict(shapes[size])
    tie = bool(s.pop("tie"))
    return text_config(tie_word_embeddings=tie, **s)


def text_config(
    *,
    hidden_size: int,
    num_hidden_layers: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    linear_num_key_heads: int,
    linear_num_value_heads: int,
    head_dim: int = 256,
    linear_key_head_dim: int = 128,
    linear_value_head_dim: int = 128,
    vocab_size: int = 248320,
    tie_word_embeddings: bool = True,
    full_attention_interval: int = 4,
) -> dict[str, Any]:
    """A Qwen3.5 ``text_config`` dict with the releases' fixed fields filled in."""
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "linear_num_key_heads": linear_num_key_heads,
        "linear_num_value_heads": linear_num_value_heads,
        "linear_key_head_dim": linear_key_head_dim,
        "linear_value_head_dim": linear_value_head_dim,
        "linear_conv_kernel_dim": 4,
        "layer_types": [
            LINEAR if (i + 1) % full_attention_interval else FULL for i in range(num_hidden_layers)
        ],
        "full_attention_interval": full_attention_interval,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
        },
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "attn_output_gate": True,
        "max_position_embeddings": 262144,
        "mamba_ssm_dtype": "float32",
        "tie_word_embeddings": tie_word_embeddings,
        "eos_token_id": 248044,
        "dtype": "bfloat16",
    }
