"""The LM trunk shared by the policy, the value function and the reward model: inputs and masks, the frozen prefix
below LoRA adapters, one query pass shared by a question's samples, the LM head.

Token tensors use PAD = -1 (`lmprefs.data.tasks`) for padding, an id outside every vocabulary, as the original uses
50259 for GPT-2 (language/encodings.py:56): a sampled token can never be mistaken for padding. Before a forward pass
pads become token 0 and are masked out of attention, and position ids are the exclusive cumsum of the mask
(language/model.py:positions_for, l.265-269), so right-padded queries followed by responses act as contiguous text.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from lmprefs.data.tasks import PAD
from lmprefs.models.attention import sdpa_like
from lmprefs.models.flops import TOP_BLOCK_MODELS, response_columns
from lmprefs.models.loading import _trunk_names, hidden_size, trunk_blocks
from lmprefs.models.lora import LoRALinear

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def model_inputs(tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[B, L] tokens with PAD -> (input_ids, attention_mask, position_ids), pads masked and skipped in positions."""
    mask = tokens != PAD
    ids = torch.where(mask, tokens, torch.zeros_like(tokens))
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # exclusive cumsum of the mask
    return ids, mask.long(), positions


_CACHE_KEYWORDS: dict[type, str] = {}


def with_cache(module: nn.Module, cache) -> dict[str, Any]:
    """{keyword: cache} for a transformers forward (a trunk's or a block's): transformers 5.24 renamed
    `past_key_values` to `cache` (the old name warns, and is to go in 5.40); earlier versions take only the old one.
    Looked up once per class (torch.compile traces the lookup without a graph break)."""
    cls = type(module)
    name = _CACHE_KEYWORDS.get(cls)
    if name is None:
        name = _CACHE_KEYWORDS[cls] = "cache" if "cache" in inspect.signature(cls.forward).parameters else \
            "past_key_values"
    return {name: cache}


def cache_of(out) -> Any:
    """The KV cache a transformers forward returned: `cache` from 5.24 on (where reading `past_key_values` warns),
    `past_key_values` before."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def attention_mask(model, mask: Tensor) -> Tensor:
    """The mask to hand an uncached forward: for SDPA attention, the [B, 1, L, L] boolean mask (causal, pads never
    attended; a pad attends to itself so no softmax row is empty, and its output is never read) that transformers
    would build from the 2D one, built here because transformers first asks whether the 2D mask is all ones to skip
    it, a device-to-host sync in every training forward on a GPU. Other attention implementations get the 2D mask."""
    if not sdpa_like(model):
        return mask
    L = mask.shape[1]
    keys = torch.ones(L, L, dtype=torch.bool, device=mask.device).tril() & mask.bool()[:, None, None, :]
    return keys | torch.eye(L, dtype=torch.bool, device=mask.device)  # [B, 1, L, L]


def trunk_hidden(model, tokens: Tensor, prefix: FrozenPrefix | None = None) -> Tensor:
    """Last hidden states [B, L, d] of the model's transformer trunk (no LM head: we apply it only where needed).
    With a `prefix` computed on this model for these tokens, only the blocks above it run."""
    ids, mask, positions = model_inputs(tokens)
    mask = attention_mask(model, mask)
    if prefix is not None and prefix.model is model:
        with _only_blocks(model, prefix.start, None, from_hidden=True):
            out = model.base_model(inputs_embeds=prefix.hidden, attention_mask=mask, position_ids=positions,
                                   use_cache=False)  # fmt: skip
        return out.last_hidden_state
    out = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return out.last_hidden_state


# --------------------------------------------------------------------------------------------------------------
# The frozen prefix. With LoRA adapters in the top N blocks only (lora.layers), the blocks below are frozen and
# carry no adapter, so the policy, the reference (adapters off), the value and the reward adapters all compute the
# same hidden states there. A rollout computes them once and every later forward of the batch (reference, reward,
# 4 PPO epochs) runs the top N blocks only; reward-model training does the same over its labels for all epochs.


@dataclass
class FrozenPrefix:
    """Hidden states [B, L, d] entering block `start` of `model` for a batch of token rows (the residual stream,
    fp32). Valid for any adapter on `model`, and for rows that only differ by PAD after their last real token
    (truncation): attention is causal and pads are masked."""

    model: PreTrainedModel
    start: int
    hidden: Tensor

    def __getitem__(self, idx) -> FrozenPrefix:
        return FrozenPrefix(self.model, self.start, self.hidden[idx])

    def __len__(self) -> int:
        return self.hidden.shape[0]

    def columns(self, n: int) -> FrozenPrefix:
        """The prefix of each row's first n positions."""
        return FrozenPrefix(self.model, self.start, self.hidden[:, :n])

    @staticmethod
    def cat(parts: list[FrozenPrefix | None]) -> FrozenPrefix | None:
        """The prefixes of consecutive batches of rows as one (None if any batch kept none)."""
        if not parts or any(p is None for p in parts):
            return None
        first = cast(FrozenPrefix, parts[0])
        return FrozenPrefix(first.model, first.start, torch.cat([cast(FrozenPrefix, p).hidden for p in parts]))


