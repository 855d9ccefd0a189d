"""Rendering requests into turns: the output seam, the fallback, shared prefixes, the turns cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shadow.adapters.chat import render
from shadow.adapters.transcripts import (
    Request,
    demo_transcript,
    load_turns,
    render_turns,
    save_turns,
    turns_to_json,
)
from shadow.core.session import first_difference


def test_first_difference_on_ids_and_text() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3, 4]) == 3
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([], [1]) == 0 and first_difference("abcd", "abXd") == 2
    a = list(range(1000))
    assert first_difference(a, [*a[:777], -1, *a[778:]]) == 777


def test_turns_cache_round_trip(tmp_path: Path) -> None:
    turns = render_turns(demo_transcript())
    path = tmp_path / "turns.json"
    save_turns(turns, path)
    assert load_turns(path) == turns
    # Each prompt is stored as what it reuses of the previous prompt + output, plus a tail.
    assert len(turns_to_json(turns)) < len(str([t.prompt_ids for t in turns])) // 2


def test_render_turn_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """If the template rendered the appended reply unlike a generation, the reply is rendered alone."""
    import shadow.adapters.transcripts.render as R

    def quirky(messages: Any, tools: Any = None, **kw: Any) -> str:
        text = render(messages, tools, **kw)
        msgs = list(messages)
        # Pretend the template rewrote the history once a reply is appended.
        return text.replace("hi", "HI") if not kw.get("add_generation_prompt") and len(msgs) > 2 else text

    monkeypatch.setattr(R, "render", quirky)
    req = Request(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hel"},
            {"role": "user", "content": "go"},
        ],
        tools=None,
        response={"role": "assistant", "content": "lo!", "reasoning_content": "r"},
    )
    prompt, output, fallback = R.render_texts(req)
    assert fallback and output == "r\n</think>\n\nlo!<|im_end|>" and prompt.endswith("<think>\n")
    assert R.render_turn(req).fallback
    # Without thinking the reply's reasoning is left out.
    monkeypatch.setattr(R, "render", render)
    prompt, output, fallback = R.render_texts(req, enable_thinking=False)
    assert not fallback and output == "lo!<|im_end|>" and prompt.endswith("<think>\n\n</think>\n\n")
