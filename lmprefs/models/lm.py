"""Language-model plumbing shared by the policy, the value function and the reward model.

Token tensors use PAD = -1 for padding, an id outside every vocabulary, as the original uses 50259 for GPT-2
(language/encodings.py:56): a sampled token can never be mistaken for padding. Before a forward pass pads become
token 0 and are masked out of attention, and position ids are the exclusive cumsum of the mask
(language/model.py:positions_for, l.265-269), so right-padded queries followed by responses act as contiguous text.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

PAD = -1


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        from lmprefs.errors import UserError

        raise UserError(f"device {name!r}: CUDA is not available here (torch {torch.__version__}); use cpu or auto")
    return torch.device(name)


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX). Without it bf16 is emulated: on this
    project's Intel Xeon @ 2.80GHz (AVX-512, no BF16) a 1024^3 bf16 matmul ran at 61 GFLOP/s against 184 in fp32
    (2 threads, 2026-11-22), while on an AMD EPYC with AVX512-BF16 bf16 autocast made PPO 1.7x faster (2026-11-21)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", flags) is not None


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype: auto = bf16 where it is fast (CUDA with bf16, a CPU with native bf16), float32 elsewhere,
    unless LMPREFS_AUTO_DTYPE names what auto means (the test suite runs once in each, whatever the CPU)."""
    if name == "auto" and os.environ.get("LMPREFS_AUTO_DTYPE"):
        name = os.environ["LMPREFS_AUTO_DTYPE"]
        if name not in ("float32", "bfloat16"):
            from lmprefs.errors import UserError

            raise UserError(f"LMPREFS_AUTO_DTYPE={name!r} (environment): expected float32 or bfloat16")
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if device.type == "cpu" and cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for forward passes; a no-op for float32. Parameters and optimizer state stay fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def load_lm(name: str, device: torch.device | str = "cpu"):
    """(model, tokenizer) for an asset name, a local HF directory or a hub name; dropout off, eval mode, fp32.

    Dropout is switched off in the config (the original builds every forward with do_dropout=False), not by
    remembering .eval(): HF GPT-2 defaults to 0.1.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from lmprefs.assets import MODEL_ASSETS as MODEL_NAMES
    from lmprefs.assets import AssetError, resolve_model

    path = resolve_model(name)
    hf_logging.disable_progress_bar()  # "Loading weights" bars on every load drown the run's own progress
    hf_logging.set_verbosity_error()
    try:
        cfg = AutoConfig.from_pretrained(path)
    except OSError as e:  # a hub name with no hub, or a typo
        raise AssetError(f"model {name!r} is not an asset ({', '.join(MODEL_NAMES)}), a local directory, or a "
                         f"reachable hub model ({str(e).splitlines()[0][:120]})") from None
    for key in list(cfg.to_dict()):
        if ("dropout" in key or "pdrop" in key) and isinstance(getattr(cfg, key, None), float):
            setattr(cfg, key, 0.0)
    if getattr(cfg, "activation_function", None) == "gelu_new":
        # GPT-2's GELU is the tanh approximation (the original's model.py:gelu); HF's "gelu_new" spells it as five
        # elementwise ops in Python, "gelu_pytorch_tanh" as one kernel: the same function (|dlogprob| ~1e-6), ~5%
        # faster PPO steps on the benchmark's GPT-2
        cfg.activation_function = "gelu_pytorch_tanh"
    source_dtype = getattr(cfg, "dtype", None)  # as published, before loading in fp32 rewrites the config
    if isinstance(source_dtype, str):
        source_dtype = getattr(torch, source_dtype, None)
    model = AutoModelForCausalLM.from_pretrained(path, config=cfg, dtype=torch.float32).to(device).eval()
    # exports of merged models go back to it (export_dtype)
    model.source_dtype = source_dtype if isinstance(source_dtype, torch.dtype) else torch.float32
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


def vocab_size(tokenizer) -> int:
    """Real vocabulary size: logits beyond it (embedding padding) are never sampled."""
    return len(tokenizer)


def max_positions(model) -> int:
    c = model.config
    return int(getattr(c, "n_positions", None) or getattr(c, "max_position_embeddings", 1 << 30))


def hidden_size(model) -> int:
    return int(model.config.hidden_size)


def model_inputs(tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[B, L] tokens with PAD -> (input_ids, attention_mask, position_ids), pads masked and skipped in positions."""
    mask = tokens != PAD
    ids = torch.where(mask, tokens, torch.zeros_like(tokens))
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # exclusive cumsum of the mask
    return ids, mask.long(), positions