def frozen_depth(model) -> int:
    """Number of bottom blocks that hold no LoRA adapter (0 without LoRA, or with adapters in every block)."""

    for i, block in enumerate(trunk_blocks(model)):
        if any(isinstance(m, LoRALinear) for m in block.modules()):
            return i
    return 0


class _ZeroPositions(nn.Module):
    """Stands in for GPT-2's position embedding when the input is already a residual stream (it holds them)."""

    def __init__(self, d: int):
        super().__init__()
        self.d = d

    def forward(self, position_ids: Tensor) -> Tensor:
        return torch.zeros(*position_ids.shape, self.d, device=position_ids.device)


@contextlib.contextmanager
def _only_blocks(model, lo: int, hi: int | None, *, from_hidden: bool = False, final_norm: bool = True):
    """Run the HF trunk over blocks lo..hi only: its block list is swapped for the slice for the duration (the HF
    forward then does its usual masks and rotary/position handling around them). from_hidden: inputs_embeds is a
    residual stream, so GPT-2's additive position embedding is skipped; final_norm=False returns the raw stream."""
    trunk = model.base_model
    blocks, norm, wpe = _trunk_names(model)
    saved = {blocks: trunk._modules[blocks], norm: trunk._modules[norm]}
    trunk._modules[blocks] = nn.ModuleList(list(saved[blocks])[lo:hi])
    if not final_norm:
        trunk._modules[norm] = nn.Identity()
    if from_hidden and wpe is not None:
        saved[wpe] = trunk._modules[wpe]
        trunk._modules[wpe] = _ZeroPositions(hidden_size(model))
    try:
        yield
    finally:
        trunk._modules.update(saved)


def frozen_prefix(model, tokens: Tensor) -> FrozenPrefix | None:
    """The frozen prefix of `model` for token rows [B, L] (PAD allowed), or None when every block is trainable.
    Run under the caller's autocast, like the forwards that will use it."""
    start = frozen_depth(model)
    if start == 0:
        return None
    ids, mask, positions = model_inputs(tokens)
    mask = attention_mask(model, mask)
    with torch.no_grad(), _only_blocks(model, 0, start, final_norm=False):
        out = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return FrozenPrefix(model, start, out.last_hidden_state)


def frozen_prefix_step(model, depth: int, **inputs) -> Tensor:
    """The residual stream entering block `depth` from one forward of the HF trunk on `inputs` (input ids, masks,
    positions, a KV cache: a sampler's decode step), the blocks from `depth` up not run."""
    with _only_blocks(model, 0, depth, final_norm=False):
        return model.base_model(**inputs).last_hidden_state


