"""mini-swe-agent and SWE-agent trajectories -> ``Transcript``.

**mini-swe-agent** (``*.traj.json``, ``trajectory_format: mini-swe-agent-1``): ``messages`` is
already the OpenAI conversation; each assistant message is one request whose prompt is every
message before it. Actions are bash blocks in the text and observations are user messages, so
there are no tools and every observation counts as a new user query for the chat template (all
earlier reasoning is dropped at every turn). The reply's reasoning is the provider's reasoning
summary, ``extra.response.choices[0].message.reasoning`` (Gemini's real reasoning is encrypted).
Timeline: ``extra.response.created`` is when the request was made; there is no end time.

**SWE-agent** (``*.traj``): ``history`` is the conversation (``role``/``content``, plus
``tool_calls`` and ``tool_call_ids`` in the function-calling variant, whose tool schemas are not
in the file, so it renders without a tools section). Each assistant entry is one request; the
``thought`` is the content the model wrote. There is no LLM timing, so times are ``None``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shadow.adapters.transcripts._common import license_str, read_json, session_name
from shadow.adapters.transcripts.model import Request, Transcript

MINI_FORMAT = "mini-swe-agent"
SWE_AGENT_FORMAT = "swe-agent"


def is_mini_traj(obj: Any) -> bool:
    return isinstance(obj, dict) and str(obj.get("trajectory_format", "")).startswith("mini-swe-agent")


def is_swe_agent_traj(obj: Any) -> bool:
    return isinstance(obj, dict) and "history" in obj and "trajectory" in obj


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".traj.json", ".traj", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def load_mini_traj(path: Path, d: dict[str, Any] | None = None) -> Transcript:
    d = d if d is not None else read_json(path)
    messages = [{"role": m["role"], "content": m["content"]} for m in d["messages"]]
    requests = []
    for i, m in enumerate(d["messages"]):
        if m["role"] != "assistant":
            continue
        resp = ((m.get("extra") or {}).get("response")) or {}
        reply: dict[str, Any] = {"role": "assistant", "content": m["content"]}
        choices = resp.get("choices") or [{}]
        reasoning = (choices[0].get("message") or {}).get("reasoning")
        if isinstance(reasoning, str) and reasoning.strip():
            reply["reasoning_content"] = reasoning
        created = resp.get("created")
        requests.append(
            Request(
                messages=messages[:i],
                tools=None,
                response=reply,
                start_s=float(created) if created is not None else None,
                end_s=None,
            )
        )
    return Transcript(
        name=session_name(path, _stem(path)),
        source_format=MINI_FORMAT,
        requests=requests,
        license_path=license_str(path),
        notes=["no end times: start_s is the provider's 'created'"],
    )


def _swe_message(m: dict[str, Any]) -> dict[str, Any]:
    role = m["role"]
    out: dict[str, Any] = {"role": role, "content": m.get("content") or ""}
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": dict(c["function"])} for c in m["tool_calls"]
        ]
    if role == "tool":
        ids = m.get("tool_call_ids") or []
        out["tool_call_id"] = ids[0] if ids else None
    return out


def load_swe_agent_traj(path: Path, d: dict[str, Any] | None = None) -> Transcript:
    d = d if d is not None else read_json(path)
    messages = [_swe_message(m) for m in d["history"]]
    requests = [
        Request(messages=messages[:i], tools=None, response=m, start_s=None, end_s=None)
        for i, m in enumerate(messages)
        if m["role"] == "assistant"
    ]
    return Transcript(
        name=session_name(path, _stem(path)),
        source_format=SWE_AGENT_FORMAT,
        requests=requests,
        license_path=license_str(path),
        notes=["no LLM timing; function-calling variant rendered without tool schemas"],
    )