def attention_mask(model, mask: Tensor) -> Tensor:
    """The mask to hand an uncached forward: for SDPA attention, the [B, 1, L, L] boolean mask (causal, pads never
    attended; a pad attends to itself so no softmax row is empty, and its output is never read) that transformers
    would build from the 2D one, built here because transformers first asks whether the 2D mask is all ones to skip
    it, a device-to-host sync in every training forward on a GPU. Other attention implementations get the 2D mask."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
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

    model: nn.Module
    start: int
    hidden: Tensor

    def __getitem__(self, idx) -> FrozenPrefix:
        return FrozenPrefix(self.model, self.start, self.hidden[idx])

    def __len__(self) -> int:
        return self.hidden.shape[0]


def _trunk_names(model) -> tuple[str, str, str | None]:
    """(blocks, final norm, additive position embedding or None) attribute names of a Llama- or GPT-2-style trunk."""
    trunk = model.base_model
    blocks = "layers" if hasattr(trunk, "layers") else "h"
    norm = "norm" if hasattr(trunk, "norm") else "ln_f"
    return blocks, norm, "wpe" if hasattr(trunk, "wpe") else None


def trunk_blocks(model) -> nn.ModuleList:
    """The transformer blocks of a Llama- or GPT-2-style trunk, bottom first."""
    return getattr(model.base_model, _trunk_names(model)[0])


def frozen_depth(model) -> int:
    """Number of bottom blocks that hold no LoRA adapter (0 without LoRA, or with adapters in every block)."""
    from lmprefs.models.lora import LoRALinear

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


def shares_queries(model) -> bool:
    """Whether `shared_query_trunk` can run this model: it hands the HF forward ready-made 4D masks, which only the
    SDPA attention takes as they are (others rebuild the mask from the cache's length, which a run of the top blocks
    alone leaves at 0)."""
    return getattr(model.config, "_attn_implementation", None) == "sdpa"


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
        past = out.past_key_values
        past.batch_repeat_interleave(k)
        tail = model.base_model(**{key: rest}, attention_mask=masks[:, :, Q:], position_ids=positions[:, Q:],
                                past_key_values=past, use_cache=True)  # fmt: skip
    return torch.cat([out.last_hidden_state.repeat_interleave(k, 0), tail.last_hidden_state], dim=1)


def query_response_hidden(model, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None,
                          repeats: int = 1) -> Tensor:  # fmt: skip
    """trunk_hidden(model, cat(queries.repeat_interleave(k), responses), prefix) [B * k, Q + T, d] for queries [B, Q]
    and responses [B * k, T], each query run once for its k responses where the attention allows."""
    if repeats > 1 and shares_queries(model):
        ours = prefix is not None and prefix.model is model
        return shared_query_trunk(model, queries, responses, repeats, lo=prefix.start if ours else 0,
                                  hidden=prefix.hidden if ours else None)  # fmt: skip
    return trunk_hidden(model, torch.cat([queries.repeat_interleave(repeats, 0), responses], dim=1), prefix)


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
    w, b = head.weight, head.bias
    if torch.is_autocast_enabled("cuda"):  # cast before padding: half the bytes to copy
        w = w.to(torch.get_autocast_dtype("cuda"))
    b = None if b is None else nn.functional.pad(b, (0, pad))
    return nn.functional.linear(h, nn.functional.pad(w, (0, 0, 0, pad)), b)


class ScalarHead(nn.Module):
    """A linear map d -> 1 (language/model.py:fc_layer). Value heads start at 0; reward heads at N(0, 1/sqrt(d+1))."""

    def __init__(self, d: int, init_std: float, seed: int | None = None):
        super().__init__()
        self.linear = nn.Linear(d, 1)
        # a generator of its own: the draw must not depend on what else ran in the process before
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            self.linear.weight.normal_(0.0, init_std, generator=g) if init_std > 0 else self.linear.weight.zero_()
            self.linear.bias.zero_()

    def forward(self, h: Tensor) -> Tensor:  # [..., d] -> [...]
        return self.linear(h.to(self.linear.weight.dtype)).squeeze(-1)


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
    [B / k, Q], each answered by k consecutive responses (`query_response_hidden`)."""
    h = query_response_hidden(model, queries, responses, prefix, repeats)
    idx = response_positions(queries.repeat_interleave(repeats, 0), responses.shape[1])
    return h.gather(1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))