def shares_queries(model) -> bool:
    """Whether `shared_query_trunk` can run this model: it hands the HF forward ready-made 4D masks, which only the
    SDPA attention takes as they are (others rebuild the mask from the cache's length, which a run of the top blocks
    alone leaves at 0)."""
    return sdpa_like(model)


def shared_query_trunk(model, queries: Tensor, responses: Tensor, repeats: int, *, lo: int = 0, hi: int | None = None,
                       hidden: Tensor | None = None, final_norm: bool = True) -> Tensor:  # fmt: skip
    """trunk_hidden(model, cat(queries.repeat_interleave(k), responses)) [B * k, Q + T, d] for queries [B, Q] and
    responses [B * k, T] (row i * k + j answers query i), with each query run once: its keys and values are copied
    for its k responses, which then run on their own. A best-of-4 question's samples share their query, most of each
    row: in the summarization demo 76 of 108 tokens, so its reward model ran 47% of the tokens per epoch.
    Blocks lo..hi only; with lo > 0, `hidden` is the frozen prefix [B * k, Q + T, d] entering block lo (rows of one
    query alike over its first Q positions). final_norm=False returns the raw residual stream (a frozen prefix).
    Gradients flow through the copies back into the query's single pass."""
    B, Q = queries.shape
    k = repeats
    ids, mask, positions = model_inputs(torch.cat([queries.repeat_interleave(k, 0), responses], dim=1))
    masks = attention_mask(model, mask)  # [B * k, 1, L, L]: rows Q.. are the responses' view of every key
    if hidden is None:
        first, rest, key = ids[::k, :Q], ids[:, Q:], "input_ids"
    else:
        first, rest, key = hidden[::k, :Q], hidden[:, Q:], "inputs_embeds"
    with _only_blocks(model, lo, hi, from_hidden=hidden is not None, final_norm=final_norm):
        out = model.base_model(**{key: first}, attention_mask=masks[::k, :, :Q, :Q], position_ids=positions[::k, :Q],
                               use_cache=True)  # fmt: skip
        past = cache_of(out)
        past.batch_repeat_interleave(k)
        tail = model.base_model(**{key: rest}, attention_mask=masks[:, :, Q:], position_ids=positions[:, Q:],
                                **with_cache(model.base_model, past), use_cache=True)  # fmt: skip
    return torch.cat([out.last_hidden_state.repeat_interleave(k, 0), tail.last_hidden_state], dim=1)


def query_response_hidden(model, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None,
                          repeats: int = 1, read: Tensor | None = None) -> Tensor:  # fmt: skip
    """trunk_hidden(model, cat(queries.repeat_interleave(k), responses), prefix) [B * k, Q + T, d] for queries [B, Q]
    and responses [B * k, T], each query run once for its k responses where the attention allows. `read` [B * k, R]:
    only the hidden states at these positions [B * k, R, d] (distinct within a row), the top block computed there
    alone where it can (`top_block_at`)."""
    n = len(trunk_blocks(model))
    ours = prefix if prefix is not None and prefix.model is model else None
    lo = ours.start if ours is not None else 0
    top = read is not None and top_block_reads(model) and lo < n
    tokens = torch.cat([queries.repeat_interleave(repeats, 0), responses], dim=1)
    if repeats > 1 and shares_queries(model):
        h = shared_query_trunk(model, queries, responses, repeats, lo=lo, hi=n - 1 if top else None,
                               hidden=ours.hidden if ours is not None else None, final_norm=not top)  # fmt: skip
    elif top:
        with _only_blocks(model, 0, n - 1, final_norm=False):  # the prefix (if ours) is for blocks below n - 1
            h = trunk_hidden(model, tokens, ours)
    else:
        h = trunk_hidden(model, tokens, prefix)
    if read is None:
        return h
    if top:
        return top_block_at(model, h, read, tokens)
    return h.gather(1, read.unsqueeze(-1).expand(-1, -1, h.shape[-1]))


