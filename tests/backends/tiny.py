"""Tiny Qwen3.5 shapes for tests: every structural variant the real releases have, at toy sizes."""

from __future__ import annotations

from typing import Any

from shadow.backends.qwen35.config import text_config


def tiny(*, layers: int = 4, k_heads: int = 2, v_heads: int = 2, tie: bool = True, vocab: int = 512,
         hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> dict[str, Any]:
    return text_config(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=2 * hidden,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=32,
        linear_num_key_heads=k_heads, linear_num_value_heads=v_heads,
        linear_key_head_dim=16, linear_value_head_dim=16, vocab_size=vocab, tie_word_embeddings=tie,
    )


# The four shapes the model issue names: equal heads, value heads = 2 x key heads, tied and untied,
# a layer count that is not a multiple of 4.
CONFIGS = {
    "equal-heads-tied": tiny(layers=4, k_heads=2, v_heads=2, tie=True),
    "gva-untied": tiny(layers=4, k_heads=2, v_heads=4, tie=False),
    "six-layers-tied": tiny(layers=6, k_heads=2, v_heads=4, tie=True),
    "seven-layers-untied": tiny(layers=7, k_heads=4, v_heads=4, tie=False, heads=8, kv_heads=2),
}