def response_logits_hidden(model, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None,
                           repeats: int = 1) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Run query+response once; (hidden [B, T, d], logits [B, T, V]) at the positions predicting the response.
    The LM head runs only there: most of a sequence is query, and the head is the largest matmul."""
    h = response_hidden(model, queries, responses, prefix, repeats)
    return h, lm_logits(model, h)


def logprobs_and_entropy(logits: Tensor, tokens: Tensor, temperature: float, vocab: int) -> tuple[Tensor, Tensor]:
    """log pi(token) and the entropy of pi at the sampling temperature, over the real vocabulary; [B, T] each."""
    logp = torch.log_softmax(logits[..., :vocab].float() / temperature, dim=-1)
    lp = logp.gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return lp, entropy


class Policy(nn.Module):
    """The policy LM and its value function (policy.py): a zero-init value head on the same trunk (the original),
    or, with value_model='separate', a second trunk with its own head (the later summarization work).
    With LoRA, `lm` is the shared frozen base and `adapter` / `value_adapter` name this policy's adapters on it.
    """

    def __init__(self, lm, tokenizer, temperature: float, value_lm=None, adapter: str | None = None,
                 value_adapter: str | None = None):  # fmt: skip
        super().__init__()
        self.lm, self.tokenizer, self.temperature = lm, tokenizer, temperature
        self.value_lm, self.adapter, self.value_adapter = value_lm, adapter, value_adapter
        self.value_head = ScalarHead(hidden_size(lm), init_std=0.0)
        self.vocab = vocab_size(tokenizer)

    def forward(self, queries: Tensor, responses: Tensor,
                prefix: FrozenPrefix | None = None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """(logprobs, values, entropy), each [B, T], for responses given queries."""
        from lmprefs.models.lora import using

        with using(self.lm, self.adapter):
            h, logits = response_logits_hidden(self.lm, queries, responses, prefix)
        logprobs, entropy = logprobs_and_entropy(logits, responses, self.temperature, self.vocab)
        if self.value_adapter is not None:
            with using(self.lm, self.value_adapter):
                h = response_hidden(self.lm, queries, responses, prefix)
        elif self.value_lm is not None:
            h = response_hidden(self.value_lm, queries, responses)
        return logprobs, self.value_head(h), entropy

    def values_from(self, queries: Tensor, responses: Tensor, hidden: Tensor,
                    prefix: FrozenPrefix | None = None) -> Tensor:  # fmt: skip
        """Values [B, T] given the policy trunk's hidden states at the response positions (from the sampler);
        a separate value trunk runs its own forward."""
        from lmprefs.models.lora import using

        if self.value_adapter is not None:
            with using(self.lm, self.value_adapter):
                hidden = response_hidden(self.lm, queries, responses, prefix)
        elif self.value_lm is not None:
            hidden = response_hidden(self.value_lm, queries, responses)
        return self.value_head(hidden)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The value head and the trunk, or only this policy's adapters when the trunk is a shared LoRA base."""
        from lmprefs.models.lora import lora_modules

        if self.adapter is None:
            return [p for p in self.parameters() if p.requires_grad]
        names = {self.adapter, self.value_adapter} - {None}
        adapters = [m[n] for mod in lora_modules(self.lm) for m in (mod.A, mod.B) for n in names]
        return adapters + list(self.value_head.parameters())

    def value_parameters(self) -> list[nn.Parameter]:
        """What the value model alone trains: its head and, when separate, its trunk or adapter (these take no
        gradient from the policy loss, and a separate value model has an optimizer of its own)."""
        from lmprefs.models.lora import lora_modules

        head = list(self.value_head.parameters())
        if self.value_adapter is not None:
            return [m[self.value_adapter] for mod in lora_modules(self.lm) for m in (mod.A, mod.B)] + head
        if self.value_lm is not None:
            return [p for p in self.value_lm.parameters() if p.requires_grad] + head
        return head


