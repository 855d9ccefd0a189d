"""OpenAI-style messages -> the Qwen3.5 prompt text, rendered the way ``transformers`` renders it.

The served model's engine (vLLM, SGLang, transformers) turns a chat request into ids with the
model's Jinja chat template. To follow a session token for token, the shadow must produce the very
same text, so this module mirrors ``transformers.utils.chat_template_utils``:

* an ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks`` and the
  ``loopcontrols`` extension;
* a ``tojson`` filter that is plain ``json.dumps`` with ``ensure_ascii=False`` (Jinja's own
  filter would HTML-escape ``<``, ``>``, ``&`` and ``'``);
* ``raise_exception`` and ``strftime_now`` globals;
* the message normalisation of ``apply_chat_template``: keys whose value is ``None`` are
  dropped, and ``reasoning_content`` is filled from ``thinking`` / ``reasoning``.

On top of that, tool-call ``arguments`` given as a JSON string (the OpenAI wire shape) are parsed
to a dict, as transformers users must do themselves: the Qwen3.5 template iterates
``arguments|items`` and fails on a string. The ``{% generation %}`` tag extension is left out: the
Qwen3.5 template does not use it.

The template is the Qwen3.5-27B one, shipped in ``shadow/adapters/templates/`` (see its NOTICE).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shadow.adapters.tokens import Tokens, get_tokens

TEMPLATE_FILE = "qwen3_5_chat_template.jinja"

Message = Mapping[str, Any]

# transformers._REASONING_FIELDS: the first non-None one wins and is copied under the others.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@functools.cache
def template_source() -> str:
    """The shipped Qwen3.5 chat template, byte for byte."""
    return (resources.files("shadow.adapters") / "templates" / TEMPLATE_FILE).read_text(encoding="utf-8")


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.cache
def _compiled(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def parse_arguments(arguments: Any) -> Any:
    """A tool call's ``arguments`` as the template wants them: a dict, not a JSON string.

    An empty string means "no arguments" (some providers send it for parameterless tools).
    Invalid JSON raises ``ValueError``: guessing would render text the model never saw.
    """
    if not isinstance(arguments, str):
        return arguments
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as e:
        raise ValueError(f"tool call arguments are not valid JSON: {arguments[:200]!r}") from e
    if not isinstance(parsed, dict):
        raise ValueError(f"tool call arguments must be a JSON object, got {type(parsed).__name__}")
    return parsed


def _normalize_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(call)
    if isinstance(out.get("function"), Mapping):
        fn = dict(out["function"])
        if "arguments" in fn:
            fn["arguments"] = parse_arguments(fn["arguments"])
        out["function"] = fn
    elif "arguments" in out:
        out["arguments"] = parse_arguments(out["arguments"])
    return out


def normalize_message(message: Message) -> dict[str, Any]:
    """One message as transformers hands it to the template (never mutates the input)."""
    msg = {k: v for k, v in message.items() if v is not None}
    reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
    if reasoning is not None:
        msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
    calls = msg.get("tool_calls")
    if isinstance(calls, Sequence) and not isinstance(calls, str):
        msg["tool_calls"] = [_normalize_tool_call(c) for c in calls]
    return msg


def render(
    messages: Iterable[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
) -> str:
    """The prompt text for ``messages`` (and OpenAI tool schemas ``tools``).

    ``enable_thinking=None`` leaves the variable undefined, which is the template's default
    (thinking on). Template errors (no user message, misplaced system message) propagate as
    ``jinja2.TemplateError``.
    """
    msgs = [normalize_message(m) for m in messages]
    kwargs: dict[str, Any] = {}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    tool_list = [dict(t) for t in tools] if tools is not None else None
    return _compiled(template_source()).render(
        messages=msgs,
        tools=tool_list,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )


def render_ids(
    messages: Iterable[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    tokens: Tokens | None = None,
) -> list[int]:
    """``render`` then encode: the ids an engine prefills for this request."""
    text = render(
        messages, tools, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking
    )
    return (tokens or get_tokens()).encode(text)
