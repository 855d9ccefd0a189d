"""``shadow router-eval`` on a journal that real sessions wrote: two sessions from ../shared/data fed
turn by turn to the service with ``router: shadow`` and a host router's label on each turn; the
figures it prints are recomputed here from the journal's lines, independently."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from shadow.adapters.transcripts import load_transcript, render_turns
from shadow.adapters.transcripts.model import message_text
from shadow.cli import main
from shadow.core.records import RouterAsk
from tests.conftest import FakeClock, make_container, make_settings

RAW = "sessions/raw"
SESSIONS = {  # name: (file, turns): an OpenHands session (user and tool turns), a mini-swe-agent one
    "openhands": ("openhands-examples/output.jsonl", slice(0, 5)),
    "swe": ("mini-swe-agent-gemini3-swebench/django__django-16527.traj.json", slice(0, 6)),
}
QUESTION = ("What is the agent doing now? A: editing code, B: talking with the user, C: something else. "
            "Answer with the letter.")
CHOICES = ["A", "B", "C"]
GRID = 512
ADDED = ("ids", "ids_sha256", "question", "choices", "fresh", "grid")  # what old journal lines lack


def _host_router(request: Any, carried: str | None) -> tuple[str, bool]:
    """A stand-in for the host's router: it decides on a user's message (fresh) and carries the
    session's class forward on a tool result."""
    last = request.messages[-1]
    if last["role"] == "user" or carried is None:
        return ("A" if len(message_text(last.get("content"))) > 400 else "B"), True
    return carried, False