class RewardModel(nn.Module):
    """A trunk plus a scalar head read at the last real token, then reward = gain * r + bias (rewards.py:47-57)."""

    def __init__(self, lm, tokenizer, adapter: str | None = None, seed: int | None = None):
        super().__init__()
        self.lm, self.tokenizer, self.adapter = lm, tokenizer, adapter
        d = hidden_size(lm)
        self.head = ScalarHead(d, init_std=1.0 / (d + 1) ** 0.5, seed=seed)
        self.gain = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None,
                repeats: int = 1) -> Tensor:  # fmt: skip
        """Rewards [B] of query+response; responses may end in PAD after truncation. repeats=k: queries [B / k, Q]
        each answered by k consecutive responses (a best-of-k question), run once per query where the attention
        allows (`shared_query_trunk`)."""
        from lmprefs.models.lora import using

        tokens = torch.cat([queries.repeat_interleave(repeats, 0), responses], dim=1)
        with using(self.lm, self.adapter):
            h = query_response_hidden(self.lm, queries, responses, prefix, repeats)  # [B, L, d]
        last = (tokens != PAD).long().cumsum(-1).argmax(-1)  # index of the last real token
        r = self.head(h[torch.arange(h.shape[0], device=h.device), last])
        return self.gain * r + self.bias

    def trainable_parameters(self) -> list[nn.Parameter]:
        from lmprefs.models.lora import lora_modules

        extra = [self.gain, self.bias, *self.head.parameters()]
        if self.adapter is None:
            return [p for p in self.lm.parameters() if p.requires_grad] + extra
        return [m[self.adapter] for mod in lora_modules(self.lm) for m in (mod.A, mod.B)] + extra

    def freeze(self) -> RewardModel:
        """Stop training this reward model's own parameters; with LoRA the policy's adapters on the same base
        are left alone."""
        for p in self.trainable_parameters():
            p.requires_grad_(False)
        return self

    @torch.no_grad()
    def set_norm(self, mean: float, std: float, target_mean: float = 0.0, target_std: float = 1.0) -> None:
        """Given the current rewards' mean and std, set gain and bias so they become (target_mean, target_std)
        (rewards.py:set_reward_norm). `mean`/`std` are of rewards computed with the current gain/bias."""
        # raw r has mean (mean - bias)/gain and std std/gain; solve for the new gain/bias
        g, b = float(self.gain), float(self.bias)
        raw_mean, raw_std = (mean - b) / g, std / abs(g)
        new_gain = target_std / raw_std
        self.gain.fill_(new_gain)
        self.bias.fill_(target_mean - new_gain * raw_mean)


# --------------------------------------------------------------------------------------------------------------
# Saving and loading: a standard HF directory plus the head as safetensors and a small JSON


def plain_copy(module: Policy | RewardModel, state: dict) -> Policy | RewardModel:
    """An unsharded Policy or RewardModel shaped like `module` (e.g. one sharded by FSDP) holding `state`, a whole
    state dict of it (as lmprefs.distributed.full_state_dict gathers on rank 0), for saving with the usual writers.
    Built on the meta device and filled with `state`'s own tensors: no second copy of the weights."""

    def empty(lm):
        if lm is None:
            return None
        with torch.device("meta"):
            twin = type(lm)(lm.config)
        twin.generation_config = lm.generation_config
        return twin

    if isinstance(module, Policy):
        twin = Policy(empty(module.lm), module.tokenizer, module.temperature, value_lm=empty(module.value_lm))
    else:
        twin = RewardModel(empty(module.lm), module.tokenizer)
    twin.load_state_dict(state, assign=True)
    for lm in (twin.lm, getattr(twin, "value_lm", None)):
        if lm is not None and getattr(lm.config, "tie_word_embeddings", False):
            lm.tie_weights()
    return twin.eval()


