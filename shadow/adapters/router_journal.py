"""Reading the router journal back (``DIR/shadow.jsonl``) for ``shadow router-eval``: every line
checked against ``shadow/data/router_journal.schema.json``, each turn's prompt ids up to the insertion
point rebuilt from the lines before it and checked against the SHA-256 the line carries, and the
figures of an evaluation (per-label counts, agreement with the host's router, the constant-label
baseline), all turns and the turns where the host's router decided the class (``fresh``) apart."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from shadow.core.errors import ShadowError

from .router import ids_sha256

SCHEMA: dict[str, Any] = json.loads(resources.files("shadow.data").joinpath("router_journal.schema.json")
                                    .read_text(encoding="utf-8"))
_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "boolean": bool, "array": list,
                                              "object": dict, "number": (int, float), "null": type(None)}


class JournalError(ShadowError):
    """A journal router-eval cannot read: missing, not JSON lines, or lines without its fields."""


@dataclass(frozen=True)
class JournalLine:
    line: int
    session: str
    request_id: str
    router_label: str | None
    fresh: bool | None
    insertion: int
    grid: int
    question: str | list[int]
    choices: list[str]
    keep: int
    add: list[int]
    ids_sha256: str
    live_label: str | None  # the live answer, when asked at the insertion point (not past it) and not failed
    stale: str | None = None  # why it cannot be asked again: written before router-eval's fields


def _type_ok(value: Any, spec: dict[str, Any]) -> bool:
    seq: Any = value  # isinstance below narrows value to object
    kinds: str | list[str] | None = spec.get("type")
    if kinds is None:
        return True
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if kind in ("integer", "number") and isinstance(value, bool):
            continue  # JSON true is not a number
        if isinstance(value, _TYPES[kind]):
            items = spec.get("items")
            if kind == "array" and items and not all(_type_ok(v, items) for v in seq):
                continue
            if "minimum" in spec and value < spec["minimum"]:
                continue
            return True
    return False


def _check(obj: Any, schema: dict[str, Any], where: str) -> list[str]:
    """The fields added for router-eval that ``obj`` lacks; an error for anything else amiss."""
    if not isinstance(obj, dict):
        raise JournalError(f"{where}: not a JSON object")
    missing = [k for k in schema["required"] if k not in obj]
    added = schema.get("x-added-for-router-eval", [])
    if any(k not in added for k in missing):
        raise JournalError(f"{where}: lacks {', '.join(missing)}; not a line of the router journal")
    for key, spec in schema["properties"].items():
        if key in obj and not _type_ok(obj[key], spec):
            raise JournalError(f"{where}: {key} = {json.dumps(obj[key])[:80]} is not {spec['type']}"
                               + (f" >= {spec['minimum']}" if "minimum" in spec else ""))
        if key in obj and spec.get("type") == "object" and "required" in spec:
            _check(obj[key], spec, f"{where}, {key}")
    return missing


def read_journal(path: Path) -> list[JournalLine]:
    """Every line of the journal, checked; a bad one is an error naming the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JournalError(f"{path}: no such file (the router journals to DIR/shadow.jsonl when a profile has "
                           "router: shadow)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise JournalError(f"{path}: cannot be read: {err}") from None
    lines = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{path} line {n}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as err:
            raise JournalError(f"{where}: not JSON ({err})") from None
        missing = _check(obj, SCHEMA, where)
        if missing:  # written before router-eval's fields: counted apart, named
            stale = (f"line {n} lacks {', '.join(missing)} (written before the router journaled what "
                     "router-eval needs)")
            lines.append(JournalLine(n, obj["session"], obj["request_id"], obj["router_label"], None,
                                     obj["insertion"], 0, "", [], 0, [], "", None, stale))
            continue
        lines.append(JournalLine(n, obj["session"], obj["request_id"], obj["router_label"], obj["fresh"],
                                 obj["insertion"], obj["grid"], obj["question"], obj["choices"],
                                 obj["ids"]["keep"], obj["ids"]["add"], obj["ids_sha256"],
                                 obj.get("label") if obj.get("at_insertion") else None))
    if lines and all(ln.stale for ln in lines):
        others = f"; so do the {len(lines) - 1} others" if len(lines) > 1 else ""
        raise JournalError(f"{path}: no line router-eval can ask again: {lines[0].stale}{others}")
    return lines


def rebuild_ids(lines: list[JournalLine]) -> tuple[dict[int, list[int]], dict[int, str]]:
    """Each line's prompt ids up to its insertion point (by line number), from the ids the session's
    earlier lines hold, and the reason for each line whose ids cannot be rebuilt exactly."""
    last: dict[str, int] = {}  # the session's previous line
    ids: dict[int, list[int]] = {}
    why: dict[int, str] = {}
    for ln in lines:
        prev = last.get(ln.session)
        last[ln.session] = ln.line
        before = ids.get(prev) if prev is not None else None
        if ln.stale:
            why[ln.line] = ln.stale
            continue
        if ln.keep and before is None:
            why[ln.line] = (f"line {ln.line} keeps {ln.keep} ids of the session's previous line, which the journal "
                            "does not hold (cut?)" if prev is None else
                            f"line {ln.line} keeps {ln.keep} ids of line {prev}, which could not be rebuilt")
            continue
        if before is not None and ln.keep > len(before):
            why[ln.line] = f"line {ln.line} keeps {ln.keep} ids of line {prev}, which holds {len(before)}"
            continue
        got = (before or [])[:ln.keep] + ln.add
        if len(got) != ln.insertion:
            why[ln.line] = f"line {ln.line}: {len(got)} ids rebuilt where the insertion point is {ln.insertion}"
        elif ids_sha256(got) != ln.ids_sha256:
            why[ln.line] = f"line {ln.line}: the ids rebuilt do not match its ids_sha256"
        else:
            ids[ln.line] = got
    return ids, why


@dataclass(frozen=True)
class Asked:
    """One turn asked again: the host's label, whether it decided it then, and the two answers."""

    line: int
    session: str
    request_id: str
    host: str | None
    fresh: bool | None
    live: str | None
    shadow: str
    probs: dict[str, float]


def _share(part: list[Asked], label: str | None = None) -> dict[str, Any]:
    compared = [a for a in part if a.host is not None]
    agreed = sum(a.shadow == a.host for a in compared) if label is None else sum(a.host == label for a in compared)
    return {"agreed": agreed, "compared": len(compared), "agreement": agreed / len(compared) if compared else None}


def figures(asked: list[Asked], total_turns: int, sessions: list[str], skipped: dict[str, list[tuple[int, str]]],
            same_question: bool) -> dict[str, Any]:
    """The evaluation's figures. ``skipped``: per session, the (line, reason) of each turn not asked
    again. The baseline is the host's most frequent label over all turns asked (ties: the first in
    order), scored as a constant answer on all turns and on the fresh ones."""
    fresh = [a for a in asked if a.fresh is True]
    hosts = Counter(a.host for a in asked if a.host is not None)
    top = max(sorted(hosts), key=lambda k: hosts[k]) if hosts else None
    labels = sorted({a.shadow for a in asked} | set(hosts))
    out: dict[str, Any] = {
        "turns": total_turns, "sessions": len(sessions), "asked": len(asked),
        "skipped": {"turns": sum(len(v) for v in skipped.values()),
                    "sessions": {s: {"turns": len(v), "lines": [n for n, _ in v], "reason": v[0][1]}
                                 for s, v in skipped.items()}},
        "labels": {k: {"shadow": sum(a.shadow == k for a in asked), "host": hosts[k],
                       "shadow_fresh": sum(a.shadow == k for a in fresh),
                       "host_fresh": sum(a.host == k for a in fresh)} for k in labels},
        "all": {"turns": len(asked), **_share(asked)},
        "fresh": {"turns": len(fresh), **_share(fresh)},
        "fresh_unknown": sum(a.fresh is None for a in asked),
        "baseline": {"label": top, "all": _share(asked, top), "fresh": _share(fresh, top)} if top else None,
    }
    if same_question:
        live = [a for a in asked if a.live is not None]
        out["same_as_live"] = {"same": sum(a.shadow == a.live for a in live), "compared": len(live)}
    return out


def _pct(share: dict[str, Any]) -> str:
    if not share["compared"]:
        return "-"
    return f"{share['agreed']}/{share['compared']} ({100 * share['agreement']:.1f} %)"


def table(fig: dict[str, Any]) -> str:
    """The figures as the terminal shows them."""
    rows = [["label", "shadow", "host", "shadow, fresh", "host, fresh"]]
    rows += [[k, str(v["shadow"]), str(v["host"]), str(v["shadow_fresh"]), str(v["host_fresh"])]
             for k, v in fig["labels"].items()]
    rows += [["", "all", "", "fresh", ""],
             ["turns asked", str(fig["all"]["turns"]), "", str(fig["fresh"]["turns"]), ""],
             ["agreement with the host", _pct(fig["all"]), "", _pct(fig["fresh"]), ""]]
    if fig["baseline"]:
        b = fig["baseline"]
        rows.append([f"constant {b['label']}", _pct(b["all"]), "", _pct(b["fresh"]), ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    sk = fig["skipped"]
    lines.append(f"{fig['turns']} turns of {fig['sessions']} sessions in the journal; {fig['asked']} asked again, "
                 f"{sk['turns']} not ({len(sk['sessions'])} sessions); fresh: the host's router decided the class "
                 f"on that turn ({fig['fresh_unknown']} turns do not say)")
    for s, v in sk["sessions"].items():
        lines.append(f"  not asked: {s}: {v['turns']} turns: {v['reason']}")
    if "same_as_live" in fig:
        same = fig["same_as_live"]
        lines.append(f"same label as the live shadow (where it asked at the insertion point): {same['same']} "
                     f"of {same['compared']}")
    return "\n".join(lines)