def frozen_prefix_shared(model, queries: Tensor, responses: Tensor, repeats: int) -> FrozenPrefix | None:
    """frozen_prefix(model, cat(queries.repeat_interleave(k), responses)) with each query run once
    (`shared_query_trunk`); falls back to the repeated rows where the model's attention cannot share."""
    start = frozen_depth(model)
    if start == 0:
        return None
    if not shares_queries(model):
        return frozen_prefix(model, torch.cat([queries.repeat_interleave(repeats, 0), responses], dim=1))
    with torch.no_grad():
        h = shared_query_trunk(model, queries, responses, repeats, hi=start, final_norm=False)
    return FrozenPrefix(model, start, h)


def lm_head(model) -> nn.Module:
    return model.get_output_embeddings()


def lm_logits(model, h: Tensor) -> Tensor:
    """The LM head on hidden states [..., d] -> logits [..., V'], V' >= the vocabulary: callers slice [..., :vocab].

    On CUDA a plain linear head whose row count is not a multiple of 64 (GPT-2's 50257) runs with its weight
    zero-padded to one, because cuBLAS then picks a tensor-core kernel ~6x faster: on an H100 in bf16, 512 x 768 x
    50257 ran at 96 TFLOP/s and 512 x 768 x 50304 at 598 (docs/results.md). The padded logits lie beyond the
    vocabulary and never reach a softmax. Elsewhere (the CPU, a wrapped head) the head runs as it is."""
    head = lm_head(model)
    pad = -head.weight.shape[0] % 64 if type(head) is nn.Linear else 0
    if not pad or not h.is_cuda:
        return head(h)
    w, b = cast(Tensor, head.weight), cast("Tensor | None", head.bias)  # a plain nn.Linear's (pad > 0)
    if torch.is_autocast_enabled("cuda"):  # cast before padding: half the bytes to copy
        w = w.to(torch.get_autocast_dtype("cuda"))
    b = None if b is None else nn.functional.pad(b, (0, pad))
    return nn.functional.linear(h, nn.functional.pad(w, (0, 0, 0, pad)), b)


def response_positions(queries: Tensor, T: int) -> Tensor:
    """[B, T] index of the hidden state that predicts each response token in query+response: the last real query
    token for the first, then Q+t-1. The original reads position Q-1 even when it is a pad (policy.py:121, its
    queries are right-padded), so a pad's output leaks into the first token; here padding is invisible."""
    B, Q = queries.shape
    last = (queries != PAD).long().cumsum(-1).argmax(-1)  # [B] index of the last real query token
    idx = torch.arange(Q - 1, Q + T - 1, device=queries.device).expand(B, T).clone()
    idx[:, 0] = last
    return idx


def response_hidden(model, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None,
                    repeats: int = 1) -> Tensor:  # fmt: skip
    """The hidden states [B, T, d] that predict each response token (and carry its value). repeats=k: queries
    [B / k, Q], each answered by k consecutive responses (`query_response_hidden`). The last response token is not
    run (`flops.response_columns`): no position read sees it."""
    T = responses.shape[1]
    idx = response_positions(queries.repeat_interleave(repeats, 0), T)
    keep = response_columns(T)
    if prefix is not None:
        prefix = prefix.columns(queries.shape[1] + keep)
    return query_response_hidden(model, queries, responses[:, :keep], prefix, repeats, read=idx)