def atomic_dir(out: Path, meta: dict | None = None, keep: int = 0):
    """Yield a temporary sibling to write into; on success it becomes `out` with a manifest, so readers never see
    half a model nor no model (lmprefs.checkpoint.publish_dir: `out` is a symlink to a versioned directory)."""
    from lmprefs.checkpoint import publish_dir

    return publish_dir(out, meta, keep)


def verified(path: Path) -> Path:
    """`path` after checking its manifest (directories written before manifests existed load unchecked)."""
    from lmprefs.checkpoint import MANIFEST, verify

    path = Path(path)
    if (path / MANIFEST).is_file():
        verify(path)
    return path


def save_policy(policy: Policy, out: Path, merged: bool = True) -> None:
    with atomic_dir(out) as tmp:
        _save_policy(policy, tmp, merged)


def _save_policy(policy: Policy, out: Path, merged: bool = False) -> None:
    """A policy directory. Full fine-tuning: a Hugging Face model directory (AutoModelForCausalLM loads it).
    LoRA: the adapters in peft's format under adapter/ (and value_adapter/), which PeftModel.from_pretrained(base,
    DIR/adapter) loads onto the initial model; with `merged`, also the merged model at the top (written once, for
    the final policy: checkpoints hold adapters only). Both: value_head.safetensors, generation_config.json (the
    training temperature, do_sample=True, top_k=0: the distribution PPO trained), lmprefs.json."""
    import json

    from safetensors.torch import save_file

    from lmprefs.models.lora import merged_copy, save_peft_adapter

    if policy.adapter:
        save_peft_adapter(policy.lm, policy.adapter, out / "adapter")
        if policy.value_adapter is not None:
            save_peft_adapter(policy.lm, policy.value_adapter, out / "value_adapter")
        if merged:  # in the base model's published dtype: an export to sample from, not training state
            _save_lm(merged_copy(policy.lm, policy.adapter).to(export_dtype(policy.lm)), out, policy.temperature)
    else:
        _save_lm(policy.lm, out, policy.temperature)
        if policy.value_lm is not None:
            policy.value_lm.save_pretrained(out / "value_model")
    policy.tokenizer.save_pretrained(out)
    save_file({k: v.detach().cpu().contiguous() for k, v in policy.value_head.state_dict().items()},
              out / "value_head.safetensors")  # fmt: skip
    (out / "lmprefs.json").write_text(json.dumps({"kind": "policy", "temperature": policy.temperature}))


def _save_lm(lm, out: Path, temperature: float) -> None:
    from transformers import GenerationConfig

    saved = lm.generation_config
    # top_k=0: transformers samples from the top 50 by default; PPO trained (and lmprefs samples) the whole
    # distribution at this temperature. Responses have a fixed length in training: no EOS stop there.
    lm.generation_config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                            bos_token_id=saved.bos_token_id, eos_token_id=saved.eos_token_id,
                                            pad_token_id=saved.pad_token_id)  # fmt: skip
    try:
        lm.save_pretrained(out)
    finally:
        lm.generation_config = saved


def load_policy(path: Path, device: torch.device | str = "cpu", temperature: float | None = None) -> Policy:
    """A saved policy: its merged model, or (adapter-only directories, e.g. a checkpoint's) the initial model with
    its peft adapters merged in."""
    import json

    from safetensors.torch import load_file

    path = verified(path)
    meta = json.loads((path / "lmprefs.json").read_text())
    if (path / "config.json").is_file():
        lm, tok = load_lm(str(path), device)
    else:
        lm, tok = _load_merged_adapter(path / "adapter", device)
    value_lm = None
    if (path / "value_model").exists():
        value_lm = load_lm(str(path / "value_model"), device)[0]
    elif (path / "value_adapter").exists():
        value_lm = _load_merged_adapter(path / "value_adapter", device)[0]
    p = Policy(lm, tok, temperature if temperature is not None else meta["temperature"], value_lm=value_lm)
    p.value_head.load_state_dict(load_file(path / "value_head.safetensors"))
    return p.to(device)


