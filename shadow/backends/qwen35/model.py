"""Qwen3.5's text forward (docs/model.md, "The forward") in torch, for one sequence at a time.

``Qwen35.forward(ids, state)`` continues ``state`` by ``ids``: it writes their KV rows at positions
``state.length ...``, advances the conv and recurrent state in place, and returns logits only for
the rows asked for. A prefill can therefore be split anywhere, and a caller that wants a fork
saves the conv and recurrent state (``ModelState.save_recurrent``) and puts them back after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, causal_lower_right

from . import weights as weights_mod
from .config import FULL, Qwen35Config
from .gdn import gated_delta_rule
from .state import ModelState

_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPE_NAMES)}") from None


def _rms_norm_1p(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's zero-centred RMSNorm: x / rms(x) * (1 + w), in fp32, back to x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + w.float())).to(x.dtype)


def _gated_rms_norm(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """The GDN output norm: plain weight, normalised in fp32, gated by silu(z) in fp32."""
    xf = x.float()
    n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return ((w * n) * F.silu(z.float())).to(x.dtype)


def _depthwise_conv(cols: torch.Tensor, weight: torch.Tensor, n: int) -> torch.Tensor:
    """The GDN's causal conv on the CPU: row t sums columns t+1 .. t+kernel of ``cols``, in fp32,
    in the fused kernel's order. Not F.conv1d: on the CPU that builds a oneDNN kernel for each new
    width and keeps it for the life of the process, so a server's heap grew with every new
    question length (``benchmarks/probes/shape_caches.py``)."""
    w = weight[:, 0, :].float()
    out = w[:, 0, None] * cols[:, 1:1 + n].float()
    for j in range(1, w.shape[1]):
        out = out + w[:, j, None] * cols[:, j + 1:j + 1 + n].float()
    return out.to(cols.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True, slots=True)
class _Linear:
    """Weights of one GDN layer, fetched once so the per-chunk path does no dict lookups."""

    norm_in: torch.Tensor
    norm_post: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    qkv: torch.Tensor
    z: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    conv: torch.Tensor  # [conv_dim, 1, kernel]
    norm: torch.Tensor
    neg_a: torch.Tensor  # -exp(A_log), fp32
    dt_bias: torch.Tensor


@dataclass(frozen=True, slots=True)
class _Full:
    norm_in: torch.Tensor
    norm_post: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor


class Qwen35:
    """A loaded Qwen3.5 text model. Build it with ``Qwen35.from_pretrained``."""

    def __init__(self, cfg: Qwen35Config, tensors: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, path: Path | None = None) -> None:
        self.config = cfg
        self.device = device
        self.dtype = dtype
        self.path = path
        self.embed = tensors["embed_tokens.weight"]
        self.final_norm = tensors["norm.weight"]
        self.lm_head = self.embed if cfg.tie_word_embeddings else tensors["lm_head.weight"]
        self.layers: list[_Linear | _Full] = []
        for i, kind in enumerate(cfg.layer_types):
            p = f"layers.{i}."
            common = dict(
                norm_in=tensors[p + "input_layernorm.weight"],
                norm_post=tensors[p + "post_attention_layernorm.weight"],
                gate=tensors[p + "mlp.gate_proj.weight"],
                up=tensors[p + "mlp.up_proj.weight"],
                down=tensors[p + "mlp.down_proj.weight"],
            )
            if kind == FULL:
                a = p + "self_attn."
                self.layers.append(_Full(
                    **common, q=tensors[a + "q_proj.weight"], k=tensors[a + "k_proj.weight"],
                    v=tensors[a + "v_proj.weight"], o=tensors[a + "o_proj.weight"],
                    q_norm=tensors[a + "q_norm.weight"], k_norm=tensors[a + "k_norm.weight"],
                ))
            else:
                g = p + "linear_attn."
                self.layers.append(_Linear(
                    **common, qkv=tensors[g + "in_proj_qkv.weight"], z=tensors[g + "in_proj_z.weight"],
                    a=tensors[g + "in_proj_a.weight"], b=tensors[g + "in_proj_b.weight"],
                    out=tensors[g + "out_proj.weight"], conv=tensors[g + "conv1d.weight"],
                    norm=tensors[g + "norm.weight"], neg_a=-tensors[g + "A_log"].float().exp(),
                    dt_bias=tensors[g + "dt_bias"],
                ))
        rd = cfg.rotary_dim
        # As transformers computes it (fp32 powers of a Python float base), so positions agree bit for bit.
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
        self.inv_freq = self.inv_freq.to(device)
        # "mask": SDPA with an explicit boolean mask (every backend, the CPU path);
        # "lower-right": SDPA with a bottom-right causal bias (CUDA: flash / memory-efficient kernels).
        self.attention = "lower-right" if device.type == "cuda" else "mask"

    @classmethod
    def from_pretrained(cls, path: str | Path, device: torch.device | str = "cpu",
                        dtype: torch.dtype | str = torch.float32) -> Qwen35:
        """Load a checkpoint folder (``config.json`` + safetensors). Every tensor is checked by name
        and shape before anything is computed; a bad checkpoint raises ``CheckpointError``."""
        path = Path(path)
        cfg = Qwen35Config.from_folder(path)
        dev = torch.device(device)
        dt = resolve_dtype(dtype)
        return cls(cfg, weights_mod.load(path, cfg, dev, dt), dev, dt, path)

    @cached_property
    def weights_hash(self) -> str:
        if self.path is None:
            raise ValueError("weights_hash needs a model loaded from a folder")
        return weights_mod.weights_hash(self.path, self.config)

    def new_state(self) -> ModelState:
        return ModelState.empty(self.config, self.device, self.dtype)

    # ---- the forward -------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, state: ModelState,
                logits_at: slice | Sequence[int] | torch.Tensor | None = None) -> torch.Tensor | None:
        """Continue ``state`` by ``ids`` (1-D LongTensor); logits (fp32) of the rows in ``logits_at``."""
        if ids.dim() != 1:
            raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
        n = ids.shape[0]
        start = state.length
        state.reserve(start + n)
        ids = ids.to(self.device)
        positions = torch.arange(start, start + n, device=self.device, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        mask = self._causal_mask(start, n)

        h = F.embedding(ids, self.embed)
        full_i = lin_i = 0
        eps = self.config.rms_norm_eps
        for layer in self.layers:
            x = _rms_norm_1p(h, layer.norm_in, eps)
            if isinstance(layer, _Full):
                h = h + self._attention(layer, x, state, full_i, start, cos, sin, mask)
                full_i += 1
            else:
                h = h + self._gdn(layer, x, state, lin_i)
                lin_i += 1
            x = _rms_norm_1p(h, layer.norm_post, eps)
            h = h + F.linear(F.silu(F.linear(x, layer.gate)) * F.linear(x, layer.up), layer.down)
        state.length = start + n
        if logits_at is None:
            return None
        rows = h[logits_at]
        return F.linear(_rms_norm_1p(rows, self.final_norm, eps), self.lm_head).float()

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits [T, vocab] of every position of a fresh forward over ``ids`` (no state in)."""
        out = self.forward(ids, self.new_state(), logits_at=slice(None))
        assert out is not None
        return out

    def _causal_mask(self, start: int, n: int) -> torch.Tensor | CausalBias:
        if self.attention == "lower-right":
            # The causal offset without a materialised mask: flash and memory-efficient kernels
            # take it as it is, with no per-shape plan to build, and a chunk's forward keeps no
            # shape decision on the Python side (what CUDA graphs per chunk will need).
            return causal_lower_right(n, start + n)
        keys = torch.arange(start + n, device=self.device)
        queries = torch.arange(start, start + n, device=self.device)
        return keys[None, :] <= queries[:, None]  # [n, start + n], True where a query may look

    def _attention(self, layer: _Full, x: torch.Tensor, state: ModelState, i: int, start: int,
                   cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | CausalBias) -> torch.Tensor:
        cfg = self.config
        n = x.shape[0]
        hd, rd = cfg.head_dim, cfg.rotary_dim
        qg = F.linear(x, layer.q).view(n, cfg.num_attention_heads, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(n, -1)
        q = _rms_norm_1p(q, layer.q_norm, cfg.rms_norm_eps)
        k = _rms_norm_1p(F.linear(x, layer.k).view(n, cfg.num_key_value_heads, hd), layer.k_norm,
                         cfg.rms_norm_eps)
        v = F.linear(x, layer.v).view(n, cfg.num_key_value_heads, hd)
        c, s = cos[:, None, :], sin[:, None, :]
        q = torch.cat((q[..., :rd] * c + _rotate_half(q[..., :rd]) * s, q[..., rd:]), dim=-1)
        k = torch.cat((k[..., :rd] * c + _rotate_half(k[..., :rd]) * s, k[..., rd:]), dim=-1)
        end = start + n
        state.k[i][start:end] = k
        state.v[i][start:end] = v
        keys = state.k[i][:end].permute(1, 0, 2)[None]  # [1, kv_heads, end, hd], no copy
        values = state.v[i][:end].permute(1, 0, 2)[None]
        out = F.scaled_dot_product_attention(
            q.permute(1, 0, 2)[None], keys, values, attn_mask=mask, scale=hd ** -0.5, enable_gqa=True,
        )
        out = out[0].permute(1, 0, 2).reshape(n, -1)
        return F.linear(out * torch.sigmoid(gate), layer.o)

    def _gdn(self, layer: _Linear, x: torch.Tensor, state: ModelState, i: int) -> torch.Tensor:
        cfg = self.config
        n = x.shape[0]
        qkv = F.linear(x, layer.qkv)  # [n, conv_dim], blocks [q | k | v]
        z = F.linear(x, layer.z)
        b = F.linear(x, layer.b)
        a = F.linear(x, layer.a)

        # Depthwise causal conv over the held columns and the new ones; the state keeps the last
        # `kernel` pre-conv inputs, exactly what transformers' cache holds.
        kernel = cfg.linear_conv_kernel_dim
        cols = torch.cat((state.conv[i], qkv.t().to(layer.conv.dtype)), dim=1)  # [conv_dim, kernel + n]
        state.conv[i].copy_(cols[:, -kernel:])
        if cols.is_cuda:  # cuDNN: the bits of transformers' own forward (results/gpu_model.json)
            mixed = F.conv1d(cols[None], layer.conv, groups=cfg.conv_dim)[0, :, 1:]  # [conv_dim, n]
        else:
            mixed = _depthwise_conv(cols, layer.conv, n)
        mixed = F.silu(mixed).to(x.dtype).t()

        kd, vd = cfg.key_dim, cfg.value_dim
        q = mixed[:, :kd].reshape(n, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        k = mixed[:, kd:2 * kd].reshape(n, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        v = mixed[:, 2 * kd:].reshape(n, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        beta = torch.sigmoid(b)
        g = layer.neg_a * F.softplus(a.float() + layer.dt_bias)
        o, new_state = gated_delta_rule(q, k, v, g, beta, state.recurrent[i])
        state.recurrent[i].copy_(new_state)
        o = _gated_rms_norm(o, z.view(n, cfg.linear_num_value_heads, -1), layer.norm, cfg.rms_norm_eps)
        return F.linear(o.reshape(n, vd), layer.out)
