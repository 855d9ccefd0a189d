"""shadow.adapters.chat must render exactly what transformers renders from the same template."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import jinja2
import pytest

from shadow.adapters.chat import parse_arguments, render, render_ids, template_source
from shadow.adapters.tokens import get_tokens

TEMPLATE_SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command. Output <= 30k chars & 'quoted' stays as is; 日本語 too.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Edit a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "ops": {"type": "array"}},
            },
        },
    },
]


def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call, with arguments as the JSON string the wire carries."""
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
USER = {"role": "user", "content": "Fix the failing test in tests/test_x.py, please."}
ARGS1 = {"command": "pytest -q tests/test_x.py", "timeout": 60}
ARGS2 = {
    "path": "src/x.py",
    "ops": [{"line": 3, "text": "return a < b"}],
    "meta": {"why": "off-by-one", "n": None},
}

CASES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any]]] = {
    "plain": ([SYSTEM, USER], None, {}),
    "no_system_multi_turn": (
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>\nsay hi back\n</think>\n\nHello!"},
            {"role": "user", "content": [{"type": "text", "text": "and "}, {"type": "text", "text": "now?"}]},
        ],
        None,
        {},
    ),
    "tools_one_call": (
        [
            SYSTEM,
            USER,
            {
                "role": "assistant",
                "content": "Let me run it.",
                "reasoning_content": "Run the test first.",
                "tool_calls": [call("c1", "run", ARGS1)],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "1 failed"},
        ],
        TOOLS,
        {},
    ),
    "parallel_calls_multi_responses": (
        [
            SYSTEM,
            USER,
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Two things at once.",
                "tool_calls": [call("c1", "run", ARGS1), call("c2", "edit", ARGS2)],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "1 failed"},
            {"role": "tool", "tool_call_id": "c2", "content": "edited"},
            {"role": "assistant", "content": "", "tool_calls": [call("c3", "run", {"command": "pytest -q"})]},
            {"role": "tool", "tool_call_id": "c3", "content": "ok"},
        ],
        TOOLS,
        {},
    ),
    "reasoning_before_and_after_last_query": (
        [
            SYSTEM,
            USER,
            {"role": "assistant", "content": "Done.", "reasoning_content": "OLD-REASONING"},
            {"role": "user", "content": "Now also run the linter."},
            {
                "role": "assistant",
                "content": "Running it.",
                "reasoning_content": "NEW-REASONING",
                "tool_calls": [call("c9", "run", {"command": "ruff check ."})],
            },
            {"role": "tool", "tool_call_id": "c9", "content": "All checks passed!"},
        ],
        TOOLS,
        {},
    ),
    "reasoning_aliases_and_no_generation_prompt": (
        [
            USER,
            {"role": "assistant", "content": "A", "thinking": "via thinking"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "B", "reasoning": "via reasoning"},
        ],
        None,
        {"add_generation_prompt": False},
    ),
    "enable_thinking_false": ([SYSTEM, USER], TOOLS, {"enable_thinking": False}),
    "enable_thinking_true": ([SYSTEM, USER], TOOLS, {"enable_thinking": True}),
}


def transformers_render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kw: Any) -> str:
    tf = pytest.importorskip("transformers.utils.chat_template_utils")
    msgs = copy.deepcopy(messages)
    # What transformers users do: tool-call arguments as dicts (the template iterates them).
    for m in msgs:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    normalized = tf._normalize_chat_messages(msgs)  # apply_chat_template's own normalisation
    add = kw.pop("add_generation_prompt", True)
    rendered, _ = tf.render_jinja_template(
        conversations=[normalized],
        tools=tools,
        chat_template=template_source(),
        add_generation_prompt=add,
        **kw,
    )
    return str(rendered[0])


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(case: str) -> None:
    messages, tools, kw = CASES[case]
    before = copy.deepcopy(messages)
    ours = render(messages, tools, **kw)
    assert ours == transformers_render(messages, tools, **kw)
    assert messages == before, "render must not mutate its input"


def test_template_is_the_qwen35_one() -> None:
    src = template_source()
    assert hashlib.sha256(src.encode()).hexdigest() == TEMPLATE_SHA256


def test_template_is_the_shared_copy(full_data: Path) -> None:
    shared = full_data / "templates" / "qwen3_5_chat_template.jinja"
    assert shared.read_text(encoding="utf-8") == template_source()


def test_reasoning_drop() -> None:
    """Reasoning survives tool turns but disappears once a real user message follows."""
    reply = {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "R1",
        "tool_calls": [call("c1", "run", ARGS1)],
    }
    base: list[dict[str, Any]] = [
        SYSTEM,
        USER,
        reply,
        {"role": "tool", "tool_call_id": "c1", "content": "1 failed"},
    ]
    during = render(base, TOOLS)
    assert "<think>\nR1\n</think>\n\nLet me look." in during
    after = render(
        [*base, {"role": "assistant", "content": "Fixed."}, {"role": "user", "content": "thanks"}], TOOLS
    )
    assert "R1" not in after and "<|im_start|>assistant\nLet me look." in after
    # The rendering before the drop is not a prefix of the rendering after: where they part.
    cut = during.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    assert during[:cut] == after[:cut] and during[cut:].startswith("<think>")


def test_generation_prompts() -> None:
    assert render([USER]).endswith("<|im_start|>assistant\n<think>\n")
    assert render([USER], enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tool_call_arguments() -> None:
    text = render(
        [USER, {"role": "assistant", "content": "", "tool_calls": [call("c", "edit", ARGS2)]}], TOOLS
    )
    assert "<parameter=ops>\n" + json.dumps(ARGS2["ops"]) + "\n</parameter>" in text
    assert "<parameter=path>\nsrc/x.py\n</parameter>" in text
    assert parse_arguments("") == {} and parse_arguments({"a": 1}) == {"a": 1}
    with pytest.raises(ValueError):
        parse_arguments("{not json")
    with pytest.raises(ValueError):
        parse_arguments("[1, 2]")


def test_template_errors() -> None:
    with pytest.raises(jinja2.TemplateError, match="No user query"):
        render([SYSTEM])
    with pytest.raises(jinja2.TemplateError, match="System message must be at the beginning"):
        render([USER, SYSTEM])


def test_render_ids() -> None:
    ids = render_ids([SYSTEM, USER], TOOLS)
    assert ids == get_tokens().encode(render([SYSTEM, USER], TOOLS))
    assert ids[0] == 248045 and ids[-2:] == [248068, 198]