def _load_merged_adapter(adapter_dir: Path, device):
    import json

    from peft import PeftModel

    base = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    lm, tok = load_lm(base, device)
    return PeftModel.from_pretrained(lm, str(adapter_dir)).merge_and_unload().eval(), tok


def save_reward_model(rm: RewardModel, out: Path, extra: dict | None = None, merged: bool = True) -> None:
    with atomic_dir(out) as tmp:
        _save_reward_model(rm, tmp, extra, merged)


def _save_reward_model(rm: RewardModel, out: Path, extra: dict | None, merged: bool = True) -> None:
    """A standard sequence-classification directory: AutoModelForSequenceClassification.from_pretrained(DIR) gives
    lmprefs' rewards (num_labels=1, read at the last non-pad token; see to_sequence_classifier), plus the tokenizer
    and lmprefs.json (the task it was trained for, its training summary). A LoRA reward model with `merged` off is
    saved as its adapter instead, in peft's format for a sequence classifier (the score head and, where it holds the
    folded constant, the final norm as modules_to_save): AutoModelForSequenceClassification.from_pretrained(DIR,
    num_labels=1) loads the base model and the adapter and gives the same rewards, at ~1% of the size."""
    import json

    from lmprefs.models.lora import merged_copy, save_peft_adapter

    meta = {"kind": "reward_model", **(extra or {})}
    if rm.adapter and not merged:
        tensors, const = score_head_tensors(rm.lm, rm)
        save_peft_adapter(rm.lm, rm.adapter, out, task_type="SEQ_CLS", extra=tensors)
        if const is not None:
            meta["score_bias"] = const
    else:
        lm = merged_copy(rm.lm, rm.adapter) if rm.adapter else rm.lm
        seq = to_sequence_classifier(lm, rm)
        seq.to(export_dtype(rm.lm)).save_pretrained(out)
    rm.tokenizer.save_pretrained(out)
    (out / "lmprefs.json").write_text(json.dumps(meta, indent=1))


def export_dtype(lm) -> torch.dtype:
    """The dtype an exported (merged) model is written in: the one the initial model was published in (load_lm
    trains in fp32 and records it), so a bf16 base is not saved as an fp32 copy twice its size."""
    return getattr(lm, "source_dtype", None) or torch.float32


@torch.no_grad()
def score_head_tensors(lm, rm: RewardModel) -> tuple[dict[str, Tensor], float | None]:
    """The sequence classifier's own tensors for rm, named as in XForSequenceClassification, and the constant left
    over (None when folded in). score.weight = gain * w; the constant c = gain * b + bias is folded into the final
    norm's bias along w (w . (h + c w / |w|^2) = w . h + c): exact for trunks whose final norm has a bias (GPT-2).
    Llama-style RMSNorm has none; there c is returned, for lmprefs to add back (other readers see an offset)."""
    w = (rm.gain * rm.head.linear.weight).detach().float().cpu()  # [1, d]; written from the CPU, rm may be on a GPU
    c = float(rm.gain * rm.head.linear.bias + rm.bias)
    out = {"score.weight": w}
    norm_name = _trunk_names(lm)[1]
    name, norm = f"{lm.base_model_prefix}.{norm_name}", getattr(lm.base_model, norm_name)
    if getattr(norm, "bias", None) is None:
        return out, c
    out[f"{name}.weight"] = norm.weight.detach().cpu().clone()
    out[f"{name}.bias"] = norm.bias.detach().cpu() + (c * w[0] / (w[0] @ w[0])).to(norm.bias.dtype)
    return out, None


