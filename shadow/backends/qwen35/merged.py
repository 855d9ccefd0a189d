"""The fast path's weights: each layer's projections merged into one matrix per input (GDN: qkv, z,
b, a; attention: q with its gate, k, v; the MLP's gate and up), norms as fp32 ``1 + w``. The torch
forward's weights become slices of the merged ones, so the model holds one copy of each."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .model import Qwen35, _Full, _Linear


@dataclass(frozen=True, slots=True)
class GdnW:
    index: int  # among the GDN layers
    norm_in: torch.Tensor  # 1 + w, fp32
    norm_post: torch.Tensor
    w_in: torch.Tensor  # [qkv | z | b | a]
    conv: torch.Tensor  # [conv_dim, kernel]
    neg_a: torch.Tensor
    dt_bias: torch.Tensor
    norm: torch.Tensor
    out: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True, slots=True)
class FullW:
    index: int  # among the full-attention layers
    norm_in: torch.Tensor
    norm_post: torch.Tensor
    w_in: torch.Tensor  # [q|gate per head, k, v]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def one_plus(w: torch.Tensor) -> torch.Tensor:
    return (1.0 + w.float()).contiguous()



def merge(model: Qwen35) -> list[GdnW | FullW]:
    """Every layer's merged weights, in order; the model's own weights are pointed at them."""
    layers: list[GdnW | FullW] = []
    gdn_i = full_i = 0
    for layer in model.layers:
        common = dict(norm_in=one_plus(layer.norm_in), norm_post=one_plus(layer.norm_post),
                      gate_up=torch.cat((layer.gate, layer.up)).contiguous(), down=layer.down)
        if isinstance(layer, _Linear):
            layers.append(GdnW(
                index=gdn_i, w_in=torch.cat((layer.qkv, layer.z, layer.b, layer.a)).contiguous(),
                conv=layer.conv[:, 0, :].contiguous(), neg_a=layer.neg_a.float().contiguous(),
                dt_bias=layer.dt_bias, norm=layer.norm, out=layer.out, **common))
            gdn_i += 1
        else:
            assert isinstance(layer, _Full)
            layers.append(FullW(
                index=full_i, w_in=torch.cat((layer.q, layer.k, layer.v)).contiguous(),
                q_norm=one_plus(layer.q_norm), k_norm=one_plus(layer.k_norm), o=layer.o, **common))
            full_i += 1
    _share(model, layers)
    return layers


def _share(model: Qwen35, layers: list[GdnW | FullW]) -> None:
    """Point the torch forward's weights at slices of the merged ones, so the model holds one
    copy of each weight whichever path runs (slices of rows stay contiguous)."""
    cfg = model.config
    c, vd, hv = cfg.conv_dim, cfg.value_dim, cfg.linear_num_value_heads
    qn = cfg.num_attention_heads * 2 * cfg.head_dim
    kvn = cfg.num_key_value_heads * cfg.head_dim
    shared: list[_Linear | _Full] = []
    for layer, lw in zip(model.layers, layers, strict=True):
        inter = lw.down.shape[1]
        mlp = dict(gate=lw.gate_up[:inter], up=lw.gate_up[inter:])
        if isinstance(layer, _Linear):
            w = lw.w_in
            shared.append(replace(layer, qkv=w[:c], z=w[c:c + vd], b=w[c + vd:c + vd + hv],
                                  a=w[c + vd + hv:], **mlp))
        else:
            w = lw.w_in
            shared.append(replace(layer, q=w[:qn], k=w[qn:qn + kvn], v=w[qn + kvn:], **mlp))
    model.layers = shared
