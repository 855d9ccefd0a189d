"""The exactness part of ``read_rate``: a real session replayed turn by turn through the facade (the
same ``replay.verify`` that ``shadow verify`` runs), its state against a fresh prefill in this
process (``torch.equal`` on every tensor) and in another process (by digest), and how far the fast
path's state lies from the eager path's (bf16 rounding, reported, not required to be zero).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import sessions_folder
from shadow import Shadow

REPO = Path(__file__).resolve().parents[2]
RAW = sessions_folder()
SESSION_FULL = RAW / "mini-swe-agent-gemini3-swebench" / "sympy__sympy-12489.traj.json"
SESSION_QUICK = RAW / "mini-swe-agent-gemini3-swebench" / "django__django-16527.traj.json"


def load_turns(path: Path | None, max_tokens: int) -> tuple[str, str, list[Any]]:
    """(name, where it came from, rendered turns) of the first session in ``path``; the shipped demo
    session (OpenHands, real) when ``path`` is absent. ``max_tokens`` drops the turns longer than
    that, as ``shadow verify --max-tokens`` does (0 keeps all), but keeps the first turn at least."""
    from shadow.adapters.transcripts import demo_transcript, load_transcript, render_turns

    if path is not None and path.exists():
        shown = path.resolve()
        transcript = load_transcript(path)[0]
        source = str(shown.relative_to(REPO.parent)) if shown.is_relative_to(REPO.parent) else str(shown)
    else:
        transcript, source = demo_transcript(), f"shadow/data/demo (shipped; {path} is absent)"
    turns = render_turns(transcript)
    if max_tokens:
        turns = [t for t in turns if len(t.prompt_ids) + len(t.output_ids) <= max_tokens] or turns[:1]
    return transcript.name, source, turns


def digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check(sh: Shadow, turns: list[Any], child: list[str] | None, work: Path) -> tuple[dict[str, Any], Any, list[int]]:
    """Replay ``turns`` into ``sh`` and compare; ``child`` is the command of the other process
    (``--child-fresh`` is appended with the ids file), None to skip it. Returns (the report, the
    replayed state, its ids); the session is forgotten."""
    from shadow.adapters.replay import verify

    t0 = time.perf_counter()
    r = verify(sh, "exact", turns)
    out: dict[str, Any] = {
        "tokens": r.tokens, "turns": r.turns, "rollbacks": r.rollbacks, "ids_reread": r.reread,
        "chunks": r.chunks, "tensors": r.tensors, "incremental_equals_fresh": r.equal,
        "largest_difference": r.largest_difference, "worst_tensor": r.worst_tensor,
        "replay_and_fresh_s": time.perf_counter() - t0,
    }
    ids = list(sh.session_ids("exact"))
    state = sh.export_state("exact")
    sh.forget("exact")
    out["digest"] = digest(state)
    if child is None:
        out["other_process"] = "skipped (--no-child)"
        out["equal"] = r.equal
        return out, state, ids
    ids_file = work / "exact-ids.json"
    ids_file.write_text(json.dumps(ids))
    t0 = time.perf_counter()
    # ``python -m`` from the repository's root finds ``benchmarks`` and ``shadow`` there.
    proc = subprocess.run(child + ["--child-fresh", str(ids_file)], cwd=REPO, capture_output=True, text=True)
    out["other_process_s"] = time.perf_counter() - t0
    if proc.returncode != 0:  # reported, not raised: the timings of this run still count
        out["other_process_error"] = f"exit {proc.returncode}: {proc.stderr[-2000:]}"
        out["other_process_digest"] = None
    else:
        out["other_process_digest"] = json.loads(proc.stdout.strip().splitlines()[-1])["digest"]
    out["other_process_equal"] = out["other_process_digest"] == out["digest"]
    out["equal"] = r.equal and out["other_process_equal"]
    return out, state, ids


def child_fresh(sh: Shadow, ids_file: Path) -> None:
    """In the other process (``sh`` built and warmed up as the service would): prefill the ids fresh,
    print the digest."""
    ids = json.loads(ids_file.read_text())
    state = sh.fresh_state(ids)
    print(json.dumps({"digest": digest(state), "tensors": len(state)}))


def agreement(fast: dict[str, torch.Tensor], eager: dict[str, torch.Tensor]) -> dict[str, Any]:
    """How far the fast path's state lies from the eager path's on the same ids: the largest
    relative (Frobenius) and absolute difference over the tensors, and where."""
    if fast.keys() != eager.keys():
        raise ValueError(f"the two paths export different tensors: {sorted(fast.keys() ^ eager.keys())[:4]}")
    worst_rel, worst_abs, where, equal = 0.0, 0.0, "", 0
    for name in sorted(fast):
        a, b = fast[name].float(), eager[name].float()
        if torch.equal(fast[name], eager[name]):
            equal += 1
            continue
        rel = float((a - b).norm() / b.norm().clamp_min(1e-30))
        worst_abs = max(worst_abs, float((a - b).abs().max()))
        if rel >= worst_rel:
            worst_rel, where = rel, name
    return {"tensors": len(fast), "bit_equal_tensors": equal, "largest_rel_diff": worst_rel,
            "largest_abs_diff": worst_abs, "worst_tensor": where}
