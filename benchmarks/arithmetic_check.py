"""Which arithmetic made a state, and whether a park crosses arithmetics.

Two checks on one device, one JSON file:

- ``digest``: the shipped real session (OpenHands, ``shadow/data/demo/``) fed turn by turn on a 0.8B-shaped
  checkpoint (random weights, seed 0), checked ``torch.equal`` against a fresh prefill, and the SHA-256 of its
  state and of a question's answer. A move of the fast path that keeps the bits keeps this digest.
- ``cross``: the fleet issue's repro. Process 1 (``FAST=--first``) reads ~1,600 ids of the session and parks
  it; process 2 (``FAST=--second``) on the same disk feeds two more chunks, and its state is compared with its
  own fresh prefill, tensor by tensor. Without a fingerprint in the park, ``on`` then ``off`` restores silently
  and leaves tensors unequal; with one, process 2 refuses the park and reads the session again (0 unequal).

    python -m benchmarks.arithmetic_check --out benchmarks/results    # CUDA; --device cpu for a try-out
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import environment, result_path

FIRST_IDS = 1636  # the fleet issue's repro: 3 chunks of 512 read, 100 ids pending
MORE_IDS = 2 * 512  # process 2 feeds two more chunks


def _digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _checkpoint(folder: Path, size: str) -> Path:
    from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
    from shadow.backends.qwen35.config import reference_shape

    shape = demo_text_config() if size == "demo" else reference_shape(size)
    if not (folder / "config.json").exists():
        write_checkpoint(folder, shape, seed=0, dtype=torch.bfloat16, layout="text", extras=False)
    return folder


def _session_ids() -> list[int]:
    from shadow.adapters.transcripts import demo_transcript
    from shadow.adapters.transcripts.render import render_turns

    last = render_turns(demo_transcript())[-1]
    return list(last.prompt_ids) + list(last.output_ids)


def _fingerprint(sh: object) -> str | None:
    """The status's fingerprint (``store.fingerprint``), None where this version has none."""
    return getattr(getattr(sh.status(), "store", None), "fingerprint", None) or None  # type: ignore[attr-defined]


def _settings(model: Path, device: str, fast: str, disk: str):  # type: ignore[no-untyped-def]
    from shadow import ShadowSettings

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return ShadowSettings(_env_file=None, model=str(model), device=device, dtype=dtype, grid=512, fast=fast,
                          disk=disk)


def digest(model: Path, device: str) -> dict[str, object]:
    from shadow import build_shadow
    from shadow.adapters.replay import verify
    from shadow.adapters.transcripts import demo_transcript
    from shadow.adapters.transcripts.render import render_turns

    # the fast path on CUDA; off it, the torch forward (Triton's interpreter would take hours on a session)
    sh = build_shadow(_settings(model, device, "on" if device.startswith("cuda") else "off", "off"))
    t0 = time.perf_counter()
    sh.warm_up()
    warm_s = time.perf_counter() - t0
    report = verify(sh, "s", render_turns(demo_transcript()))
    state = sh.export_state("s")
    answer = sh.ask("s", "Is the agent done? A: yes, B: no.", ["A", "B"])
    probs = json.dumps(answer.probs, sort_keys=True)
    out = {"ids": report.tokens, "turns": report.turns, "equal_to_fresh": report.equal,
           "worst_tensor": report.worst_tensor, "largest_difference": report.largest_difference,
           "tensors": len(state), "state_sha256": _digest(state),
           "answer_probs": answer.probs, "answer_sha256": hashlib.sha256(probs.encode()).hexdigest(),
           "warm_up_s": round(warm_s, 2), "status_fingerprint": _fingerprint(sh)}
    sh.close()
    return out


def phase(model: Path, device: str, fast: str, disk: str, which: str) -> dict[str, object]:
    """One process of ``cross``: ``park`` reads FIRST_IDS and parks; ``restore`` feeds MORE_IDS more and
    compares with its own fresh prefill."""
    from shadow import build_shadow

    ids = _session_ids()[: FIRST_IDS + (MORE_IDS if which == "restore" else 0)]
    sh = build_shadow(_settings(model, device, fast, disk))
    sh.warm_up()
    sh.feed_prompt("cross", ids)
    sh.read()
    pos = sh.position("cross")
    out: dict[str, object] = {"fast": fast, "ids": len(ids), "committed": pos.committed, "reread": pos.reread}
    if which == "restore":
        got, want = sh.export_state("cross"), sh.fresh_state(ids)
        out["unequal"] = sorted(k for k in want if k not in got or not torch.equal(got[k], want[k]))
        out["tensors"] = len(want)
        out["fingerprint"] = _fingerprint(sh)
    sh.close()  # a planned stop parks every resident session
    return out


def cross(model: Path, device: str, first: str, second: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as disk:
        runs = []
        for which, fast in (("park", first), ("restore", second)):
            cmd = [sys.executable, "-m", "benchmarks.arithmetic_check", "--phase", which, "--fast", fast,
                   "--model", str(model), "--device", device, "--disk", disk]
            env = dict(os.environ)
            if fast == "on" and not device.startswith("cuda"):
                env["TRITON_INTERPRET"] = "1"  # the fast path's kernels off CUDA: Triton's interpreter
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"{which} failed:\n{done.stderr[-4000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"first": first, "second": second, "park": runs[0], "restore": runs[1],
            "unequal": len(runs[1]["unequal"]), "tensors": runs[1]["tensors"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="0.8B", help="0.8B, 2B, 4B, or demo (the demo's small model, for a CPU try)")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: a 0.8B-shaped one written to --tmp)")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="arithmetic_check.json")
    ap.add_argument("--cross", default="on-off,on-on,off-off",
                    help="the FAST settings of the parking and the restoring process, comma-separated pairs")
    ap.add_argument("--phase", choices=("park", "restore"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fast", default="on", help=argparse.SUPPRESS)
    ap.add_argument("--disk", default="off", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.phase is not None:
        print(json.dumps(phase(Path(a.model), a.device, a.fast, a.disk, a.phase)))
        return 0
    model = Path(a.model) if a.model else _checkpoint(Path(a.tmp or tempfile.mkdtemp()) / f"m-{a.size}", a.size)
    result: dict[str, object] = {"environment": environment(), "size": a.size, "device": a.device,
                                 "digest": digest(model, a.device),
                                 "cross": [cross(model, a.device, *p.split("-")) for p in a.cross.split(",") if p]}
    path = result_path(a.out, a.name)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
