"""Converters and rendered turns on the real sessions (the full set in ../shared/data, or tests/data's subset)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from shadow.adapters.chat import render
from shadow.adapters.tokens import IM_END, IM_START, THINK, THINK_END, Tokens
from shadow.adapters.transcripts import (
    Request,
    Transcript,
    Turn,
    discover,
    load_transcript,
    render_texts,
    render_turns,
    transcript_from_json,
    transcript_to_json,
    turns_from_json,
    turns_to_json,
)
from shadow.adapters.transcripts import claude_code_standin as standin
from shadow.adapters.transcripts.formats import FORMATS, format_of
from shadow.core.session import first_difference
from tests.conftest import TEST_DATA

from .conftest import nfc

CC_SHORT = "claude-code-marot-spotter/subagent.jsonl"
CC_STREAMED = "claude-code-marot-spotter/tool_heavy.jsonl"
CC_COMPACTED = "claude-code-marot-spotter/8463c716-a2ea-4c14-9efa-87158ebd9f20.jsonl"
CC_MANY_USERS = "claude-code-moredip-session-share/0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl"
MINI = "mini-swe-agent-gemini3-swebench/django__django-16527.traj.json"
SDK = "openhands-sdk-llm-logs/llm-logs"
SDK_TEXT = "openhands-sdk-llm-logs/nonfncall-llm-logs"
SWE_FC = "swe-agent-test-trajectories/6e44b9__sweagenttestrepo-1c2844.traj"

pytestmark = pytest.mark.usefixtures("raw")
Load = Callable[[str], Transcript]  # the load_one fixture
TurnsOf = Callable[[str], list[Turn]]  # the turns_of fixture


def check_turns(t: Transcript, turns: Sequence[Turn], tokens: Tokens, history_thinks: bool = True) -> None:
    """Ids decode to the rendered text, with the ChatML and thinking specials as single ids."""
    assert turns and len(turns) == len(t.requests)
    for i in sorted({0, len(turns) // 2, len(turns) - 1}):
        prompt, output, fallback = render_texts(t.requests[i])
        assert not fallback
        assert tokens.decode(turns[i].prompt_ids) == nfc(prompt)
        assert tokens.decode(turns[i].output_ids) == nfc(output)
    for tu in turns:
        assert tu.prompt_ids[0] == IM_START and tu.prompt_ids[-2:] == [THINK, 198]
        assert tu.output_ids[-1] == IM_END and IM_END in tu.prompt_ids and THINK_END in tu.output_ids
        assert not tu.fallback
    if history_thinks and len(turns) > 1:  # some earlier reply still shows its <think> block
        assert any(THINK in tu.prompt_ids[:-2] for tu in turns[1:])


def times(r: Request) -> tuple[float, float]:
    assert r.start_s is not None and r.end_s is not None
    return r.start_s, r.end_s


def user_query_between(prev: Request, cur: Request) -> bool:
    """Whether a message the template counts as a new user query arrived since ``prev``."""
    new = cur.messages[len(prev.messages) + 1 :]
    for m in new:
        if m["role"] == "user":
            text = render([m], add_generation_prompt=False)[len("<|im_start|>user\n") : -len("<|im_end|>\n")]
            if not (text.startswith("<tool_response>") and text.endswith("</tool_response>")):
                return True
    return False


def extends(t: Transcript, k: int) -> tuple[bool, int, str, str]:
    """(text of prompt k extends prompt k-1 + output k-1, common prefix, both texts)."""
    p0, o0, _ = render_texts(t.requests[k - 1])
    p1, _, _ = render_texts(t.requests[k])
    return p1.startswith(p0 + o0), first_difference(p0 + o0, p1), p0 + o0, p1


# -- discovery -------------------------------------------------------------------------------------


def test_discover_finds_every_session(raw: Path) -> None:
    sources = discover(raw)
    sessions = [t for s in sources for t in load_transcript(s)]
    formats = {t.source_format for t in sessions}
    assert formats == {
        "claude-code",
        "mini-swe-agent",
        "openhands-output",
        "openhands-sdk-llm-logs",
        "swe-agent",
    }
    # ../shared/data/README.md: 38 sessions from 6 sources, 12 + 6 sub-agent files less the 5 compaction
    # ones; tests/data/README.md: its subset holds 14 sessions and 1 sub-agent file beside its compaction
    full = raw.parents[1] != TEST_DATA
    assert len(sessions) == (38 if full else 14)
    assert all(t.requests and t.license_path and Path(t.license_path).is_file() for t in sessions)
    assert len({t.name for t in sessions}) == len(sessions)
    subagents = discover(raw, include_subagents=True)
    assert len(subagents) - len(sources) == (13 if full else 1)
    # one registry: each source discovered is loaded by the format its name and content say, and
    # that format names the sessions it loads
    for source in subagents:
        fmt = format_of(source)
        assert fmt is not None and fmt.discovered, source
        assert {t.source_format for t in fmt.load(source)} == {fmt.name}, source


def test_a_source_of_no_known_format_is_refused_by_name(tmp_path: Path) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"neither": "claude code nor openhands"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="named as openhands-output or claude-code, but its content is none"):
        load_transcript(odd)
    other = tmp_path / "notes.txt"
    other.write_text("hello", encoding="utf-8")
    with pytest.raises(ValueError, match=r"unrecognised session format \(known: openhands-output \.jsonl"):
        load_transcript(other)
    assert discover(tmp_path) == [odd]  # listed by name; loading it says what is wrong
    assert {f.name for f in FORMATS if f.discovered} == {
        "claude-code", "mini-swe-agent", "openhands-output", "openhands-sdk-llm-logs", "swe-agent"}


# -- Claude Code -----------------------------------------------------------------------------------


def test_claude_code_turns(tokens: Tokens, load_one: Load, turns_of: TurnsOf) -> None:
    t = load_one(CC_SHORT)
    check_turns(t, turns_of(CC_SHORT), tokens)
    assert all(r.start_s is not None and r.end_s is not None and r.start_s <= r.end_s for r in t.requests)
    # The stand-in system prompt and tools: about 20k tokens before the first user message.
    head = render([t.requests[0].messages[0], {"role": "user", "content": "."}], t.requests[0].tools)
    assert 18_000 < len(tokens.encode(head)) < 26_000
    assert "Working directory: /home/marco/projects/spotter\n" in t.requests[0].messages[0]["content"]
    called = {c["function"]["name"] for r in t.requests for c in r.response.get("tool_calls", [])}
    assert called <= {s["function"]["name"] for s in standin.tools()}


def test_claude_code_merges_streamed_blocks(load_one: Load) -> None:
    """Blocks of one response are merged, wherever the tool results were logged between them."""
    t = load_one(CC_STREAMED)
    last = t.requests[3]
    # Its Read result was logged before its WebFetch block: still one reply with two calls.
    assert [c["function"]["name"] for c in last.response["tool_calls"]] == ["Read", "WebFetch"]
    # The previous reply's two parallel results finished out of order (Glob first); the prompt has
    # them in call order, and the off-chain one (Glob's) is not lost.
    i = next(i for i, m in enumerate(last.messages) if len(m.get("tool_calls", [])) == 2)
    calls = last.messages[i]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["WebSearch", "Glob"]
    assert [m.get("tool_call_id") for m in last.messages[i + 1 : i + 3]] == [c["id"] for c in calls]
    assert last.messages[i]["reasoning_content"] and last.messages[i - 1]["role"] == "user"


def test_claude_code_compaction_restarts(tokens: Tokens, load_one: Load) -> None:
    t = load_one(CC_COMPACTED)
    k = next(
        k
        for k, r in enumerate(t.requests)
        if "create a detailed summary of the conversation" in str(r.messages[-1]["content"])
    )
    pre, summarise, post = t.requests[k - 1], t.requests[k], t.requests[k + 1]
    # The summarising request extends the conversation (same message objects, plus the instruction).
    assert summarise.messages[: len(pre.messages)] == pre.messages
    assert summarise.messages[len(pre.messages)] == pre.response
    # After it, the prompt restarts as system + summary.
    assert [m["role"] for m in post.messages[:3]] == ["system", "user", "assistant"] or len(
        post.messages
    ) == 2
    assert str(post.messages[1]["content"]).startswith("This session is being continued")
    turns = render_turns(t, tokens, indices=[k - 1, k, k + 1])
    assert len(turns[2].prompt_ids) < len(turns[1].prompt_ids) // 3
    # Where the restarted prompt parts from the summarising request: right after the system turn.
    system_turn = render([post.messages[0], {"role": "user", "content": "."}], post.tools).rsplit(
        "<|im_start|>user", 1
    )[0]
    n = first_difference(turns[1].prompt_ids + turns[1].output_ids, turns[2].prompt_ids)
    system_ids = len(tokens.encode(system_turn))
    assert system_ids <= n <= system_ids + 8
    assert turns[1].prompt_ids[n - 1] == turns[2].prompt_ids[n - 1]


def test_claude_code_reasoning_drop(load_one: Load) -> None:
    """A text prompt extends the previous prompt + output exactly when no new user query came."""
    t = load_one(CC_MANY_USERS)
    dropped = []
    for k in range(1, len(t.requests)):
        ok, n, before, after = extends(t, k)
        assert ok == (not user_query_between(t.requests[k - 1], t.requests[k])), k
        if not ok:
            # The first assistant turn after the old last query loses its <think> block.
            assert before[:n].endswith("<|im_start|>assistant\n") and before[n:].startswith("<think>\n")
            assert not after[n:].startswith("<think>")
            dropped.append((k, len(before) - n))
    # request k: how many characters of the previous prompt + output had to be thrown away
    assert [k for k, _ in dropped] == [2, 3, 6, 7, 8, 9]
    assert min(c for _, c in dropped) > 8


# -- OpenHands -------------------------------------------------------------------------------------


def test_openhands_output(raw: Path, tokens: Tokens) -> None:
    sessions = load_transcript(raw / "openhands-examples/output.jsonl")
    assert [len(s.requests) for s in sessions] == [23, 33, 49]
    t = sessions[1]  # ponyc-4593: one malformed call answered by an error observation
    first = t.requests[0]
    assert first.messages[0]["role"] == "system" and first.messages[0]["content"].startswith(
        "You are OpenHands"
    )
    assert [x["function"]["name"] for x in first.tools or []] == [
        "execute_bash",
        "think",
        "finish",
        "str_replace_editor",
    ]
    assert any("1 response(s)" in n for n in t.notes)
    # Event times are naive UTC+8; corrected, each start lines up with the provider's 'created' stamp.
    line = (raw / "openhands-examples/output.jsonl").read_text().splitlines()[1]
    created = [
        e["tool_call_metadata"]["model_response"]["created"]
        for e in json.loads(line)["history"]
        if e.get("action") and e.get("tool_call_metadata")
    ]
    for r, c in zip(t.requests, created, strict=True):
        start, end = times(r)
        assert 0 < end - start < 30 and abs(start - c) < 3
    turns = render_turns(t, tokens)
    check_turns(t, turns, tokens)
    # The error observation is a user message: the one text divergence of this session.
    diverged = [k for k in range(1, len(turns)) if not extends(t, k)[0]]
    assert len(diverged) == 1
    k = diverged[0]
    assert t.requests[k].messages[-1]["content"].endswith("[Error occurred in processing last action]")


def test_sdk_logs_extend(tokens: Tokens, load_one: Load, turns_of: TurnsOf) -> None:
    """Each logged prompt extends the previous prompt + output (text); on ids, up to the seam."""
    t = load_one(SDK)
    turns = turns_of(SDK)
    check_turns(t, turns, tokens)
    for k in range(1, len(turns)):
        assert t.requests[k].messages[: len(t.requests[k - 1].messages)] == t.requests[k - 1].messages
        assert extends(t, k)[0], k
        # Ids: the replies have no reasoning, so prompt k-1 ends "<think>\n" and output k-1 starts
        # "\n</think>"; rendered together in prompt k that is one "\n\n" id: a one-id rollback.
        prev = turns[k - 1]
        n = first_difference(prev.prompt_ids + prev.output_ids, turns[k].prompt_ids)
        assert n == len(prev.prompt_ids) - 1
        assert prev.prompt_ids[-1] == 198 and prev.output_ids[0] == 198 and turns[k].prompt_ids[n] == 271
        tail = prev.prompt_ids[n + 1 :] + prev.output_ids[1:]
        assert turns[k].prompt_ids[n + 1 : n + 1 + len(tail)] == tail
        assert 0 <= times(t.requests[k])[0] - times(t.requests[k - 1])[1] < 2


def test_sdk_text_tool_logs(load_one: Load) -> None:
    t = load_one(SDK_TEXT)
    assert all(r.tools is None for r in t.requests)
    assert all(r.response["content"].rstrip().endswith("</function>") for r in t.requests)
    for k in range(1, len(t.requests)):
        # Stored replies are what the next request carries, so only the template's drop differs.
        assert t.requests[k].messages[len(t.requests[k - 1].messages)] == t.requests[k - 1].response
        assert user_query_between(t.requests[k - 1], t.requests[k])


# -- mini-swe-agent and SWE-agent ------------------------------------------------------------------


def test_mini_swe_agent(tokens: Tokens, load_one: Load, turns_of: TurnsOf) -> None:
    t = load_one(MINI)
    turns = turns_of(MINI)
    check_turns(t, turns, tokens, history_thinks=False)
    assert all(r.tools is None and r.end_s is None and r.start_s is not None for r in t.requests)
    starts = [r.start_s or 0.0 for r in t.requests]
    assert starts == sorted(starts)
    # The first reply carries Gemini's reasoning summary between <think> and </think>.
    out0 = turns[0].output_ids
    assert out0.index(THINK_END) > 10
    # Observations are user messages: every turn drops the previous reply's <think> block.
    for k in range(1, len(turns)):
        ok, n, before, _ = extends(t, k)
        assert not ok and before[n:].startswith("<think>\n")
        assert len(render_texts(t.requests[k - 1])[0]) - n == len("<think>\n")


def test_swe_agent_function_calling(tokens: Tokens, load_one: Load) -> None:
    t = load_one(SWE_FC)
    assert len(t.requests) == 4 and all(r.start_s is None for r in t.requests)
    assert all(r.response.get("tool_calls") for r in t.requests)
    check_turns(t, render_turns(t, tokens), tokens)


# -- serialisation ---------------------------------------------------------------------------------


def test_json_round_trips(tmp_path: Path, load_one: Load, turns_of: TurnsOf) -> None:
    t = load_one(CC_SHORT)
    d = transcript_to_json(t)
    assert len(d["tool_pool"]) == 1 and len(d["message_pool"]) < sum(len(r.messages) for r in t.requests)
    back = transcript_from_json(d)
    assert back.requests == t.requests and back.name == t.name
    turns = turns_of(SDK)
    path = tmp_path / "turns.json"
    path.write_text(turns_to_json(turns))
    assert turns_from_json(path.read_text()) == turns