@torch.no_grad()
def to_sequence_classifier(lm, rm: RewardModel):
    """`lm`'s trunk with rm's head as a transformers XForSequenceClassification (num_labels=1) computing
    gain * (w . h + b) + bias at the last real token (score_head_tensors: the constant folded into the final norm
    where it has a bias, else kept in the config as `lmprefs_score_bias`, which lmprefs adds back)."""
    import copy

    from transformers import AutoModelForSequenceClassification

    cfg = copy.deepcopy(lm.config)
    cfg.num_labels, cfg.problem_type = 1, "regression"
    cfg.architectures = None
    if cfg.pad_token_id is None:  # the HF classifier finds the last real token as the rightmost non-pad id
        cfg.pad_token_id = rm.tokenizer.pad_token_id if rm.tokenizer.pad_token_id is not None else cfg.eos_token_id
    seq = AutoModelForSequenceClassification.from_config(cfg, dtype=next(lm.parameters()).dtype)
    seq.base_model.load_state_dict(lm.base_model.state_dict())
    tensors, const = score_head_tensors(lm, rm)
    missed = seq.load_state_dict(tensors, strict=False).unexpected_keys
    assert not missed, missed
    if const is not None:
        seq.config.lmprefs_score_bias = const
    return seq.eval()


def is_reward_model_dir(path: Path) -> bool:
    """A directory holding a scalar sequence classifier (lmprefs' own, or e.g. one trained with TRL), or an
    lmprefs reward model of the earlier format (a causal LM + reward_head.safetensors)."""
    import json

    path = Path(path)
    if (path / "reward_head.safetensors").is_file():
        return True
    try:  # a LoRA adapter for a sequence classifier (lmprefs' own, or TRL's with peft)
        return json.loads((path / "adapter_config.json").read_text()).get("task_type") == "SEQ_CLS"
    except (OSError, ValueError, AttributeError):
        pass
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    archs = cfg.get("architectures") or []
    labels = cfg.get("num_labels", len(cfg.get("id2label") or {}) or 2)
    return any(a.endswith("ForSequenceClassification") for a in archs) and labels == 1


def load_reward_model(path: Path, device: torch.device | str = "cpu") -> RewardModel:
    """A reward model from a sequence-classification directory (num_labels=1), e.g. lmprefs' or TRL's, or a LoRA
    adapter for one (lmprefs' or TRL's with peft); rewards are its score at the last real token (plus the constant
    lmprefs kept as `lmprefs_score_bias` in the config, or `score_bias` in lmprefs.json beside an adapter)."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    if not is_reward_model_dir(path):
        raise FileNotFoundError(f"{path} is not a reward-model directory (no sequence classifier with num_labels=1)")
    verified(path)
    if (path / "reward_head.safetensors").is_file():  # the earlier format
        lm, tok = load_lm(str(path), device)
        rm = RewardModel(lm, tok)
        t = load_file(path / "reward_head.safetensors")
        rm.head.load_state_dict({k[5:]: v for k, v in t.items() if k.startswith("head.")})
        with torch.no_grad():
            rm.gain.copy_(t["gain"])
            rm.bias.copy_(t["bias"])
        return rm.to(device)
    if (path / "adapter_config.json").is_file():
        seq = _load_classifier_adapter(path)
        meta = json.loads((path / "lmprefs.json").read_text()) if (path / "lmprefs.json").is_file() else {}
        const = meta.get("score_bias", 0.0)
    else:
        seq = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32)
        const = getattr(seq.config, "lmprefs_score_bias", 0.0)
    seq = seq.to(device).eval()
    rm = RewardModel(seq, AutoTokenizer.from_pretrained(str(path)))
    with torch.no_grad():
        rm.head.linear.weight.copy_(seq.score.weight)
        rm.head.linear.bias.zero_()
        rm.bias.fill_(float(const))
    return rm.to(device)


def _load_classifier_adapter(path: Path):
    """The base model of a sequence-classifier LoRA adapter directory as a classifier (num_labels=1), with the
    adapter and its saved head merged in."""
    import json

    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from lmprefs.assets import resolve_model

    base = resolve_model(json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"])
    hf_logging.set_verbosity_error()  # the base's score head is reported missing: the adapter brings it
    seq = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    return PeftModel.from_pretrained(seq, str(path)).merge_and_unload()
