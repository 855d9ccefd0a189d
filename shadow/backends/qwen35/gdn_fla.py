"""The gated delta rule on CUDA through fla-core's Triton kernels, with pinned configurations.

fla's kernels are autotuned by timing: the fastest configuration of the moment wins, and some
of them split the K reduction differently (chunk_o's BK), so two processes could round
differently. shadow's exactness needs the same bits in every process, so before first use every
fla autotuner is cut down to a single configuration (Triton runs no benchmark when there is only
one): the one ``shadow/data/kernels/fla_configs.json`` names for it, picked once offline, or else
the first it lists. Which configurations exist depends on fla's version, which the ``gpu`` extra
pins.
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from importlib import resources
from typing import Any

import torch


@functools.cache
def available() -> bool:
    try:
        # fla warns at import on some versions of its dependencies; under warnings-as-errors (the
        # test suite) that would make fla look absent and silently put GDN on the torch form.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:  # ImportError, or triton failing to find a driver
        return False
    _pin_autotuners()
    return True


def _chosen_configs() -> dict[str, dict[str, Any]]:
    text = resources.files("shadow.data").joinpath("kernels/fla_configs.json").read_text()
    kernels: dict[str, dict[str, Any]] = json.loads(text)["kernels"]
    return kernels


def _matches(config: Any, want: dict[str, Any]) -> bool:
    return bool(dict(config.kwargs) == want["kwargs"] and config.num_warps == want["num_warps"]
                and config.num_stages == want["num_stages"])


PINNED: dict[str, str] = {}  # kernel name -> "chosen" (from the data file) or "first"


def _pin_autotuners() -> int:
    from triton.runtime.autotuner import Autotuner

    chosen = _chosen_configs()
    pinned = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for attr, obj in list(vars(module).items()):
            # Decorators wrap one another through ``.fn`` (``@triton.heuristics`` over fla's autotuner
            # over ``@triton.jit``): an autotuner under a heuristics object is still an autotuner.
            seen = 0
            while obj is not None and seen < 8:
                if isinstance(obj, Autotuner) and len(obj.configs) > 1:
                    want = chosen.get(attr)
                    pick = next((c for c in obj.configs if want is not None and _matches(c, want)), None)
                    obj.configs = [pick] if pick is not None else obj.configs[:1]
                    PINNED[attr] = "chosen" if pick is not None else "first"
                    # A pruner could otherwise pick among configs again, by heuristics or timing.
                    obj.early_config_prune = None
                    obj.perf_model = None
                    pinned += 1
                obj = getattr(obj, "fn", None)
                seen += 1
    return pinned


def unpinned() -> list[str]:
    """Autotuners anywhere in the process that could still choose by timing (for the GPU tests)."""
    import gc

    from triton.runtime.autotuner import Autotuner

    return [str(getattr(o, "fn", o)) for o in gc.get_objects() if isinstance(o, Autotuner) and len(o.configs) > 1]


def gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, normalized: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``gdn.gated_delta_rule`` (one sequence, no batch axis); ``normalized``: q and
    k arrive l2-normalised (the fast path's conv kernel does it)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    o, s = chunk_gated_delta_rule(
        q[None].contiguous(), k[None].contiguous(), v[None].contiguous(),
        g[None].float().contiguous(), beta[None].contiguous(),
        initial_state=state[None].float().contiguous(), output_final_state=True,
        use_qk_l2norm_in_kernel=not normalized,
    )
    return o[0], s[0]


def recurrent_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, normalized: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule token by token in one kernel (fla's fused recurrent form): for the few rows of a
    decode step, where the chunked form's launches cost more than its work. Same contract."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    o, s = fused_recurrent_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta=beta[None], initial_state=state[None],
        output_final_state=True, use_qk_l2norm_in_kernel=not normalized,
    )
    return o[0], s[0]


# From this many sessions a pass, the state pass and the output run as one kernel of ours
# (``gdn_fused``) instead of fla's two: the same bits (``torch.equal`` on the H200 at 1, 2, 4, 8 and
# 16 sessions, whole passes too), a layer's call 49.8 -> 47.5 us at 2 sessions, 157 -> 130 at 8 and
# 294 -> 248 at 16, but 38 -> 45 at one, where fla's output kernel spreads over the chunks and ours
# walks them in order (``benchmarks/probes/gdn_fused_ab.py``).
FUSED_FROM = 2


def use_fused(sessions: int, key_dim: int, value_dim: int, rows: int) -> bool:
    """The default form of ``chunk_rule_in_place``: fused from ``FUSED_FROM`` sessions, where the
    kernel is written for the head dims (fla's two kernels take any, the tests' tiny models too)
    and for the rows a session (``gdn_fused.fits``: not one row, a decode step)."""
    from . import gdn_fused

    return sessions >= FUSED_FROM and gdn_fused.fits(key_dim, value_dim, rows=rows)


def chunk_rule_in_place(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_sums: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, a_work: torch.Tensor, fused: bool | None = None,
) -> torch.Tensor:
    """What ``gated_delta_rule(..., normalized=True)`` computes, from fla's kernels called below its
    wrapper, so that a captured pass runs no fills and no copies: ``state`` [HV, K, V] fp32 is
    moved on in place (fla's state kernel reads each block of the initial state before it writes
    the same block of the final one, and no two programs share a block); ``g_sums`` arrives as the
    gate summed within 64-row chunks in log2 units (``kernels.gates(chunk_sums=True)``);
    ``a_work`` [1, T, HV, 64] is this row count's solve buffer, zeroed once when made: the solve
    writes the same lower blocks on every call and the rest must stay zero. Returns o [T, HV, V].

    With ``state`` of shape [B, HV, K, V] the T rows are B sessions of T / B rows, each from its
    own state: fla's batch axis. Its kernels index a program's sequence by the program id alone
    (``bos = i_b * T``), so one session's programs run the same compiled code on the same numbers
    whatever B is: batched equals alone by construction.
    ``fused``: fla's state and output kernels, or ``gdn_fused``'s one kernel in their place (by
    default ``use_fused``). Tied to the fla version the ``gpu`` extra pins; the GPU
    tests compare both forms with the wrapper."""
    import triton
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_kernel_h_blockdim64 as state_kernel
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_kkt_solve_kernel as solve_kernel
    from fla.ops.gated_delta_rule.wy_fast import recompute_w_u_fwd

    s1 = state if state.dim() == 4 else state[None]
    b = s1.shape[0]
    t = k.shape[0] // b

    def per_session(x: torch.Tensor) -> torch.Tensor:
        return x.view(b, t, *x.shape[1:])

    k1, v1, g1, b1 = per_session(k), per_session(v), per_session(g_sums), per_session(beta)
    _, _, h, dk = k1.shape
    hv, dv = v1.shape[2], v1.shape[3]
    chunk = a_work.shape[-1]
    a1 = a_work.view(b, t, hv, chunk)
    nt = triton.cdiv(t, chunk)
    solve_kernel[(nt, b * hv)](k=k1, g=g1, beta=b1, A=a1, cu_seqlens=None, chunk_indices=None, T=t, H=h,
                               HV=hv, K=dk, BT=chunk, BC=16)
    w, u = recompute_w_u_fwd(k=k1, v=v1, beta=b1, A=a1, g=g1)
    if use_fused(b, dk, dv, t) if fused is None else fused:
        from . import gdn_fused

        out = torch.empty_like(u)
        gdn_fused.state_and_output(per_session(q), k1, u, w, g1, s1, out)
        return out.view(b * t, hv, dv)
    hs = k1.new_empty(b, nt, hv, dk, dv)
    v_new = torch.empty_like(u)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(dv, meta["BV"]) * b * hv,)

    state_kernel[grid](k=k1, v=u, w=w, v_new=v_new, g=g1, gk=None, h=hs, h0=s1, ht=s1, cu_seqlens=None,
                       chunk_offsets=None, T=t, H=h, HV=hv, K=dk, V=dv, BT=chunk, STATE_V_FIRST=False)
    o: torch.Tensor = chunk_fwd_o(q=per_session(q), k=k1, v=v_new, h=hs, g=g1, scale=dk ** -0.5, chunk_size=chunk)
    return o.view(b * t, hv, dv)
