"""The floor under each figure of ``read_rate``: the model's FLOPs and bytes, over rates measured in
the same run.

FLOPs of ``n`` new rows above ``d`` committed rows (a chunk: n = grid; a question: n = 300; one
decoded token: n = 1), summed over the layers; h hidden, I intermediate, V vocabulary:

- MLP, every layer: ``3 * 2*n*h*I`` (gate, up, down).
- Full attention (H query heads, Hkv key/value heads, head dim D):
  projections ``2*n*h*(2*H*D + 2*Hkv*D) + 2*n*H*D*h`` (q with its gate, k, v; o), then scores and
  values over the causal keys only: query i sees d+i+1 keys, so
  ``2 * 2*H*D * sum_i (d+i+1) = 4*H*D*(n*d + n*(n+1)/2)``.
- Gated DeltaNet (Hk key heads, Hv value heads, dk, dv, conv kernel K, chunk C = 64):
  projections ``2*n*h*(2*Hk*dk + 2*Hv*dv + 2*Hv) + 2*n*Hv*dv*h`` (qkv, z, a, b; out), the depthwise
  conv ``2*n*(2*Hk*dk + Hv*dv)*K``, and the chunked (WY) rule per value head and row
  ``6*dk*dv + 2*C*(2*dk + dv) + C*(dk + dv)``: the three products with the carried state
  (w S, q S, the state update k^T delta), the products inside a chunk (k k^T and q k^T, C x C x dk;
  the chunk's attention times the deltas, C x C x dv), and the unit-triangular solves for the WY
  factors u and w (C x C against dv and dk columns: half a product each).
- Logits (questions and decoding only): ``2*h*V`` for the one row asked for.

Norms, gates, rotary and other elementwise work are left out: they are not matrix work.

Bytes a forward must move at least once: every weight matrix it multiplies by (the embedding table
only when it is also the head and logits are taken; a chunk reads just its rows' embeddings),
the KV rows it attends over (``2*Hkv*D*d`` elements per full layer), and the GDN recurrent state
read and written (``2 * Hv*dk*dv`` fp32 per layer).

``floor_ms = max(FLOPs / matmul rate, bytes / copy rate)``. The matmul rate is an N x N x N product
in the model's dtype (N = 8192 on CUDA); the copy rate is (read + write) bytes per second of a
device-to-device copy. A chunk is FLOP-bound (at the 0.8B shape: about 0.54 TFLOP against 1 GB),
a decoded token byte-bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from shadow.backends.qwen35 import Qwen35Config

GDN_CHUNK = 64


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float

    def floor_ms(self, matmul_flops_per_s: float, copy_bytes_per_s: float) -> tuple[float, str]:
        """(the floor in ms, which bound it is: "flops" or "bytes")."""
        f = self.flops / matmul_flops_per_s * 1e3
        b = self.bytes / copy_bytes_per_s * 1e3
        return (f, "flops") if f >= b else (b, "bytes")


def projection_flops(cfg: Qwen35Config, n: int) -> float:
    """The dense products of ``n`` rows: MLP and every projection (what cuBLAS runs)."""
    h = cfg.hidden_size
    total = 0.0
    for kind in cfg.layer_types:
        total += 3 * 2 * n * h * cfg.intermediate_size
        if kind == "full_attention":
            hd = cfg.head_dim
            total += 2 * n * h * (2 * cfg.num_attention_heads * hd + 2 * cfg.num_key_value_heads * hd)
            total += 2 * n * cfg.num_attention_heads * hd * h
        else:
            total += 2 * n * h * (cfg.conv_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads)
            total += 2 * n * cfg.value_dim * h
    return total


def attention_flops(cfg: Qwen35Config, n: int, depth: int) -> float:
    """Scores and values of every full-attention layer, causal keys only."""
    per_layer = 4 * cfg.num_attention_heads * cfg.head_dim * (n * depth + n * (n + 1) / 2)
    return per_layer * len(cfg.full_layers)


def gdn_products(cfg: Qwen35Config, n: int) -> float:
    """The chunked rule's batched products (what ``gated_delta_rule_chunked`` runs as bmm), all GDN layers."""
    dk, dv, c = cfg.linear_key_head_dim, cfg.linear_value_head_dim, GDN_CHUNK
    return n * cfg.linear_num_value_heads * (6 * dk * dv + 2 * c * (2 * dk + dv)) * len(cfg.linear_layers)


def gdn_flops(cfg: Qwen35Config, n: int) -> float:
    """The depthwise conv and the whole chunked gated delta rule (products and solves), all GDN layers."""
    dk, dv, c = cfg.linear_key_head_dim, cfg.linear_value_head_dim, GDN_CHUNK
    conv = 2 * n * cfg.conv_dim * cfg.linear_conv_kernel_dim
    solves = n * cfg.linear_num_value_heads * c * (dk + dv)
    return (conv + solves) * len(cfg.linear_layers) + gdn_products(cfg, n)


def cost(cfg: Qwen35Config, n: int, depth: int, logits: bool, elem_bytes: int) -> Cost:
    """FLOPs and bytes of ``n`` rows above ``depth`` (see the module docstring)."""
    flops = projection_flops(cfg, n) + attention_flops(cfg, n, depth) + gdn_flops(cfg, n)
    weights = projection_flops(cfg, 1) / 2  # one multiply-add per weight element per row
    weights += cfg.linear_conv_kernel_dim * cfg.conv_dim * len(cfg.linear_layers)
    if logits:
        flops += 2 * cfg.hidden_size * cfg.vocab_size
        weights += cfg.hidden_size * cfg.vocab_size
    kv = 2 * cfg.num_key_value_heads * cfg.head_dim * (depth + n) * len(cfg.full_layers)
    state = 2 * 4 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    nbytes = (weights + kv) * elem_bytes + state * len(cfg.linear_layers)
    return Cost(flops, nbytes)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_s(fn, device: torch.device, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int, repeat: int = 9) -> float:
    """FLOP/s of an n x n x n product in ``dtype``, median of ``repeat``."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / _median_s(lambda: a @ b, device, repeat)


def copy_rate(device: torch.device, nbytes: int, repeat: int = 9) -> float:
    """(read + write) bytes per second of a device-to-device copy of ``nbytes``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return 2 * nbytes / _median_s(lambda: dst.copy_(src), device, repeat)
