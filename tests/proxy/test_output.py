"""The output ids the proxy feeds, from streamed deltas: the same ids ``render_turns`` reads off the
chat template for real sessions (reasoning, content, tool calls), whether the upstream streams text
or its token ids; and most of them are fed round by round, not all at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shadow.adapters.transcripts import load_transcript, render_turns
from shadow.proxy.output import OutputIds
from shadow.proxy.relay import parse_event, take_events
from shadow.proxy.turn import choices
from tests.proxy.upstream import sse_chunks

SESSIONS = {"reasoning": ("mini-swe-agent-gemini3-swebench/django__django-12741.traj.json", 0),
            "tool-calls": ("openhands-examples/output.jsonl", 1)}
TURNS = 5


def _replay(out: OutputIds, chunks: list[bytes]) -> tuple[list[int], int]:
    fed: list[int] = []
    buffer = bytearray()
    for c in chunks:
        buffer.extend(c)
        for event in take_events(buffer):
            obj = parse_event(event)
            for choice in choices(obj, "delta") if obj is not None else []:
                out.add_choice(choice, "delta")
                fed += out.round()
    in_rounds = len(fed)
    return fed + out.final(), in_rounds


@pytest.mark.parametrize("case", sorted(SESSIONS))
def test_streamed_text_gives_the_templates_output_ids(shared_data: Path, case: str) -> None:
    path, index = SESSIONS[case]
    transcript = load_transcript(shared_data / "sessions" / "raw" / path)[index]
    turns = render_turns(transcript, indices=range(TURNS))
    for k, turn in enumerate(turns):
        out = OutputIds(None)
        fed, in_rounds = _replay(out, sse_chunks(transcript.requests[k].response))
        assert fed == turn.output_ids, f"{case} turn {k}"
        assert not out.parted
        # text is fed as it streams, a tool call waits for its whole JSON arguments; a reply with no
        # reasoning field, while the template opens <think>, may be thought that an engine without a
        # reasoning parser streams as content: nothing of it is fed before the end (it is then)
        held = not out.reasoning and "</think>" not in "".join(out.content)
        if held:
            assert in_rounds == 0, f"{case} turn {k}"
        elif case == "reasoning":
            assert in_rounds > len(turn.output_ids) // 2, f"{case} turn {k}"
        else:
            assert in_rounds > 0, f"{case} turn {k}"


@pytest.mark.parametrize("case", sorted(SESSIONS))
def test_without_thinking_content_is_fed_as_it_streams(shared_data: Path, case: str) -> None:
    """``enable_thinking: false``: the generation prompt closes the thought, so content alone is the
    answer and is fed round by round."""
    path, index = SESSIONS[case]
    transcript = load_transcript(shared_data / "sessions" / "raw" / path)[index]
    turns = render_turns(transcript, indices=range(TURNS), enable_thinking=False)
    for k, turn in enumerate(turns):
        out = OutputIds(False)
        fed, in_rounds = _replay(out, sse_chunks(transcript.requests[k].response))
        assert fed == turn.output_ids and not out.parted, f"{case} turn {k}"
        if transcript.requests[k].response.get("content"):
            assert in_rounds > 0, f"{case} turn {k}"


def test_upstream_token_ids_are_fed_as_they_come(shared_data: Path) -> None:
    path, index = SESSIONS["reasoning"]
    transcript = load_transcript(shared_data / "sessions" / "raw" / path)[index]
    want = render_turns(transcript, indices=range(1))[0].output_ids
    chunks = [b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x"},
                                                   "token_ids": want[i:i + 3]}]}).encode() + b"\n\n"
              for i in range(0, len(want), 3)] + [b"data: [DONE]\n\n"]
    out = OutputIds(None)
    fed, in_rounds = _replay(out, chunks)
    assert fed == want and in_rounds == len(want)


@pytest.mark.parametrize("cut", ["reasoning_content", "content"])
def test_a_reply_cut_by_max_tokens_is_fed_as_the_text_the_engine_returned(cut: str) -> None:
    """No ``</think>`` or ``<|im_end|>`` the engine never generated: the ids end where its text ends."""
    out = OutputIds(None)
    fed: list[int] = []
    parts = {"reasoning_content": "Let me look at the failing test first, then"}
    if cut == "content":
        parts = {"reasoning_content": "Short thought.", "content": "The fix is to change the"}
    for k, text in parts.items():
        for i in range(0, len(text), 8):
            out.add_choice({"index": 0, "delta": {k: text[i:i + 8]}}, "delta")
            fed += out.round()
    fed += out.final(cut=True)
    text = out.tokens.decode(fed)
    want = parts["reasoning_content"] if cut == "reasoning_content" else \
        "Short thought.\n</think>\n\nThe fix is to change the"
    assert text == want
    assert "<|im_end|>" not in text


@pytest.mark.parametrize("thinking", [None, True])
def test_thought_streamed_as_content_and_cut_is_fed_as_its_text_with_no_closing_tag(thinking: bool | None) -> None:
    """llama.cpp's way (no reasoning parser): the thought comes as ``content``; cut by ``max_tokens``
    inside it, the ids fed are the text's, with no ``</think>`` or ``<|im_end|>`` before or after."""
    out = OutputIds(thinking)
    text = "The user wants the flush to take no alias. Let me look at the"
    fed: list[int] = []
    for i in range(0, len(text), 7):
        out.add_choice({"index": 0, "delta": {"content": text[i:i + 7]}}, "delta")
        fed += out.round()
    assert fed == []  # nothing while it may still be thought
    fed += out.final(cut=True)
    assert fed == out.tokens.encode(text) and out.tokens.decode(fed) == text
    closing = set(out.tokens.encode("</think>")) | set(out.tokens.encode("<|im_end|>"))
    assert not closing & set(fed)


def test_thought_streamed_as_content_is_fed_once_it_closes() -> None:
    """Once the engine's own ``</think>`` arrives the template renders what it generated: fed round by
    round from there, and the whole reply as ``render_turns`` would read it."""
    out = OutputIds(None)
    text = "Thinking about it.\n</think>\n\nThe answer is to drop the argument from every call site."
    fed: list[int] = []
    for i in range(0, len(text), 6):
        out.add_choice({"index": 0, "delta": {"content": text[i:i + 6]}}, "delta")
        fed += out.round()
    in_rounds = len(fed)
    fed += out.final()
    assert in_rounds > 0 and not out.parted
    assert out.tokens.decode(fed) == text + "<|im_end|>"
