"""The model on the GPU at the real 0.8B shape: correctness against transformers + fla, the GDN
kernel against the torch form, bit-determinism across processes, and chunk timings.

    python -m benchmarks.probes.gpu_model --out results.json

Random weights at the published shape (docs/model.md, "Sizes"), bf16. Writes one JSON with date, device and
commit; prints a short table last.
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

from benchmarks.common import environment, median_ms
from shadow.backends.qwen35 import Qwen35
from shadow.backends.qwen35.checkpoint import write_checkpoint
from shadow.backends.qwen35.config import reference_shape
from shadow.backends.qwen35.gdn import gated_delta_rule_chunked, gated_delta_rule_loop


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _gdn_inputs(length: int, seed: int, hk: int = 16, hv: int = 16, d: int = 128):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(length, hk, d, generator=gen, device=dev).to(bf)
    k = torch.randn(length, hk, d, generator=gen, device=dev).to(bf)
    v = torch.randn(length, hv, d, generator=gen, device=dev).to(bf)
    g = -torch.rand(length, hv, generator=gen, device=dev) * 2.0 - 0.01
    beta = torch.rand(length, hv, generator=gen, device=dev).to(bf)
    s0 = torch.randn(hv, d, d, generator=gen, device=dev) * 0.05
    return q, k, v, g, beta, s0


def determinism_child() -> None:
    """Run in a fresh process: print digests of the fla GDN and of a whole-model chunk."""
    from shadow.backends.qwen35 import gdn_fla

    assert gdn_fla.available()
    out, state = gdn_fla.gated_delta_rule(*_gdn_inputs(2048, seed=11))
    model = Qwen35.from_pretrained(os.environ["SHADOW_BENCH_CKPT"], device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 248000, (1024,), generator=torch.Generator().manual_seed(5))
    st = model.new_state()
    logits = model.forward(ids, st, logits_at=[-1])
    assert logits is not None
    print(json.dumps({"gdn": _digest(out, state), "model": _digest(logits, *st.recurrent, *st.conv,
                                                                    *(k[:1024] for k in st.k))}))


def compare_gdn() -> dict:
    from shadow.backends.qwen35 import gdn_fla

    rows = []
    for length, hk, hv in [(512, 16, 16), (2048, 16, 16), (1000, 16, 32), (37, 16, 16)]:
        q, k, v, g, beta, s0 = _gdn_inputs(length, seed=length, hk=hk, hv=hv)
        o_f, s_f = gdn_fla.gated_delta_rule(q, k, v, g, beta, s0)
        o_t, s_t = gated_delta_rule_chunked(q, k, v, g, beta, s0)
        row = {"length": length, "key_heads": hk, "value_heads": hv,
               "out_rel_err": ((o_f.float() - o_t.float()).norm() / o_t.float().norm()).item(),
               "state_rel_err": ((s_f - s_t).norm() / s_t.norm()).item()}
        if length <= 64:
            o_l, _ = gated_delta_rule_loop(q, k, v, g, beta, s0)
            row["torch_vs_loop_out_rel_err"] = ((o_t.float() - o_l.float()).norm() / o_l.float().norm()).item()
        rows.append(row)
    return {"rows": rows}


def compare_logits(ckpt: Path) -> dict:
    import transformers

    cfg_text = json.loads((ckpt / "config.json").read_text())["text_config"]
    ours = Qwen35.from_pretrained(ckpt, device="cuda", dtype=torch.bfloat16)
    ref = transformers.Qwen3_5ForCausalLM.from_pretrained(
        ckpt, config=transformers.Qwen3_5TextConfig(**cfg_text), dtype=torch.bfloat16).cuda().eval()
    out = {}
    for length in (1, 333, 2048):
        ids = torch.randint(0, 248000, (length,), generator=torch.Generator().manual_seed(length))
        a = ours.logits(ids)
        with torch.no_grad():
            b = ref(input_ids=ids[None].cuda()).logits[0].float()
        out[str(length)] = {
            "rel_err": ((a - b).norm() / b.norm()).item(),
            "max_abs_over_max": ((a - b).abs().max() / b.abs().max()).item(),
            "top1_agree": (a.argmax(-1) == b.argmax(-1)).float().mean().item(),
        }
    del ref
    torch.cuda.empty_cache()
    return out


def chunk_timings(ckpt: Path) -> dict:
    """ms per 512-row chunk at several depths: ours against transformers + fla with its own cache."""
    import transformers

    cfg_text = json.loads((ckpt / "config.json").read_text())["text_config"]
    ours = Qwen35.from_pretrained(ckpt, device="cuda", dtype=torch.bfloat16)
    ref = transformers.Qwen3_5ForCausalLM.from_pretrained(
        ckpt, config=transformers.Qwen3_5TextConfig(**cfg_text), dtype=torch.bfloat16).cuda().eval()
    gen = torch.Generator().manual_seed(0)
    total = 32768 + 512
    ids = torch.randint(0, 248000, (total,), generator=gen)
    res: dict[str, dict[str, float]] = {"ours": {}, "transformers_fla": {}}
    depths = (0, 8192, 32768)

    state = ours.new_state()
    for depth in depths:
        if depth > state.length:
            for a in range(state.length, depth, 512):
                ours.forward(ids[a:a + 512], state)
        saved, length = state.save_recurrent(), state.length

        def step(saved=saved, length=length) -> None:
            state.truncate(length)
            state.load_recurrent(saved)
            ours.forward(ids[length:length + 512], state)

        res["ours"][str(depth)] = median_ms(step)
        state.truncate(length)
        state.load_recurrent(saved)

    with torch.no_grad():
        for depth in depths:
            def ref_step(depth: int = depth) -> None:
                cache = transformers.DynamicCache(config=ref.config)
                if depth:
                    ref(input_ids=ids[None, :depth].cuda(), past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                ref(input_ids=ids[None, depth:depth + 512].cuda(), past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
                ref_step.last = (time.perf_counter() - t0) * 1e3  # type: ignore[attr-defined]

            times = []
            for _ in range(6):
                ref_step()
                times.append(ref_step.last)  # type: ignore[attr-defined]
            res["transformers_fla"][str(depth)] = sorted(times[1:])[len(times[1:]) // 2]
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        determinism_child()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_model.json")
    args = ap.parse_args()
    result: dict = {"benchmark": "gpu_model", **environment()}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        ckpt = write_checkpoint(Path(tmp) / "qwen35-0.8b-random", reference_shape("0.8B"), seed=0)
        result["checkpoint_write_s"] = time.time() - t0
        result["gdn_fla_vs_torch"] = compare_gdn()
        result["logits_vs_transformers_fla"] = compare_logits(ckpt)
        env = {**os.environ, "SHADOW_BENCH_CKPT": str(ckpt)}
        digests = [json.loads(subprocess.run([sys.executable, "-m", "benchmarks.probes.gpu_model", "--child"], env=env,
                                             check=True, capture_output=True, text=True).stdout.strip()
                              .splitlines()[-1]) for _ in range(2)]
        result["two_process_digests"] = digests
        result["two_process_bit_equal"] = digests[0] == digests[1]
        result["chunk_ms"] = chunk_timings(ckpt)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
