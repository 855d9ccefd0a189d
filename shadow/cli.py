"""``shadow`` on the command line: ``serve``, ``proxy``, ``status``, ``demo``, ``verify`` and ``router-eval``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from shadow.api.launch import add_flags, cmd_proxy, cmd_serve
from shadow.api.terminal import table as _table
from shadow.core.settings import DEFAULT_HOME

if TYPE_CHECKING:
    from shadow.core.shadow import Shadow


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


def _build(model: Path, grid: int, dtype: Literal["float32", "bfloat16"], device: str) -> Shadow:
    from shadow import ShadowSettings, build_shadow

    settings = ShadowSettings(_env_file=None, model=str(model), grid=grid, dtype=dtype, device=device, disk="off")
    return build_shadow(settings)


DEMO_QUESTION = "Did the agent finish its task? A: yes, B: no, C: unclear. Answer with the letter."


def _speed(text: str) -> str | float:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--speed wants auto or a positive factor, got {text!r}")
    return value


def _wait_for(what: str, ready: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


DEMO_REPLAY_S = 75.0  # the replay's longest: with the model's load and the checks, make demo stays under 2 minutes


def _chunk_cost(container: Any, host: Any, ids: list[int], grid: int) -> float:
    """The median cost of 3 chunks of ``ids`` read on this device, outside the replayed session
    (a hold keeps the idle window shut meanwhile)."""
    from shadow.core.plan import ReadPlan

    hold = host.add_hold()
    try:
        sh = container.shadow()
        sh.feed_prompt("demo-chunk-cost", ids[:3 * grid])
        costs = sorted(c.cost_s for c in sh.read(ReadPlan("demo-chunk-cost")))
        sh.forget("demo-chunk-cost")
    finally:
        host.release_hold(hold)
    return float(costs[len(costs) // 2])


def cmd_demo(args: argparse.Namespace) -> int:
    """Start the service on loopback, drive it as a host would through the shipped session's real
    timeline (at a pace where the reader keeps up as it would for a user), ask, check the state
    against a fresh prefill, print what happened."""
    from shadow.adapters.replay import compare
    from shadow.adapters.telemetry import read_jsonl
    from shadow.adapters.timeline import USER_CHUNK_S, demo_stretch, durations, replay_timeline
    from shadow.adapters.transcripts import demo_transcript, render_turns
    from shadow.api.app import create_app
    from shadow.api.client import ShadowClient
    from shadow.api.server import BackgroundServer
    from shadow.container import build_container
    from shadow.core.settings import ShadowSettings

    home = Path(args.home)
    model = Path(args.model) if args.model else _demo_model(home)
    trace = home / "demo-trace.jsonl"
    trace.unlink(missing_ok=True)
    settings = ShadowSettings(_env_file=None, model=str(model), grid=args.grid, dtype=args.dtype,
                              device=args.device, disk="off", dir=str(home), trace="jsonl",
                              trace_file=str(trace), host="127.0.0.1", port=0)
    container = build_container(settings)
    transcript = demo_transcript()
    turns = render_turns(transcript)
    start, length = durations(turns, 1.0)[-1]
    print(f"session: {transcript.name} ({transcript.source_format}), {len(turns)} turns over {start + length:.1f} s, "
          f"license {Path(transcript.license_path or '').name}")
    with BackgroundServer(create_app(container), settings.host, 0) as server, ShadowClient(server.url) as host:
        _wait_for("the model to load", lambda: host.status().slot.state in ("loaded", "failed"))
        slot = host.status().slot
        if slot.state != "loaded":
            print(f"the model did not load: {slot.error}", file=sys.stderr)
            return 1
        print(f"service on {server.url}; model loaded in an idle window ({slot.load_s or 0.0:.2f} s)")
        chunk_s = _chunk_cost(container, host, turns[0].prompt_ids, args.grid)
        stretch = demo_stretch(chunk_s, start + length, DEMO_REPLAY_S) if args.speed == "auto" else 1 / args.speed
        pace = "its real pace" if stretch == 1 else (f"{stretch:.2g} times slower than it happened" if stretch > 1
                                                     else f"{1 / stretch:.2g} times faster than it happened")
        if args.speed == "auto" and stretch * USER_CHUNK_S < chunk_s:
            pace += " (as slow as 2 minutes allow: the reader here is slower still)"
        print(f"chunk cost measured here: {chunk_s * 1e3:.1f} ms a {args.grid}-row chunk (a user's 0.8B on an "
              f"H200: {USER_CHUNK_S * 1e3:.2f} ms); replayed at {pace}")
        reports = replay_timeline(host, "demo", turns, args.grid, speed=1 / stretch)
        _wait_for("the idle window to catch up",
                  lambda: host.status().sessions["demo"].backlog < args.grid)
        answer = host.ask("demo", DEMO_QUESTION, ["A", "B", "C"])
        status = host.status()
        hold = host.add_hold()  # the idle window stays shut while the state is compared
        sh = container.shadow()
        equal, worst, where = compare(sh.export_state("demo"), sh.fresh_state(sh.session_ids("demo")))
        host.release_hold(hold)
    spans = read_jsonl(trace)  # complete: the server's stop flushed the exporter

    rows = [["turn", "start s", "prompt ids", "output ids", "behind at start", "fresh", "rollback",
             "ration chunks", "ration ms"]]
    for r in reports:
        rows.append([str(r.index + 1), f"{r.start_s:.2f}", str(r.prompt_ids), str(r.output_ids),
                     str(r.behind_at_start), "yes" if r.fresh else "no", "yes" if r.rollback else "",
                     str(r.ration_chunks), f"{r.ration_spent_ms:.1f}"])
    print(_table(rows))
    w = status.windows
    print(f"chunks read: idle window {w.idle.chunks} in {w.idle.windows} windows "
          f"({w.idle.spent_ms:.0f} ms), ration {w.ration.chunks} in {w.ration.windows} "
          f"slices ({w.ration.spent_ms:.0f} ms)")
    print(f"fresh (less than one {args.grid}-row chunk behind) at {sum(r.fresh for r in reports)} of "
          f"{len(reports)} turn starts (the first turn starts a new session)")
    s = status.sessions["demo"]
    print(f"session: {s.ids} ids, {s.committed} read, {len(s.checkpoints)} checkpoints, "
          f"{s.rollbacks} rollbacks; state equals a fresh prefill, bit for bit: "
          f"{'yes' if equal else f'NO ({worst:.3g} in {where})'}")
    probs = ", ".join(f"{k}={v:.3f}" for k, v in answer.probs.items())
    print(f"question: done? -> {answer.label} ({probs}); {answer.behind} ids behind, "
          f"{answer.latency_ms:.0f} ms")
    chunks = [x for x in spans if x["name"] == "shadow.chunk"]
    by_window = {k: sum(1 for x in chunks if x["attributes"]["shadow.window"] == k) for k in ("idle", "ration")}
    print(f"trace: {trace} ({len(spans)} spans: {len(chunks)} chunks, {by_window['idle']} idle and "
          f"{by_window['ration']} rationed; {sum(x['name'] == 'shadow.ration' for x in spans)} ration slices, "
          f"{sum(x['name'] == 'shadow.ask' for x in spans)} questions)")
    print("(a random-weight model: the answer shows the path works, not what a trained model would say)")
    return 0 if equal else 1


def cmd_status(args: argparse.Namespace) -> int:
    """The running service's status as a table (``--url``; the token from the settings)."""
    import httpx

    from shadow.api.client import ShadowClient, ShadowHTTPError
    from shadow.api.paths import BASE
    from shadow.core.errors import ShadowError
    from shadow.core.settings import ShadowSettings

    try:
        settings = ShadowSettings(_env_file=args.env_file)
    except ShadowError as err:
        print(f"shadow status: {err}", file=sys.stderr)
        return 2
    url = args.url or f"http://{settings.host}:{settings.port}"
    url = url.rstrip("/").removesuffix(BASE)  # the proxy's prefix given as well: the client adds it itself
    try:
        with ShadowClient(url, timeout=10.0, token=settings.token or None) as client:
            st = client.status()
    except ShadowHTTPError as err:
        print(f"shadow status: {url} answered {err}", file=sys.stderr)
        return 1
    except httpx.HTTPError as err:
        print(f"shadow status: cannot reach {url}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    from shadow.api.terminal import status_table

    print(f"shadow at {url}")
    print(status_table(st))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from shadow.adapters.replay import verify
    from shadow.adapters.transcripts import discover, load_transcript, render_turns
    from shadow.core.errors import ShadowError
    from shadow.core.settings import PREFIX, ShadowSettings

    paths = [Path(p) for p in args.paths]
    if not paths:
        try:
            folder = ShadowSettings().sessions
        except ShadowError as err:
            print(f"shadow verify: {err}", file=sys.stderr)
            return 2
        if not folder:
            print(f"shadow verify: no sessions to check: give session files or folders, or set "
                  f"{PREFIX}SESSIONS (environment or serve.env) to a folder of them", file=sys.stderr)
            return 2
        paths = discover(Path(folder).expanduser())
        if not paths:
            print(f"shadow verify: no sessions found under {folder} ({PREFIX}SESSIONS)", file=sys.stderr)
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


def cmd_router_eval(args: argparse.Namespace) -> int:
    """The router's question asked again at the journaled insertion points of DIR/shadow.jsonl."""
    import json

    from shadow.adapters.router_eval import evaluate, report
    from shadow.adapters.router_journal import read_journal, table
    from shadow.core.errors import ShadowError
    from shadow.core.settings import PREFIX, ShadowSettings

    journal = Path(args.dir).expanduser() / "shadow.jsonl"
    try:
        settings = ShadowSettings(_env_file=args.env_file)
        lines = read_journal(journal)
        question = None
        if args.question_file:
            try:
                question = Path(args.question_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as err:
                raise ShadowError(f"--question-file {args.question_file}: cannot be read: {err}") from None
            if not question:
                raise ShadowError(f"--question-file {args.question_file}: empty")
    except ShadowError as err:
        print(f"shadow router-eval: {err}", file=sys.stderr)
        return 2
    model = args.model or settings.model
    if not model:
        print(f"shadow router-eval: no model: pass --model or set {PREFIX}MODEL", file=sys.stderr)
        return 2
    shadows: dict[int, Shadow] = {}

    def shadow_for(grid: int) -> Shadow:
        grid = args.grid or grid  # the live grid unless told otherwise: the same bits as live
        if grid not in shadows:
            shadows[grid] = _build(Path(model), grid, args.dtype or settings.dtype, args.device or settings.device)
        return shadows[grid]

    def progress(done: int, total: int, session: str) -> None:
        print(f"\rrouter-eval: turn {done}/{total} ({session[:40]})", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    try:
        ev = evaluate(lines, shadow_for, question, progress if lines else None)
    except ShadowError as err:
        print(f"shadow router-eval: {err}", file=sys.stderr)
        return 2
    fig = {"journal": str(journal), "question": args.question_file or "journaled", "model": str(model),
           **report(lines, ev, same_question=question is None)}
    print(f"router-eval: {journal}, question: {fig['question']}, model: {model}")
    print(table(fig))
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=1) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="shadow", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", help="Qwen3.5 checkpoint folder (default: a small generated one)")
    common.add_argument("--home", default=str(Path(DEFAULT_HOME).expanduser()),
                        help="where the generated model is cached")
    common.add_argument("--grid", type=int, default=512)
    common.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    common.add_argument("--device", default="auto", help="auto (CUDA when present, else cpu), cpu, cuda, cuda:N")
    d = sub.add_parser("demo", parents=[common],
                       help="start the service, follow the shipped real session on its timeline, ask a question")
    d.add_argument("--speed", default="auto", type=_speed,
                   help="auto: the session's real pace, slowed by the chunk cost measured here against a user's "
                        "(within 2 minutes); or a factor (1: real pace, 3: three times faster)")
    s = sub.add_parser("serve", help="run the service (settings from the environment and serve.env)")
    add_flags(s, serve=True)
    p = sub.add_parser("proxy", help="an OpenAI-compatible proxy in front of vLLM / SGLang / llama.cpp, "
                                     "followed by the shadow")
    p.add_argument("--upstream", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8000")
    add_flags(p, serve=False)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait on the upstream (default 600)")
    p.add_argument("--engine", default="auto", choices=["auto", "vllm", "sglang", "llamacpp", "transformers"],
                   help="how to ask the engine for its token ids (default auto: from its /v1/models)")
    p.add_argument("--shadow", default=None, metavar="URL",
                   help="follow with the shadow service at URL (`shadow serve`) instead of one in this process")
    st = sub.add_parser("status", help="the running service's status as a table")
    st.add_argument("--url", default=None, help="the service's base URL (default: http://HOST:PORT of the settings)")
    st.add_argument("--env-file", default="serve.env", help="the settings file (default: ./serve.env)")
    v = sub.add_parser("verify", parents=[common], help="replay real sessions and check the state bit for bit")
    v.add_argument("paths", nargs="*",
                   help="session files or folders (default: the folder QWEN38_SHADOW_SESSIONS names)")
    v.add_argument("--turns", default=":", help="which requests of each session, as START:END (default all)")
    v.add_argument("--max-tokens", type=int, default=0, help="skip turns longer than this (0: keep all)")
    r = sub.add_parser("router-eval", help="ask the router's question again at the insertion points journaled "
                                           "in DIR/shadow.jsonl")
    r.add_argument("dir", help="the service's DIR (QWEN38_SHADOW_DIR), holding shadow.jsonl")
    r.add_argument("--question-file", help="another wording of the question (text; the choices stay the journal's)")
    r.add_argument("--json", help="write the figures to this file as JSON")
    r.add_argument("--model", help="the checkpoint to ask (default: QWEN38_SHADOW_MODEL)")
    r.add_argument("--grid", type=int, default=0, help="rows per chunk (default: the journal's)")
    r.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: QWEN38_SHADOW_DTYPE")
    r.add_argument("--device", default=None, help="default: QWEN38_SHADOW_DEVICE")
    r.add_argument("--env-file", default="serve.env", help="the settings file (default: ./serve.env)")
    args = ap.parse_args(argv)
    return {"demo": cmd_demo, "serve": cmd_serve, "proxy": cmd_proxy, "verify": cmd_verify,
            "router-eval": cmd_router_eval, "status": cmd_status}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
