"""``shadow`` on the command line: ``demo`` and ``verify`` (``serve`` comes with the service)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from shadow.core.shadow import Shadow

DEFAULT_HOME = Path.home() / ".qwen38-spark-engine" / "shadow"
SHARED_RAW = Path(__file__).resolve().parents[2] / "shared" / "data" / "sessions" / "raw"


def _demo_model(home: Path) -> Path:
    """A small random Qwen3.5 with the real vocabulary, written once and cached."""
    folder = home / "demo-model-v1"
    if not (folder / "config.json").is_file():
        import torch

        from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint

        print(f"writing a small random Qwen3.5 checkpoint to {folder} (first run only)", file=sys.stderr)
        tmp = folder.with_name(folder.name + ".tmp")
        write_checkpoint(tmp, demo_text_config(), dtype=torch.float32, seed=0)
        tmp.rename(folder)
    return folder


def _progress(name: str) -> Callable[[int, int, int], None]:
    def show(turn: int, total: int, committed: int) -> None:
        width = 30
        done = width * turn // total
        print(f"\r{name[:40]:40} [{'#' * done}{'.' * (width - done)}] turn {turn}/{total}, "
              f"{committed} rows read", end="", file=sys.stderr, flush=True)
        if turn == total:
            print(file=sys.stderr)
    return show


def _slice(text: str) -> slice:
    """``A:B`` in Python's slice syntax (``-8:`` is the last eight)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise SystemExit(f"--turns wants START:END, got {text!r}")
    a, b = (int(p) if p.strip() else None for p in parts)
    return slice(a, b)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _build(model: Path, grid: int, dtype: Literal["float32", "bfloat16"], device: str) -> Shadow:
    from shadow import ShadowSettings, build_shadow

    settings = ShadowSettings(_env_file=None, model=str(model), grid=grid, dtype=dtype, device=device, disk="off")
    return build_shadow(settings)


def cmd_demo(args: argparse.Namespace) -> int:
    from shadow.adapters.replay import verify
    from shadow.adapters.tokens import get_tokens
    from shadow.adapters.transcripts import demo_transcript, render_turns

    home = Path(args.home)
    model = Path(args.model) if args.model else _demo_model(home)
    sh = _build(model, args.grid, args.dtype, args.device)
    transcript = demo_transcript()
    turns = render_turns(transcript)
    print(f"session: {transcript.name} ({transcript.source_format}), {len(turns)} turns, "
          f"license {Path(transcript.license_path or '').name}")
    t0 = time.perf_counter()
    report = verify(sh, "demo", turns, _progress("demo"))
    read_s = time.perf_counter() - t0
    answer = sh.ask("demo", "Did the agent finish its task? A: yes, B: no, C: unclear. Answer with the letter.",
                    ["A", "B", "C"])
    tok = get_tokens()
    last = turns[-1].prompt_ids
    print(f"read {report.tokens} ids on a {args.grid}-row grid in {report.chunks} chunks ({read_s:.2f} s), "
          f"{report.rollbacks} rollbacks, {report.reread} ids re-read")
    print(f"state equals a fresh prefill, bit for bit: {'yes' if report.equal else 'NO'} "
          f"({report.tensors} tensors)")
    print(f"last prompt ends: {tok.decode(last[-12:])!r}")
    probs = ", ".join(f"{k}={v:.3f}" for k, v in answer.probs.items())
    print(f"question: done? -> {answer.label} ({probs}); {answer.behind} ids behind, {answer.lag_ms:.0f} ms")
    print("(a random-weight model: the answer shows the path works, not what a trained model would say)")
    return 0 if report.equal else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from shadow.adapters.replay import verify
    from shadow.adapters.transcripts import discover, load_transcript, render_turns

    paths = [Path(p) for p in args.paths] or discover(SHARED_RAW)
    if not paths:
        print(f"no sessions given and none found under {SHARED_RAW}", file=sys.stderr)
        return 2
    model = Path(args.model) if args.model else _demo_model(Path(args.home))
    rows = [["session", "tokens", "turns", "rollbacks", "ids re-read", "tensors", "equal", "largest diff"]]
    ok = True
    for path in paths:
        for transcript in load_transcript(path):
            picked = range(len(transcript.requests))[_slice(args.turns)]
            turns = render_turns(transcript, indices=picked)
            if args.max_tokens:
                turns = [t for t in turns if len(t.prompt_ids) + len(t.output_ids) <= args.max_tokens]
            if not turns:
                continue
            sh = _build(model, args.grid, args.dtype, args.device)
            r = verify(sh, "s", turns, _progress(transcript.name))
            ok &= r.equal
            rows.append([transcript.name[:48], str(r.tokens), str(r.turns), str(r.rollbacks), str(r.reread),
                         str(r.tensors), "yes" if r.equal else "NO",
                         "0" if r.equal else f"{r.largest_difference:.3g} ({r.worst_tensor})"])
    print(_table(rows))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="shadow", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", help="Qwen3.5 checkpoint folder (default: a small generated one)")
    common.add_argument("--home", default=str(DEFAULT_HOME), help="where the generated model is cached")
    common.add_argument("--grid", type=int, default=512)
    common.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    common.add_argument("--device", default="cpu")
    sub.add_parser("demo", parents=[common], help="follow the shipped real session, check it, ask a question")
    v = sub.add_parser("verify", parents=[common], help="replay real sessions and check the state bit for bit")
    v.add_argument("paths", nargs="*", help="session files or folders (default: all of ../shared/data)")
    v.add_argument("--turns", default=":", help="which requests of each session, as START:END (default all)")
    v.add_argument("--max-tokens", type=int, default=0, help="skip turns longer than this (0: keep all)")
    args = ap.parse_args(argv)
    return {"demo": cmd_demo, "verify": cmd_verify}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