@pytest.fixture(scope="module")
def journal_dir(shared_data: Path, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("router-eval")
    profiles = home / "profiles.yaml"
    profiles.write_text("coding:\n  shadow: {mode: on, router: shadow, router_min_tokens: 1024}\n")
    c = make_container(make_settings(checkpoint, home, grid=GRID, profiles=str(profiles), profile="coding"),
                       FakeClock())
    svc = c.service()
    svc.idle_step()  # loads the model
    for name, (path, picked) in SESSIONS.items():
        transcript = load_transcript(shared_data / RAW / path)[0]
        requests = transcript.requests[picked]
        label = None
        for i, (request, turn) in enumerate(zip(requests, render_turns(transcript, indices=range(len(requests))),
                                                strict=True)):
            label, fresh = _host_router(request, label)
            rid = f"{name}-{i}"
            svc.arrived(rid)
            svc.started(rid, name, ids=turn.prompt_ids, profile="coding",
                        router=RouterAsk(QUESTION, CHOICES, label, fresh))
            svc.finished(rid)  # the output comes back in the next turn's prompt
            svc.idle_step()  # reads up to the insertion point and asks
            assert svc.router is not None and svc.router.status().waiting == 0
    c.shadow().close()
    return home


def _journal(home: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (home / "shadow.jsonl").read_text().splitlines()]


def _run(capsys: pytest.CaptureFixture[str], checkpoint: Path, home: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["router-eval", str(home), "--model", str(checkpoint), "--device", "cpu", "--dtype", "float32",
                 "--env-file", str(home / "absent.env"), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _share(agreed: int, compared: int) -> str:
    return f"{agreed}/{compared} ({100 * agreed / compared:.1f} %)"


def test_router_eval_figures_match_the_journal(journal_dir: Path, checkpoint: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    lines = _journal(journal_dir)
    assert [x["session"] for x in lines] == ["openhands"] * 5 + ["swe"] * 6
    assert all(x["at_insertion"] and "error" not in x for x in lines)  # asked live at the insertion point
    assert any(x["ids"]["keep"] > 0 for x in lines)  # later lines hold only the new ids

    code, out, err = _run(capsys, checkpoint, journal_dir, "--json", str(tmp_path / "fig.json"))
    assert code == 0, err
    assert "router-eval: turn 11/11 (swe)" in err  # progress on stderr
    fig = json.loads((tmp_path / "fig.json").read_text())

    # Independently, from the journal: the host's labels, the fresh turns, the constant baseline.
    host = Counter(x["router_label"] for x in lines)
    fresh = [x for x in lines if x["fresh"]]
    top = max(sorted(host), key=lambda k: host[k])
    assert fig["turns"] == fig["asked"] == fig["all"]["turns"] == fig["all"]["compared"] == 11
    assert fig["skipped"] == {"turns": 0, "sessions": {}}
    assert fig["fresh"]["turns"] == len(fresh) and 0 < len(fresh) < 11
    assert fig["baseline"]["label"] == top
    assert fig["baseline"]["all"]["agreed"] == host[top]
    assert fig["baseline"]["fresh"]["agreed"] == sum(x["router_label"] == top for x in fresh)
    # The live model on the live grid, asked at the same ids: the live answers again, to the bit.
    assert [a["line"] for a in fig["turns_asked"]] == list(range(1, 12))
    assert [a["probs"] for a in fig["turns_asked"]] == [x["probs"] for x in lines]
    assert fig["same_as_live"] == {"same": 11, "compared": 11}
    live = Counter(x["label"] for x in lines)
    for k in sorted(set(live) | set(host)):
        assert fig["labels"][k] == {"shadow": live[k], "host": host[k],
                                    "shadow_fresh": sum(x["label"] == k for x in fresh),
                                    "host_fresh": sum(x["router_label"] == k for x in fresh)}, k
    agreed = sum(x["agree"] for x in lines)
    assert fig["all"]["agreed"] == agreed and fig["fresh"]["agreed"] == sum(x["agree"] for x in fresh)

    # The printed table carries the same figures.
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()}
    for k in fig["labels"]:
        assert rows[k][1:] == [str(live[k]), str(host[k]), str(fig["labels"][k]["shadow_fresh"]),
                               str(fig["labels"][k]["host_fresh"])]
    assert f"agreement with the host  {_share(agreed, 11)}" in out
    assert f"constant {top}" in out and _share(host[top], 11) in out
    assert "same label as the live shadow (where it asked at the insertion point): 11 of 11" in out


def test_router_eval_names_the_sessions_it_cannot_restore(journal_dir: Path, checkpoint: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    lines = (journal_dir / "shadow.jsonl").read_text().splitlines()
    broken = tmp_path / "dir"
    broken.mkdir()
    old = {k: v for k, v in json.loads(lines[0]).items() if k not in ADDED} | {"session": "before"}
    # a line from before router-eval's fields, then the journal without openhands' first line
    (broken / "shadow.jsonl").write_text("\n".join([json.dumps(old), *lines[1:]]) + "\n")
    (tmp_path / "q.txt").write_text("Is the agent writing code? A: yes, B: no, C: unsure. Answer with the letter.\n")
    code, out, err = _run(capsys, checkpoint, broken, "--question-file", str(tmp_path / "q.txt"),
                          "--json", str(tmp_path / "fig.json"))
    assert code == 0, err
    fig = json.loads((tmp_path / "fig.json").read_text())
    assert fig["turns"] == 11 and fig["asked"] == 6 and fig["question"] == str(tmp_path / "q.txt")
    assert fig["skipped"]["turns"] == 5 and list(fig["skipped"]["sessions"]) == ["before", "openhands"]
    assert fig["skipped"]["sessions"]["openhands"]["lines"] == [2, 3, 4, 5]
    assert "not asked: before: 1 turns: line 1 lacks fresh, grid, question, choices, ids, ids_sha256" in out
    assert "not asked: openhands: 4 turns: line 2 keeps" in out
    assert "same_as_live" not in fig  # another wording: the live answers are no control


def test_router_eval_bad_input_names_file_and_line(journal_dir: Path, checkpoint: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, checkpoint, tmp_path / "nowhere")
    assert code == 2 and f"{tmp_path / 'nowhere' / 'shadow.jsonl'}: no such file" in err
    first = json.loads((journal_dir / "shadow.jsonl").read_text().splitlines()[0])
    journal = tmp_path / "shadow.jsonl"
    journal.write_text(json.dumps(first) + "\n{\"session\": \n")
    code, _, err = _run(capsys, checkpoint, tmp_path)
    assert code == 2 and f"{journal} line 2: not JSON" in err
    old = {k: v for k, v in first.items() if k not in ADDED}
    journal.write_text(json.dumps(old) + "\n")  # only lines from before router-eval's fields
    code, _, err = _run(capsys, checkpoint, tmp_path)
    assert code == 2 and (f"{journal}: no line router-eval can ask again: line 1 lacks fresh, grid, question, "
                          "choices, ids, ids_sha256") in err
    journal.write_text(json.dumps({k: v for k, v in first.items() if k != "insertion"}) + "\n")
    code, _, err = _run(capsys, checkpoint, tmp_path)
    assert code == 2 and f"{journal} line 1: lacks insertion" in err
    journal.write_text(json.dumps({**first, "insertion": "12"}) + "\n")
    code, _, err = _run(capsys, checkpoint, tmp_path)
    assert code == 2 and f"{journal} line 1: insertion = \"12\" is not integer" in err
