"""The ``Prompter`` over the real Qwen3.5 vocabulary and chat template."""

from __future__ import annotations

from functools import cached_property

from .chat import render_ids
from .tokens import ENDOFTEXT, IM_END, get_tokens


class QwenPrompter:
    def question_ids(self, text: str) -> list[int]:
        # One user turn, thinking off: the next token after the rendered prompt is the answer.
        return render_ids(
            [{"role": "user", "content": text}], add_generation_prompt=True, enable_thinking=False
        )

    def single_token(self, label: str) -> int | None:
        ids = get_tokens().encode(label)
        return ids[0] if len(ids) == 1 else None

    @cached_property
    def stop_ids(self) -> set[int]:
        return {IM_END, ENDOFTEXT}
