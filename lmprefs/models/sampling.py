"""The fixed-length sampler (language/sample.py): exactly `length` tokens, no EOS stop, plain categorical sampling
at a temperature (top_k=0, top_p=1), logits limited to the real vocabulary, with a KV cache. With `stop_tokens`
(task.stop_at_eos) a row ends at its first stop token, which it keeps, and PAD (logprob 0) fills the rest of it;
decoding ends once every row has ended, and the outputs keep their [B, length] shape.

Queries may be padded anywhere (PAD = -1); position ids skip the pads, so a padded and an unpadded query sample
alike. Draws use one uniform per row and step (inverse CDF), so batches that differ only in padding draw the same
tokens under the same generator.

Two caches, both transformers' own. Responses have a fixed length, so every shape is known before the first token:
`cache="static"` preallocates transformers' StaticCache for query + response and feeds each decode step the same
shapes (the whole 2D attention mask, the causal mask hides the slots not yet written), which is what lets
`torch.compile` turn the decode step into one graph (CUDA graphs on a GPU: mode "reduce-overhead"). `cache="dynamic"`
grows a DynamicCache step by step, as transformers' `generate` does by default. Both give the same tokens and
logprobs up to float rounding (tested; a near-tie in a draw can still flip one token); `cache="auto"` takes the
static cache, which measured as fast or faster on the CPU too (`sampler_mode`; benchmarks/gpu_throughput.py times
both).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence

import torch
from torch import Tensor

from lmprefs.data.tasks import PAD
from lmprefs.models.loading import trunk_blocks
from lmprefs.models.precast import precast
from lmprefs.models.token_logprobs import chunk_rows, scaled_logits
from lmprefs.models.trunk import FrozenPrefix, cache_of, frozen_prefix_step, lm_logits, model_inputs, with_cache


def _draw(logits: Tensor, u: Tensor, temperature: float, vocab: int) -> tuple[Tensor, Tensor]:
    """One categorical draw per row by inverse CDF: logits [B, V'] and uniforms u [B, 1] -> (token [B, 1],
    logprob [B, 1]) at `temperature` over the first `vocab` logits. On the CPU a few rows at a time (`chunk_rows`):
    the passes over [rows, V] fp32 then stay in cache instead of streaming [B, V] through memory once per op; every
    op is per row, so the draws are bitwise those of the whole batch at once. The CDF sums the softmax, and the
    token's logprob is the log of its probability: one pass over the vocabulary fewer than exp(log_softmax), equal
    to the log-softmax within a few float32 roundings. The draw lands on the first token whose CDF reaches u times
    the total, and never below the smallest positive float, so the drawn token's probability is never 0 (at u = 0
    it would be token 0 whatever its probability)."""
    step = chunk_rows(logits)
    tiny = torch.finfo(torch.float32).tiny
    toks, lps = [], []
    for i in range(0, len(logits), step):
        p = torch.softmax(scaled_logits(logits, slice(i, i + step), vocab, temperature), dim=-1)  # [b, V]
        cdf = p.cumsum(-1)
        tok = torch.searchsorted(cdf, (u[i : i + step] * cdf[:, -1:]).clamp(min=tiny)).clamp(max=vocab - 1)
        toks.append(tok)
        lps.append(p.gather(-1, tok).log())
    if len(toks) == 1:
        return toks[0], lps[0]
    return torch.cat(toks), torch.cat(lps)


def _forward_step(model, tok: Tensor, mask: Tensor, pos: Tensor, past):
    """Feed the previous token [B, 1] at positions pos [B, 1]; ((hidden [B, d], logits [B, V']), the cache)."""
    out = model.base_model(input_ids=tok, attention_mask=mask, position_ids=pos, **with_cache(model.base_model, past),
                           use_cache=True)  # fmt: skip
    h = out.last_hidden_state[:, -1]
    return (h, lm_logits(model, h)), cache_of(out)


def _static_forward(model, tok, mask, pos, past):
    """The decode step's model part, the one that is compiled. The draw stays eager: on an H100 (torch 2.11)
    inductor's split-scan codegen failed on the draw's cumsum over the vocabulary for batches of 8 and 32
    (InductorError, "list indices must be integers or slices, not NoneType"), and the draw is a handful of kernels."""
    return _forward_step(model, tok, mask, pos, past)[0]


def sampler_options(run) -> dict:
    """sample()'s cache/compile keywords from a RunConfig."""
    # under FSDP the gathered parameters are freed and reallocated between rollouts: no CUDA graph may keep them
    return {"cache": run.kv_cache, "compile": "off" if run.parallel == "fsdp" else run.compile}


_COMPILED: dict[str, object] = {}


def compiled_step(device_type: str):
    """The static decode step's forward under torch.compile: on CUDA with CUDA graphs ("reduce-overhead"), the
    launch cost of a step's ~100 small kernels is paid once. Compiled lazily and once per process (dynamo guards
    and recompiles per model, batch shape and adapter)."""
    mode = "reduce-overhead" if device_type == "cuda" else "default"
    if mode not in _COMPILED:
        _COMPILED[mode] = torch.compile(_static_forward, mode=mode, dynamic=False)
    return _COMPILED[mode]


def _static_layer_class():
    from transformers.cache_utils import StaticLayer

    class StaticLayerInValueDtype(StaticLayer):
        """transformers' StaticLayer with the keys kept in the values' dtype. Under bf16 autocast a Llama's keys leave
        the rotary embedding in fp32 while its values stay bf16: the stock layer allocates both in fp32 (its
        index_copy_ of the values then fails), and every decode step's attention would cast the whole fp32 key cache
        to bf16 again. Autocast casts them to bf16 before each matmul, so keys stored in bf16 give bitwise the same
        attention, from half the bytes."""

        def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
            super().lazy_initialization(key_states.to(value_states.dtype), value_states)

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            return super().update(key_states.to(value_states.dtype), value_states, *args, **kwargs)

    return StaticLayerInValueDtype


_STATIC_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (key, its static cache)


def _static_cache(model, batch: int, length: int, *, hold: bool):
    """A static cache for [batch, length] (transformers' Cache of static layers). With `hold` (a compiled step) it is
    kept per model (not on it, so a deepcopy of the model does not copy it) and reset between calls: its buffers
    keep their addresses, so compiled steps (and their CUDA graphs) are reused rather than re-recorded. Eager steps
    take a new one, freed with the call: a labeling batch's cache of 512 rows holds 660 MB of SmolLM2's keys and
    values, which a held cache would keep through the stages after it."""
    if not hold:
        return _new_static_cache(model, length)
    device = next(model.parameters()).device
    # the autocast state of the model's device type: the bare torch.is_autocast_enabled() is CUDA's alone, so a cache
    # allocated in fp32 on the CPU was handed to a bf16-autocast call of the same shape (index_copy_ of bf16 into fp32)
    on = torch.is_autocast_enabled(device.type)
    key = (batch, length, on and torch.get_autocast_dtype(device.type), device)
    held = _STATIC_CACHES.get(model)
    if held is not None and held[0] == key:
        held[1].reset()
        return held[1]
    cache = _new_static_cache(model, length)
    _STATIC_CACHES[model] = (key, cache)
    return cache


def _new_static_cache(model, length: int):
    from transformers import Cache

    layer = _static_layer_class()
    return Cache(layers=[layer(max_cache_len=length) for _ in range(model.config.num_hidden_layers)])


def sampler_mode(cache: str, compile: str | bool, device: torch.device) -> tuple[bool, bool]:
    """(static cache?, compiled step?) for run.kv_cache / run.compile on `device`. auto takes the static cache
    everywhere: on this project's 2-core CPU it sampled SmolLM2-135M as fast as the dynamic cache in fp32 and in
    0.64x the time under bf16 autocast (batch 16, query 64, 24 tokens; docs/results.md). auto compiles on
    CUDA only: on the CPU a compile costs one to two minutes per shape."""
    if cache not in ("auto", "static", "dynamic"):
        raise ValueError(f"kv_cache={cache!r}: expected auto, static or dynamic")
    if isinstance(compile, str):
        if compile not in ("auto", "on", "off"):
            raise ValueError(f"compile={compile!r}: expected auto, on or off")
        compile = (device.type == "cuda" and cache != "dynamic") if compile == "auto" else compile == "on"
    if compile and cache == "dynamic":
        raise ValueError("run.compile=on compiles the static-cache decode step: use run.kv_cache static or auto")
    static = cache != "dynamic"
    return static, compile


def _prefill(model, queries: Tensor, repeats: int, static) -> tuple[Tensor, Tensor, object]:
    """Run queries [B, Q] through the model: (hidden state of each row's last real token [B * k, d], the 2D mask of
    the queries [B * k, Q], the cache holding their keys and values for B * k rows; k = repeats, row i * k + j is a
    copy of query i). `static`: the StaticCache to fill (for B * k rows), or None for a DynamicCache.
    With k > 1 the queries run once and the cache is copied per row: best-of-4 questions on 64-token queries spent
    about half their sampling time in the prefill when each query ran 4 times (docs/results.md)."""
    ids, mask, positions = model_inputs(queries)
    B, Q = queries.shape
    if static is not None and repeats == 1:  # the whole static mask; the causal mask hides the unwritten slots
        L = static.layers[0].max_cache_len
        full = torch.cat([mask, mask.new_ones(B, L - Q)], dim=1)
        out = model.base_model(input_ids=ids, attention_mask=full, position_ids=positions, use_cache=True,
                               **with_cache(model.base_model, static))  # fmt: skip
    else:  # a static cache of the queries' own size: its keys and values come out in the dtypes the decode writes
        own = None if static is None else _new_static_cache(model, Q)
        out = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                               **with_cache(model.base_model, own))  # fmt: skip
    past = cache_of(out)
    last = (queries != PAD).long().cumsum(-1).argmax(-1)  # index of each row's last real token
    h = out.last_hidden_state[torch.arange(B, device=queries.device), last]  # [B, d]
    if repeats > 1:
        h, mask = h.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0)
        if static is None:
            past.batch_repeat_interleave(repeats)
        else:
            at = {"cache_position": torch.arange(Q, device=queries.device)}  # read by older transformers' update
            for mine, full in zip(past.layers, static.layers, strict=True):
                full.update(mine.keys.repeat_interleave(repeats, 0), mine.values.repeat_interleave(repeats, 0), at)
            past = static
    return h, mask, past


KV_CACHE_BYTES = 512 * 2**20
"""On the CPU, the most one sampling pass's KV cache holds: a call for more rows samples its queries in parts, one
after another. A labeling batch of 384 rows of SmolLM2 holds 495 MB of keys and values in bf16 and 990 MB in fp32,
where a run's peak RSS is reached (docs/results.md)."""


def kv_cache_bytes(model, rows: int, length: int, dtype: torch.dtype) -> int:
    """Bytes of the keys and values of `rows` sequences of `length` tokens in `dtype`, every layer: the static
    cache's, which keeps keys in the values' dtype (a dynamic cache under bf16 autocast keeps fp32 keys)."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * rows * length * heads * head_dim * dtype.itemsize


def _parts(model, queries: Tensor, length: int, repeats: int) -> list[slice]:
    """The slices of `queries` sampled one after another: all of them at once, except on the CPU where their KV
    cache would pass KV_CACHE_BYTES."""
    B, device = len(queries), queries.device
    if device.type != "cpu" or getattr(model, "config", None) is None:  # a model without a config: no known cache
        return [slice(0, B)]
    on = torch.is_autocast_enabled("cpu")
    dtype = torch.get_autocast_dtype("cpu") if on else next(model.parameters()).dtype
    per_query = kv_cache_bytes(model, repeats, queries.shape[1] + length, dtype)
    step = max(1, min(B, KV_CACHE_BYTES // per_query))
    return [slice(i, i + step) for i in range(0, B, step)]


def _joined(outs: list[tuple]) -> tuple:
    """The outputs of sampling parts of a batch, as those of the whole batch (rows in the queries' order)."""
    return tuple(torch.cat(parts) if isinstance(parts[0], Tensor) else FrozenPrefix.cat(list(parts))
                 for parts in zip(*outs, strict=True))


@torch.no_grad()
def sample(model, queries: Tensor, length: int, temperature: float, vocab: int,
           generator: torch.Generator | None = None, return_hidden: bool = False, *, repeats: int = 1,
           cache: str = "auto", compile: str | bool = "off", stop_tokens: Sequence[int] = (),
           prefix_depth: int | None = None):  # fmt: skip
    """Sample responses [B, length] and their logprobs [B, length] at `temperature` given queries [B, Q].
    With return_hidden, also the hidden states that predicted each token [B, length, d]: the value head reads
    them, so a rollout needs no second forward pass (the original's policy.respond returns values this way).
    repeats=k samples each query k times: rows [B * k] as for queries.repeat_interleave(k, 0), with the same draws,
    but each query runs through the model once and its keys and values are copied k times (`_prefill`).
    cache (run.kv_cache) and compile (run.compile): see the module doc and `sampler_mode`. Under autocast, frozen
    weights are cast once for the call (`precast`), except for a compiled step, whose guards would see new
    forwards at every call. stop_tokens (`data.tasks.stop_tokens`): the ids that end a row; () = none, the original.
    prefix_depth d (an int): also returns, last, the frozen prefix of query + response below block d
    (`trunk.FrozenPrefix` [B * k, Q + length, d_model]) as the sampling pass computed it, so that the forwards that
    score these rows with adapters only above block d (reference, reward model, PPO epochs) need not run the blocks
    below again; it costs one more pass of the last token through those blocks. None for d = 0, and under a
    compiled step (dynamo would trace the capture): the caller then runs `trunk.frozen_prefix` itself. Positions
    after a row's stop token hold no token's prefix (never read: they are PAD).
    On the CPU a batch whose KV cache would pass KV_CACHE_BYTES is sampled in parts of fewer queries (`_parts`),
    which draw from the generator one part after another.
    """
    parts = _parts(model, queries, length, repeats)
    if len(parts) > 1:
        return _joined([sample(model, queries[p], length, temperature, vocab, generator, return_hidden,
                                      repeats=repeats, cache=cache, compile=compile, stop_tokens=stop_tokens,
                                      prefix_depth=prefix_depth) for p in parts])  # fmt: skip
    static, compile = sampler_mode(cache, compile, queries.device)
    stop = torch.tensor(list(stop_tokens), dtype=queries.dtype, device=queries.device) if stop_tokens else None
    with contextlib.nullcontext() if compile else precast(model, queries.device.type):
        if not prefix_depth or compile:
            out = _sample(model, queries, length, temperature, vocab, generator, return_hidden, repeats=repeats,
                          static=static, compile=compile, stop=stop)  # fmt: skip
            return out if prefix_depth is None else (*out, None)
        with _captured_input(trunk_blocks(model)[prefix_depth]) as seen:
            *out, last = _sample(model, queries, length, temperature, vocab, generator, return_hidden,
                                 repeats=repeats, static=static, compile=compile, stop=stop,
                                 last_token=True)  # fmt: skip
        return (*out, _sampled_prefix(model, prefix_depth, seen, last, repeats, queries.shape[1] + length))


@contextlib.contextmanager
def _captured_input(block: torch.nn.Module):
    """The hidden states entering `block` in each forward while inside, in order (a list the caller reads)."""
    seen: list[Tensor] = []

    def hook(module, args, kwargs):
        seen.append(args[0] if args else kwargs["hidden_states"])

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _sampled_prefix(model, depth: int, seen: list[Tensor], last, repeats: int, L: int) -> FrozenPrefix:
    """The frozen prefix [N, L, d] below block `depth` from the sampling pass: the prefill's (each query once, so
    repeated for its k rows) and each decode step's inputs to that block, then the last drawn token's, which no
    step fed: `last` = (token [N, 1], mask, position [N, 1], cache) runs it through the blocks below only. Steps
    not run (every row had stopped) are zeros: PAD positions, never read."""
    tok, mask, pos, past = last
    h_last = frozen_prefix_step(model, depth, input_ids=tok, attention_mask=mask, position_ids=pos, use_cache=True,
                                **with_cache(model.base_model, past))  # fmt: skip
    first, *steps = seen
    parts = [first.repeat_interleave(repeats, 0) if repeats > 1 else first, *steps, h_last]
    h = torch.cat(parts, dim=1)
    if h.shape[1] < L:
        h = torch.cat([h, h.new_zeros(h.shape[0], L - h.shape[1], h.shape[2])], dim=1)
    return FrozenPrefix(model, depth, h)


def _stopped(tok: Tensor, logp: Tensor, ended: Tensor, stop: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A step's draws tok, logp [N, 1] as kept: PAD and logprob 0 in rows that `ended` [N, 1] before it; and the
    rows ended after it (their stop token is the last one they keep)."""
    kept = torch.where(ended, PAD, tok), torch.where(ended, 0.0, logp)
    return *kept, ended | torch.isin(tok, stop)


def _sample(model, queries: Tensor, length: int, temperature: float, vocab: int, generator, return_hidden: bool, *,
            repeats: int, static: bool, compile: bool, stop: Tensor | None = None,
            last_token: bool = False):  # fmt: skip
    B, Q = queries.shape
    N = B * repeats
    device = queries.device
    static_cache = _static_cache(model, N, Q + length, hold=compile) if static else None
    h, mask, past = _prefill(model, queries, repeats, static_cache)
    if static:
        mask = torch.cat([mask, mask.new_ones(N, length)], dim=1)  # [N, Q+T], the same tensor every step
    pos = mask[:, :Q].sum(-1, keepdim=True)  # [N, 1] position of the first response token
    step = compiled_step(device.type) if compile else _static_forward
    tok, logp = _draw(lm_logits(model, h), torch.rand(N, 1, generator=generator, device=device), temperature, vocab)
    ended = torch.zeros(N, 1, dtype=torch.bool, device=device)
    kept_tok, kept_logp = tok, logp
    if stop is not None:
        kept_tok, kept_logp, ended = _stopped(tok, logp, ended, stop)
    responses, logprobs, hidden = [kept_tok], [kept_logp], [h]
    for t in range(1, length):
        if stop is not None and bool(ended.all()):  # a host sync per step, only when rows can stop
            break
        u = torch.rand(N, 1, generator=generator, device=device)
        if static:
            if compile and device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            h, logits = step(model, tok, mask, pos + (t - 1), past)
            h = h.clone()  # a CUDA graph's outputs are overwritten by its next replay; logits are used before it
        else:
            mask = torch.cat([mask, torch.ones_like(tok)], dim=1)
            (h, logits), past = _forward_step(model, tok, mask, pos + (t - 1), past)
        tok, logp = _draw(logits, u, temperature, vocab)  # an ended row still feeds its draws: never read
        kept_tok, kept_logp = tok, logp
        if stop is not None:
            kept_tok, kept_logp, ended = _stopped(tok, logp, ended, stop)
        responses.append(kept_tok)
        logprobs.append(kept_logp)
        hidden.append(h)
    left = length - len(responses)  # steps not run: every row had ended
    if left:
        responses.append(torch.full((N, left), PAD, dtype=tok.dtype, device=device))
        logprobs.append(logp.new_zeros(N, left))
        hidden += [torch.zeros_like(h)] * left
    out: tuple = (torch.cat(responses, 1), torch.cat(logprobs, 1))
    if return_hidden:
        out += (torch.stack(hidden, 1),)
    if last_token:  # the last draw, where the next step would feed it (_sampled_prefix)
        fed = length - left - 1  # decode steps run
        if not static:
            mask = torch.cat([mask, torch.ones_like(tok)], dim=1)
        out += ((tok, mask, pos + fed, past),)
    return out