def response_logits_hidden(model, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None,
                           repeats: int = 1) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Run query+response once; (hidden [B, T, d], logits [B, T, V]) at the positions predicting the response.
    The LM head runs only there: most of a sequence is query, and the head is the largest matmul."""
    h = response_hidden(model, queries, responses, prefix, repeats)
    return h, lm_logits(model, h)


# --------------------------------------------------------------------------------------------------------------
# The top block at the positions that are read. A reward model reads one position per row and the policy and value
# head the T that predict the response (in the quickstart 1 and 24 of a row's 56), but the top block's query, output
# projection and MLP run at every position. Above the top block nothing mixes positions, so its output elsewhere is
# never used: only its keys and values are, at every position.

def top_block_reads(model) -> bool:
    """Whether `top_block_at` runs this model's top block: a GPT-2 or Llama-style block (no norm on queries and keys)
    whose attention reads 4D masks as given, on the CPU, its weights whole (not FSDP's shards, which its forward
    would gather only inside the block's own call) and not inside torch.compile (a compiled forward runs the block
    whole, as `lmprefs.models.flops` counts it on a GPU)."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    blocks = trunk_blocks(model)
    attn = _attention(blocks[-1]) if kind in TOP_BLOCK_MODELS and len(blocks) > 1 else None
    if attn is None or hasattr(attn, "k_norm") or not sdpa_like(model) or torch.compiler.is_compiling():
        return False
    weights = list(blocks[-1].parameters())
    return all(w.device.type == "cpu" and type(w.data) is torch.Tensor for w in weights)


class _KeysAhead:
    """A KV cache stand-in for one attention call: given keys and values [N, Hkv, L', D] ahead of the call's own."""

    def __init__(self, keys: Tensor, values: Tensor):
        self.keys, self.values = keys, values

    def update(self, keys: Tensor, values: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        return torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2)


def _attention(block) -> Any:
    """A decoder block's self-attention module: `self_attn` in the Llama layout, `attn` in GPT-2's."""
    attn = getattr(block, "self_attn", None)
    return attn if attn is not None else getattr(block, "attn", None)


def top_block_at(model, h: Tensor, read: Tensor, tokens: Tensor) -> Tensor:
    """The final hidden states [N, R, d] at positions `read` [N, R] of rows `tokens` [N, L] (PAD allowed), given the
    residual stream h [N, L, d] entering the top block. The keys and values of the other positions are computed
    here and handed to the block's own forward, run on the read positions alone, as a cache; the attention mask
    follows them (causal by position, pads never attended). A GPT-2's keys and values come from its fused c_attn
    (adapters included), whose query third is then computed and dropped at those positions too."""
    block: Any = trunk_blocks(model)[-1]  # a GPT-2 or Llama-style decoder layer (top_block_reads)
    trunk, attn = model.base_model, _attention(block)
    N, L, d = h.shape
    _, mask, positions = model_inputs(tokens)
    full = attention_mask(model, mask)  # [N, 1, L, L]
    is_read = torch.zeros(N, L, dtype=torch.bool, device=h.device).scatter_(1, read, True)
    rest = torch.arange(L, device=h.device).expand(N, L)[~is_read].view(N, L - read.shape[1])  # [N, L - R]

    def at(x: Tensor, idx: Tensor) -> Tensor:
        return x.gather(1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))

    shape = (N, L - read.shape[1], -1, attn.head_dim)
    kwargs: dict[str, Any] = {}
    if hasattr(attn, "c_attn"):  # GPT-2: positions are in h already
        _, k, v = attn.c_attn(block.ln_1(at(h, rest))).split(attn.split_size, dim=2)
        k, v = k.reshape(shape).transpose(1, 2), v.reshape(shape).transpose(1, 2)
    else:
        cos, sin = trunk.rotary_emb(h, positions)  # [N, L, D]
        x = block.input_layernorm(at(h, rest))
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        k = rotary(k, k, at(cos, rest), at(sin, rest))[1]
        kwargs = {"position_ids": at(positions.unsqueeze(-1), read).squeeze(-1),
                  "position_embeddings": (at(cos, read), at(sin, read))}  # fmt: skip
    keys = torch.cat([rest, read], dim=1)  # the cache's key order
    m = at(full[:, 0], read).gather(2, keys.unsqueeze(1).expand(-1, read.shape[1], -1)).unsqueeze(1)  # [N,1,R,L]
    out = block(at(h, read), attention_mask=m, **with_cache(block, _KeysAhead(k, v)), **kwargs)
    final_norm = getattr(trunk, _trunk_names(model)[1])
    return final_norm(out[0] if isinstance(out, tuple) else out)
