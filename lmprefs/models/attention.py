"""The attention every lmprefs model runs: transformers' SDPA attention, except on the CPU for short sequences, where
transformers' eager attention is taken instead, computed per group of query heads that share a key-value head.

On the CPU PyTorch's fused (flash) kernel is slow for the short rows lmprefs trains and samples, above all its
backward under bf16 autocast, and for a decode step over the static cache; for rows of a few hundred tokens it is the
faster one (`benchmarks/cpu_attention.py`; docs/results.md, "Attention on the CPU"). The eager form is transformers'
`eager_attention_forward`: QK^T and AV in the autocast dtype, the softmax in fp32. Here the query heads of a group
are stacked against their one key-value head instead of copying it per head (`repeat_kv`), and the mask is the
boolean one lmprefs and transformers' `sdpa_mask` build, so both implementations read the same masks.

On a GPU, a compiled decode step (one query position over a static cache) takes `decode_attention`, written as
products and sums that inductor fuses into passes that read the cached keys and values once each: the fused SDPA
kernels are built for many query positions and ran a decode step at batch 512 in about 2.6x the time its keys' and
values' bytes need on an H100 (`benchmarks/gpu_kernels.py`; docs/results.md, "GPU").

It is registered with transformers under `NAME` (`use`); a model's config keeps its attention name out of
config.json, so saved models load in plain transformers with their own default.
"""

from __future__ import annotations

import torch
from torch import Tensor

NAME = "lmprefs_sdpa"
SDPA_LIKE = ("sdpa", NAME)
"""Attention implementations that read 4D boolean masks as they are."""
SHORT = 128 * 128
"""Query positions x key positions at or below which the CPU takes the eager form, with at most `MAX_KEYS` keys: the
measured crossovers lie between 128 and 256 tokens of a full sequence and between 512 and 1,024 keys of a decode
step."""
MAX_KEYS = 512

_UNSUPPORTED = ("softcap", "position_bias", "s_aux", "cache")

FUSED_DECODE = True
"""Whether a compiled decode step on a GPU takes `decode_attention` (benchmarks switch it off to compare)."""


def short(q_len: int, k_len: int) -> bool:
    """Whether q_len query positions over k_len keys are short enough for the eager form on the CPU."""
    return q_len * k_len <= SHORT and k_len <= MAX_KEYS


def _ours(key: Tensor, mask: Tensor | None, dropout: float, kwargs: dict) -> bool:
    """Whether lmprefs' own forms can compute this call: a boolean mask of the keys' length, no dropout and none of
    the options only transformers' kernels know."""
    return (mask is not None and mask.dtype == torch.bool and mask.shape[-1] == key.shape[2] and not dropout
            and all(kwargs.get(k) is None for k in _UNSUPPORTED))  # fmt: skip


def eager_on_cpu(query: Tensor, key: Tensor, mask: Tensor | None, dropout: float = 0.0, **kwargs) -> bool:
    """Whether `attention` computes these inputs in the eager form: on the CPU, short rows (and `_ours`)."""
    return query.device.type == "cpu" and short(query.shape[2], key.shape[2]) and _ours(key, mask, dropout, kwargs)


def fused_decode(query: Tensor, key: Tensor, mask: Tensor | None, dropout: float = 0.0, **kwargs) -> bool:
    """Whether `attention` takes `decode_attention`: one query position on a GPU inside torch.compile (eager, its
    broadcast products would be materialized), and `_ours`."""
    return (FUSED_DECODE and query.device.type == "cuda" and query.shape[2] == 1 and torch.compiler.is_compiling()
            and _ours(key, mask, dropout, kwargs))  # fmt: skip


def decode_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scaling: float) -> Tensor:
    """`grouped_attention` for one query position, as broadcast products and sums with fp32 accumulation:
    query [B, H, 1, D], key and value [B, Hkv, L, D], mask [B or 1, 1 or H, 1, L] -> [B, 1, H, D]."""
    B, H, _, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    G = H // Hkv
    q = query.reshape(B, Hkv, G, 1, D)
    scores = (q * key[:, :, None]).float().sum(-1) * scaling  # [B, Hkv, G, L]
    per_head = mask.shape[1] > 1
    m = mask.reshape(mask.shape[0], Hkv if per_head else 1, G if per_head else 1, L)
    scores = scores.masked_fill(~m, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)  # [B, Hkv, G, L]
    out = (probs[..., None] * value[:, :, None].float()).sum(-2)  # [B, Hkv, G, D]
    return out.to(value.dtype).view(B, 1, H, D)


def grouped_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scaling: float) -> Tensor:
    """softmax(QK^T * scaling, masked) V with the query heads of a group stacked on their key-value head.
    query [B, H, Lq, D], key and value [B, Hkv, L, D], mask [B or 1, 1 or H, Lq, L] (True: attend) -> [B, Lq, H, D].
    Matmuls in the autocast dtype where autocast is on, scores and softmax in fp32; a row with every key masked gets
    the uniform average (never read, and never NaN)."""
    B, H, Lq, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    G = H // Hkv
    q = query.reshape(B, Hkv, G * Lq, D)  # head kv * G + g, repeat_kv's order
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scaling  # [B, Hkv, G * Lq, L]
    m = mask[:, :, None] if mask.shape[1] == 1 else mask.reshape(mask.shape[0], Hkv, G, Lq, L)
    scores = scores.view(B, Hkv, G, Lq, L).masked_fill(~m, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores.view(B, Hkv, G * Lq, L), dim=-1)
    out = torch.matmul(probs.to(value.dtype), value)  # [B, Hkv, G * Lq, D]
    return out.view(B, H, Lq, D).transpose(1, 2).contiguous()


def attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, *,
              dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
              **kwargs) -> tuple[Tensor, None]:  # fmt: skip
    """transformers' attention interface: (output [B, Lq, H, D], no weights)."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if eager_on_cpu(query, key, attention_mask, dropout, **kwargs):
        return grouped_attention(query, key, value, attention_mask, scale), None  # type: ignore[arg-type]
    if fused_decode(query, key, attention_mask, dropout, **kwargs):
        return decode_attention(query, key, value, attention_mask, scale), None  # type: ignore[arg-type]
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)  # fmt: skip


def register() -> None:
    """Make `NAME` known to transformers, with SDPA's mask builder."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use(model) -> None:
    """Run `model`'s attention through `attention` where it runs SDPA."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        register()
        model.set_attn_implementation(NAME)


def sdpa_like(model) -> bool:
    """Whether the model's attention reads 4D boolean masks as they are (SDPA, or `NAME` on top of it)."""
    return getattr(model.config, "_attn_implementation", None) in SDPA_LIKE
