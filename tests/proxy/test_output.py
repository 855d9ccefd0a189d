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
        assert not out.parted and in_rounds > 0
    # text is fed as it streams; a tool call waits for its whole JSON arguments
    if case == "reasoning":
        assert in_rounds > len(turn.output_ids) // 2


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
