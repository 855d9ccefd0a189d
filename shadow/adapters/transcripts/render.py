"""Requests -> the token streams an engine serving Qwen3.5 would see: ``Turn``s.

For each request the prompt is ``render(messages, tools, add_generation_prompt=True)`` and the
output is what the model generated after the generation prompt. It is read off the chat template
rather than assembled by hand: render ``messages + [response]`` without a generation prompt, take
the text after the prompt text, and stop at (including) the ``<|im_end|>`` that closes the reply,
dropping the newline the template writes after it. The model generates that ``<|im_end|>`` and
nothing after it; the newline shows up as the first token of the next prompt's continuation.

If the full render does not start with the prompt text, the template treated the appended
response differently from a generation (it cannot happen with the shipped template when the
prompt ends with a user or tool turn, but an unusual history, such as a prompt ending in an
assistant turn with ``enable_thinking=False``, could do it). Then the output is the response
rendered alone in assistant form, after a placeholder user message, and ``Turn.fallback`` is set.

Prompt and output are tokenized separately, as an engine does. Where the text of prompt k+1
starts with prompt k + output k, the ids usually extend too, but not always: BPE may merge
across the seam (``<think>\\n`` + ``\\n</think>`` when the reasoning is empty gives ``\\n\\n``
as one id in the next prompt). ``shadow.core.session.first_difference`` measures what an engine could reuse.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from shadow.adapters.chat import render
from shadow.adapters.tokens import Tokens, get_tokens
from shadow.adapters.transcripts.model import Request, Transcript
from shadow.core.session import first_difference

IM_END_TEXT = "<|im_end|>"
TURNS_FORMAT = "shadow-turns/1"
_PLACEHOLDER_USER = {"role": "user", "content": "."}
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


@dataclass
class Turn:
    prompt_ids: list[int]
    output_ids: list[int]
    start_s: float | None = None
    end_s: float | None = None
    fallback: bool = False
    """The output came from rendering the response alone (see the module docstring)."""


def render_texts(request: Request, enable_thinking: bool | None = None) -> tuple[str, str, bool]:
    """``(prompt_text, output_text, fallback)`` of one request.

    With ``enable_thinking=False`` the response's reasoning is left out: a model prompted with the
    closed ``<think>\n\n</think>`` block generates none.
    """
    response = request.response
    if enable_thinking is False:
        response = {k: v for k, v in response.items() if k not in _REASONING_KEYS}
    prompt = render(
        request.messages, request.tools, add_generation_prompt=True, enable_thinking=enable_thinking
    )
    full = render(
        [*request.messages, response],
        request.tools,
        add_generation_prompt=False,
        enable_thinking=enable_thinking,
    )
    fallback = not full.startswith(prompt)
    if fallback:
        head = render([_PLACEHOLDER_USER], None, add_generation_prompt=True, enable_thinking=enable_thinking)
        alone = render(
            [_PLACEHOLDER_USER, response], None, add_generation_prompt=False, enable_thinking=enable_thinking
        )
        if not alone.startswith(head):
            raise ValueError("the chat template renders a lone assistant reply unlike a generation")
        tail = alone[len(head) :]
    else:
        tail = full[len(prompt) :]
    end = tail.rfind(IM_END_TEXT)
    if end < 0:
        raise ValueError("rendered reply has no <|im_end|>")
    return prompt, tail[: end + len(IM_END_TEXT)], fallback


def render_turn(request: Request, tokens: Tokens | None = None, enable_thinking: bool | None = None) -> Turn:
    tk = tokens or get_tokens()
    prompt, output, fallback = render_texts(request, enable_thinking)
    return Turn(tk.encode(prompt), tk.encode(output), request.start_s, request.end_s, fallback)


def render_turns(
    transcript: Transcript,
    tokens: Tokens | None = None,
    enable_thinking: bool | None = None,
    indices: Iterable[int] | None = None,
) -> list[Turn]:
    """One ``Turn`` per request (or per request in ``indices``), in order."""
    reqs = transcript.requests
    picked = range(len(reqs)) if indices is None else indices
    return [render_turn(reqs[i], tokens, enable_thinking) for i in picked]


def turns_to_json(turns: Sequence[Turn]) -> str:
    """A compact JSON document for caching rendered turns.

    Each prompt is stored as the length it shares with the previous prompt + output (``reuse``)
    and the ids after that (``tail``), so a long session costs about its new tokens, and
    ``reuse`` says at a glance where a session rolled back.
    """
    rows = []
    prev: list[int] = []
    for t in turns:
        reuse = first_difference(prev, t.prompt_ids)
        row = asdict(t)
        del row["prompt_ids"]
        row["reuse"] = reuse
        row["tail"] = t.prompt_ids[reuse:]
        rows.append(row)
        prev = t.prompt_ids + t.output_ids
    return json.dumps({"format": TURNS_FORMAT, "turns": rows}, separators=(",", ":"))


def turns_from_json(text: str) -> list[Turn]:
    d = json.loads(text)
    if d.get("format") != TURNS_FORMAT:
        raise ValueError(f"not a {TURNS_FORMAT} document")
    out: list[Turn] = []
    prev: list[int] = []
    for row in d["turns"]:
        prompt = prev[: row["reuse"]] + row["tail"]
        t = Turn(prompt, row["output_ids"], row["start_s"], row["end_s"], row.get("fallback", False))
        out.append(t)
        prev = t.prompt_ids + t.output_ids
    return out


def save_turns(turns: Sequence[Turn], path: str | os.PathLike[str]) -> None:
    Path(path).write_text(turns_to_json(turns), encoding="utf-8")


def load_turns(path: str | os.PathLike[str]) -> list[Turn]:
    return turns_from_json(Path(path).read_text(encoding="utf-8"))
