"""OpenHands sessions -> ``Transcript``.

Two formats:

**Evaluation output** (``output.jsonl``, one session per line, CodeActAgent v0.35). The prompt of
each request is rebuilt from ``history`` the way OpenHands' ``ConversationMemory`` does it:

* ``history[0]`` (``action: system``) gives the system message and the OpenAI tool schemas.
* The user's ``message`` action becomes a user message; ``recall`` events are dropped (their
  workspace-context message is built from prompt templates that the file does not carry).
* Agent actions carry ``tool_call_metadata.model_response``, the full completion. Actions of one
  response (parallel calls) share ``model_response.id``; the response is one request, and its
  assistant message (content + tool calls) enters the history once all its calls have results.
* Observations with tool-call metadata become ``tool`` messages: a command's output in the form
  the agent saw (``prefix + content + suffix``, then working directory, interpreter and exit code
  lines), other observations' ``content``; text over ``max_message_chars`` is cut in the middle as
  OpenHands does. An error observation without metadata (the agent's reply to a malformed call)
  becomes a user message ending in ``[Error occurred in processing last action]``. Its response
  was never logged, so that request is missing from the transcript.
* Timeline: ``metrics.response_latencies`` gives each response's latency; the first event of the
  response is logged when it ends. Event timestamps are naive local time; the offset to UTC is
  taken from the first ``model_response.created`` (rounded to 15 minutes).

**SDK LLM logs** (``llm-logs/*.json``, one file per request, as sent). ``messages`` and ``tools``
are the request, ``response.choices[0].message`` the reply, ``timestamp`` its end (epoch) and
``latency_sec`` its duration. In the non-function-calling logs (they have ``raw_messages``) the
tools were described in the prompt text: those requests are taken as sent, without ``tools``.
Their reply is the text completion as the agent stored it in the next request (the provider
stopped on ``</function`` and the agent restores the tag); for the last request, the raw
completion with the tag restored. The logged ``raw_response`` cannot be used as is: the first one
lost its text.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shadow.adapters.transcripts._common import license_str, read_json, session_name
from shadow.adapters.transcripts.model import Request, Transcript, message_text

OUTPUT_FORMAT = "openhands-output"
SDK_FORMAT = "openhands-sdk-llm-logs"


def is_openhands_output(obj: Any) -> bool:
    return isinstance(obj, dict) and "history" in obj and "instance_id" in obj


def is_sdk_log(obj: Any) -> bool:
    return isinstance(obj, dict) and "messages" in obj and "response" in obj and "latency_sec" in obj


def truncate_content(content: str, max_chars: int | None) -> str:
    """openhands.events.serialization.event.truncate_content."""
    if max_chars is None or max_chars < 0 or len(content) <= max_chars:
        return content
    half = max_chars // 2
    return content[:half] + "\n[... Observation truncated due to length ...]\n" + content[-half:]


def _naive_epoch(ts: str) -> float:
    return datetime.fromisoformat(ts).replace(tzinfo=UTC).timestamp()


def _assistant_from_completion(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str) and message[key].strip():
            out["reasoning_content"] = message[key]
            break
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": c.get("type", "function"),
                "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments", "")},
            }
            for c in calls
        ]
    return out


def _observation_text(event: dict[str, Any], max_chars: int | None) -> str:
    kind = event.get("observation")
    content = event.get("content") or ""
    if kind == "run":
        md = (event.get("extras") or {}).get("metadata") or {}
        text = f"{md.get('prefix', '')}{content}{md.get('suffix', '')}"
        if md.get("working_dir"):
            text += f"\n[Current working directory: {md['working_dir']}]"
        if md.get("py_interpreter_path"):
            text += f"\n[Python interpreter: {md['py_interpreter_path']}]"
        if md.get("exit_code", -1) != -1:
            text += f"\n[Command finished with exit code {md['exit_code']}]"
        return truncate_content(text, max_chars)
    if kind == "read":
        return content  # openhands-aci truncates file reads itself
    return truncate_content(content, max_chars)


def _output_session(d: dict[str, Any], path: Path) -> Transcript:
    history = d["history"]
    max_chars = ((d.get("metadata") or {}).get("llm_config") or {}).get("max_message_chars")
    latency = {
        x["response_id"]: float(x["latency"]) for x in (d.get("metrics") or {}).get("response_latencies", [])
    }
    first = history[0]
    if first.get("action") != "system":
        raise ValueError(f"{d.get('instance_id')}: history[0] is not the system action")
    tools = first["args"].get("tools")
    messages: list[dict[str, Any]] = [{"role": "system", "content": first["args"]["content"]}]

    offset = 0.0
    for e in history:
        mr = (e.get("tool_call_metadata") or {}).get("model_response")
        if e.get("action") and mr and mr.get("created") is not None:
            end = _naive_epoch(e["timestamp"])
            offset = round((end - latency.get(mr["id"], 0.0) - float(mr["created"])) / 900.0) * 900.0
            break

    requests: list[Request] = []
    notes: list[str] = []
    pending: dict[str, tuple[dict[str, Any], list[str]]] = {}
    results: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for e in history[1:]:
        tcm = e.get("tool_call_metadata")
        if e.get("action") == "recall" or e.get("observation") == "recall":
            continue
        if e.get("action") == "message" and e.get("source") == "user":
            messages.append(
                {"role": "user", "content": (e.get("args") or {}).get("content", e.get("message", ""))}
            )
        elif e.get("action") and tcm:
            mr = tcm["model_response"]
            rid = mr["id"]
            if rid not in seen:
                seen.add(rid)
                reply = _assistant_from_completion(mr["choices"][0]["message"])
                end = _naive_epoch(e["timestamp"]) - offset
                lat = latency.get(rid)
                requests.append(
                    Request(
                        messages=list(messages),
                        tools=tools,
                        response=reply,
                        start_s=end - lat if lat is not None else None,
                        end_s=end,
                    )
                )
                pending[rid] = (reply, [c["id"] for c in reply.get("tool_calls", [])])
        elif e.get("observation") and tcm:
            results[tcm["tool_call_id"]] = {
                "role": "tool",
                "tool_call_id": tcm["tool_call_id"],
                "name": tcm.get("function_name"),
                "content": _observation_text(e, max_chars),
            }
        elif e.get("observation") == "error":
            text = (
                truncate_content(e.get("content") or "", max_chars)
                + "\n[Error occurred in processing last action]"
            )
            messages.append({"role": "user", "content": text})
            notes.append(f"event {e.get('id')}: error observation; the response that caused it is not logged")
        elif e.get("action") or e.get("observation"):
            kind = e.get("action") or e.get("observation")
            notes.append(f"event {e.get('id')}: {kind} without tool metadata, dropped")
        for rid in list(pending):
            reply, ids = pending[rid]
            if all(i in results for i in ids):
                messages.append(reply)
                messages.extend(results.pop(i) for i in ids)
                del pending[rid]
    missing = len(set(latency) - seen)
    if missing:
        notes.append(f"{missing} response(s) in metrics.response_latencies have no action in history")
    return Transcript(
        name=session_name(path, str(d["instance_id"])),
        source_format=OUTPUT_FORMAT,
        requests=requests,
        license_path=license_str(path),
        notes=notes,
    )


def load_openhands_output(path: Path) -> list[Transcript]:
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(_output_session(json.loads(line), path))
    return out


def _textual_reply(log: dict[str, Any], following: dict[str, Any] | None) -> dict[str, Any]:
    n = len(log["messages"])
    if (
        following is not None
        and len(following["messages"]) > n
        and following["messages"][n]["role"] == "assistant"
    ):
        stored = following["messages"][n]
        return {"role": "assistant", "content": message_text(stored.get("content"))}
    text = log["raw_response"]["choices"][0]["message"].get("content") or ""
    if "<function=" in text and "</function>" not in text:
        text = text.rstrip("\n") + "\n</function>"
    return {"role": "assistant", "content": text}


def load_sdk_logs(folder: Path) -> Transcript:
    logs = [read_json(p) for p in sorted(folder.glob("*.json"))]
    logs = [x for x in logs if is_sdk_log(x)]
    logs.sort(key=lambda x: float(x["timestamp"]))
    requests = []
    textual = False
    for k, log in enumerate(logs):
        end = float(log["timestamp"])
        if "raw_messages" in log and "raw_response" in log:
            textual = True
            reply = _textual_reply(log, logs[k + 1] if k + 1 < len(logs) else None)
            tools = None
        else:
            reply = _assistant_from_completion(log["response"]["choices"][0]["message"])
            tools = log.get("tools")
        requests.append(
            Request(
                messages=log["messages"],
                tools=tools,
                response=reply,
                start_s=end - float(log["latency_sec"]),
                end_s=end,
            )
        )
    notes = (
        ["non-function-calling log: taken as sent (tools in the prompt text), replies as stored"]
        if textual
        else []
    )
    return Transcript(
        name=session_name(folder, folder.name),
        source_format=SDK_FORMAT,
        requests=requests,
        license_path=license_str(folder),
        notes=notes,
    )
