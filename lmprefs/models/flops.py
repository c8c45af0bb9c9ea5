"""Matmul FLOPs of the passes lmprefs' models run, counted from the model's shape alone (`ModelFacts`, read from its
config): what `benchmarks/roofline.py` divides by the time of each stage of the quickstart.

What is counted is what torch's FlopCounterMode counts, and what a GPU's or CPU's matmul units do: 2*m*n*k for each
matmul of the blocks' linear layers, the LoRA adapters, attention (QK^T and AV, over the keys the code really
attends to: a static KV cache attends to all its slots, masked or not), the LM head and the scalar heads. Norms,
activations, softmaxes, the sampler's draw and the optimizer are elementwise and not counted.

The passes mirror the functions in `lmprefs.models.trunk` and `lmprefs.models.sampling` (each function here names
its counterpart), at the shapes they run: padded rows are computed like real ones.

Backward (`trunk_backward`, `head_backward`): a frozen weight's matmul costs its input gradient only (1x the
forward), a trainable one the weight gradient too (2x); a matmul whose input needs no gradient either (the q/k/v
projections of the lowest trained block, whose input comes from frozen blocks) costs only its weight gradients. The
attention backward of a fused kernel (flash / CPU flash) is 5 matmuls of the forward's size: 2.5x; of the eager form
the CPU runs for short rows (`lmprefs.models.attention`) 4: 2x.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lmprefs.models.attention import short

# model_type values whose blocks are laid out as Llama's (q/k/v/o projections, a gated MLP of three matrices)
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
TOP_BLOCK_MODELS = ("gpt2", "llama", "mistral", "qwen2")
"""model_types whose top block `trunk.top_block_at` runs at the read positions alone: GPT-2 and the Llama layout with
no norm on the queries and keys (Qwen3 has one)."""


@dataclass(frozen=True)
class Linear:
    """One linear layer of a transformer block."""

    name: str
    """The module's attribute name, which lora.targets matches (`q_proj`, `c_attn`, ...)."""
    d_in: int
    d_out: int
    reads_input: bool
    """Whether it multiplies the block's own (normed) input: the q/k/v projections. In the lowest trained block
    that input comes from frozen blocks, so no gradient flows into it."""
    every_position: bool = False
    """A key or value projection: in a top block run at the read positions alone (`trunk.top_block_at`) it still
    runs at every position."""


@dataclass(frozen=True)
class ModelFacts:
    """What a FLOP count needs of a model: its depth, width, attention heads, one block's linear layers and the rows
    of its LM head."""

    n_layers: int
    d: int
    n_heads: int
    head_dim: int
    linears: tuple[Linear, ...]
    head_rows: int
    """Rows of the LM head: the embedding's vocabulary, padded to a multiple of 64 on CUDA as `trunk.lm_logits`
    pads it."""
    cuda: bool = False
    """Counted for a GPU: attention always runs the fused kernel there."""
    top_reads: bool = False
    """Whether a forward that reads a few positions runs its top block there alone (`trunk.top_block_reads`: on the
    CPU)."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any, *, cuda: bool = False) -> ModelFacts:
        """From a Hugging Face config (the object or config.json's dict) of a GPT-2 or a Llama-style model."""
        c = dict(config) if isinstance(config, Mapping) else config.to_dict()
        try:
            return cls._from_dict(c, cuda)
        except KeyError as e:
            raise ValueError(f"model_type {c.get('model_type')!r}: its config has no {e.args[0]!r}") from None

    @classmethod
    def _from_dict(cls, c: dict[str, Any], cuda: bool) -> ModelFacts:
        kind = c.get("model_type")
        linears: tuple[Linear, ...]
        if kind == "gpt2":
            d, heads = int(c["n_embd"]), int(c["n_head"])
            inner = int(c.get("n_inner") or 4 * d)
            # c_attn makes the keys and values, so in a top block run at the read positions alone it runs at every
            # position, its query third included (`trunk.top_block_at`)
            linears = (Linear("c_attn", d, 3 * d, True, True), Linear("c_proj", d, d, False),
                       Linear("c_fc", d, inner, False), Linear("c_proj", inner, d, False))  # fmt: skip
            n_layers, head_dim = int(c["n_layer"]), d // heads
        elif kind in LLAMA_LIKE:
            d, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
            kv, inner = int(c.get("num_key_value_heads") or heads), int(c["intermediate_size"])
            head_dim = int(c.get("head_dim") or d // heads)
            linears = (Linear("q_proj", d, heads * head_dim, True), Linear("k_proj", d, kv * head_dim, True, True),
                       Linear("v_proj", d, kv * head_dim, True, True), Linear("o_proj", heads * head_dim, d, False),
                       Linear("gate_proj", d, inner, False), Linear("up_proj", d, inner, False),
                       Linear("down_proj", inner, d, False))  # fmt: skip
            n_layers = int(c["num_hidden_layers"])
        else:
            raise ValueError(f"model_type {kind!r}: the FLOP count knows GPT-2 and Llama-style models "
                             f"({', '.join(LLAMA_LIKE)})")  # fmt: skip
        vocab = int(c["vocab_size"])
        return cls(n_layers, d, heads, head_dim, linears, vocab + (-vocab % 64 if cuda else 0), cuda,
                   kind in TOP_BLOCK_MODELS and not cuda)  # fmt: skip


@dataclass(frozen=True)
class Adapters:
    """LoRA adapters as `lmprefs.models.lora.add_adapter` places them: rank `rank` on the linear layers named in
    `targets`, in blocks `start` and above (`start` is `trunk.frozen_depth`: 0 when every block has them)."""

    rank: int
    targets: tuple[str, ...]
    start: int

    @classmethod
    def from_lora(cls, facts: ModelFacts, lora: Any) -> Adapters | None:
        """From a LoraConfig (rank, targets, layers); None when lora.rank is 0 (full fine-tuning)."""
        if lora.rank <= 0:
            return None
        start = facts.n_layers - lora.layers if 0 < lora.layers < facts.n_layers else 0
        return cls(lora.rank, tuple(lora.targets), start)

    def adapted(self, block: int, linear: Linear) -> bool:
        return block >= self.start and linear.name in self.targets


# A run of token rows through some blocks: (rows, positions per row, keys each position attends to).
Segment = tuple[int, int, int]


def response_columns(t_len: int) -> int:
    """Of a response of t_len tokens, the columns a forward that reads the positions predicting it runs
    (`trunk.response_hidden`): all but the last token, which predicts nothing and, attention being causal, feeds no
    position read."""
    return t_len - 1 if t_len > 1 else t_len


def plain_segments(rows: int, length: int) -> list[Segment]:
    """An uncached forward of `rows` rows of `length` tokens (`trunk.trunk_hidden`, `trunk.frozen_prefix`): every
    position attends to all `length` keys (SDPA computes the masked ones too)."""
    return [(rows, length, length)]


def query_response_segments(queries: int, q_len: int, t_len: int, repeats: int = 1, *,
                            shared: bool = True) -> list[Segment]:  # fmt: skip
    """`trunk.query_response_hidden` for `queries` queries of q_len tokens each answered by `repeats` responses of
    t_len: with repeats > 1 (and SDPA, `shared`), each query runs once (`trunk.shared_query_trunk`) and its
    responses then attend to query + response; else the repeated rows run whole."""
    if repeats > 1 and shared:
        return [(queries, q_len, q_len), (queries * repeats, t_len, q_len + t_len)]
    return plain_segments(queries * repeats, q_len + t_len)


def _blocks(facts: ModelFacts, lo: int, hi: int | None) -> range:
    return range(lo, facts.n_layers if hi is None else hi)


def attention_flops(facts: ModelFacts, rows: int, q_len: int, k_len: int) -> int:
    """One block's QK^T and AV for `rows` rows of q_len positions attending to k_len keys (torch's sdpa_flop_count:
    grouped-query attention costs as many query heads)."""
    return 2 * 2 * rows * facts.n_heads * q_len * k_len * facts.head_dim


def attention_backward(facts: ModelFacts, rows: int, q_len: int, k_len: int,
                       grads: tuple[bool, bool, bool] = (True, True, True)) -> int:  # fmt: skip
    """Backward of `attention_flops` when the (queries, keys, values) marked in `grads` need gradients. The fused
    kernel computes all three in 5 matmuls of the forward's size (it recomputes QK^T); the eager form the CPU runs
    for short rows one matmul per gradient, and one for the scores' when queries or keys need theirs."""
    if facts.cuda or not short(q_len, k_len):
        return 5 * attention_flops(facts, rows, q_len, k_len) // 2
    q, k, v = grads
    return ((q or k) + q + k + v) * attention_flops(facts, rows, q_len, k_len) // 2


def _attention_grads(facts: ModelFacts, adapter: Adapters, b: int) -> tuple[bool, bool, bool]:
    """Which of (queries, keys, values) need gradients in block b, the lowest trained one, whose input needs none:
    those whose projection has an adapter."""
    names = {lin.name for lin in facts.linears if adapter.adapted(b, lin)}
    if "c_attn" in names:  # GPT-2 projects all three at once
        return True, True, True
    return "q_proj" in names, "k_proj" in names, "v_proj" in names


# Rows read at a few positions: (rows, positions per row, positions read per row). A forward that reads them runs its
# top block there alone where it can (facts.top_reads): the segments then cover the blocks below it.
Read = tuple[int, int, int]


def _top_block(facts: ModelFacts, lo: int, hi: int | None, read: Read | None) -> list[tuple[int, int, int, int]]:
    """[(rows, query positions, key positions, key/value positions)] of the top block when it runs at the read
    positions alone, else []."""
    if read is None or not facts.top_reads or hi not in (None, facts.n_layers) or lo >= facts.n_layers:
        return []
    rows, L, R = read
    return [(rows, R, L, L)]


def _block_runs(facts: ModelFacts, segments: list[Segment], lo: int, hi: int | None,
                read: Read | None) -> list[tuple[int, int, int, int, int]]:  # fmt: skip
    """(rows, query positions, key positions, key/value positions, block) of each block lo..hi over `segments`, the
    top block at the read positions alone where it runs there (`_top_block`)."""
    top = _top_block(facts, lo, hi, read)
    below = facts.n_layers - 1 if top else hi
    runs = [(rows, q_len, k_len, q_len, b) for rows, q_len, k_len in segments for b in _blocks(facts, lo, below)]
    return runs + [(*t, facts.n_layers - 1) for t in top]


def trunk_flops(facts: ModelFacts, segments: list[Segment], lo: int = 0, hi: int | None = None,
                adapter: Adapters | None = None, read: Read | None = None) -> int:  # fmt: skip
    """Forward of blocks lo..hi over `segments`, with `adapter` active (None: the base, adapters off); with `read`,
    the top block at the read positions (`trunk.query_response_hidden`'s read)."""
    total = 0
    for rows, q_len, k_len, kv_len, b in _block_runs(facts, segments, lo, hi, read):
        total += attention_flops(facts, rows, q_len, k_len)
        for lin in facts.linears:
            tokens = rows * (kv_len if lin.every_position else q_len)
            total += 2 * tokens * lin.d_in * lin.d_out
            if adapter is not None and adapter.adapted(b, lin):
                total += 2 * tokens * adapter.rank * (lin.d_in + lin.d_out)
    return total


def trunk_backward(facts: ModelFacts, segments: list[Segment], lo: int = 0, hi: int | None = None,
                   adapter: Adapters | None = None, read: Read | None = None) -> int:  # fmt: skip
    """Backward of a forward `trunk_flops(facts, segments, lo, hi, adapter, read)` when `adapter` trains (its base
    frozen, gradients stop at its lowest block), or, with adapter None, when every weight trains (full fine-tuning:
    the embeddings too, so even the lowest block passes a gradient to its input)."""
    total = 0
    low = lo if adapter is None else max(lo, adapter.start)
    for rows, q_len, k_len, kv_len, b in _block_runs(facts, segments, low, hi, read):
        # the lowest trained block's q/k/v read an input without gradient
        grads = _attention_grads(facts, adapter, b) if adapter is not None and b == adapter.start else (True,) * 3
        total += attention_backward(facts, rows, q_len, k_len, grads)
        for lin in facts.linears:
            tokens = rows * (kv_len if lin.every_position else q_len)
            mm = 2 * tokens * lin.d_in * lin.d_out
            if adapter is None:
                total += 2 * mm
                continue
            no_input_grad = b == adapter.start and lin.reads_input
            total += 0 if no_input_grad else mm
            if adapter.adapted(b, lin):  # A: its weight gradient (and x's); B: both
                a_mm, b_mm = 2 * tokens * lin.d_in * adapter.rank, 2 * tokens * adapter.rank * lin.d_out
                total += a_mm * (1 if no_input_grad else 2) + 2 * b_mm
    return total


def lm_head_flops(facts: ModelFacts, rows: int) -> int:
    """The LM head on `rows` hidden states (`trunk.lm_logits`; callers run it only where logits are read)."""
    return 2 * rows * facts.d * facts.head_rows


def scalar_head_flops(facts: ModelFacts, rows: int) -> int:
    """A value or reward head (`policy.ScalarHead`, d -> 1) on `rows` hidden states."""
    return 2 * rows * facts.d


def head_backward(forward: int, trains: bool) -> int:
    """Backward of a head whose forward cost `forward`: the input gradient, and the weight's when it trains."""
    return forward * (2 if trains else 1)


def sample_flops(facts: ModelFacts, queries: int, q_len: int, length: int, repeats: int = 1, *, static: bool = True,
                 adapter: Adapters | None = None, prefix_depth: int = 0) -> int:  # fmt: skip
    """`sampling.sample`: `queries` queries of q_len tokens, `repeats` responses of `length` tokens each. The prefill
    runs each query once; with the static cache and one response per query it fills the cache of q_len + length
    slots in place and attends to all of them, with several it runs on a cache of the query's own size. Each
    decode step runs the queries * repeats rows one position, attending to every slot of a static cache (or to the
    q_len + t tokens so far with the dynamic one). The LM head runs once per response token. With prefix_depth d
    (the frozen prefix kept), the last token also runs through blocks 0..d, attending to all q_len + length keys."""
    n = queries * repeats
    total_len = q_len + length
    prefill_keys = total_len if static and repeats == 1 else q_len
    flops = trunk_flops(facts, [(queries, q_len, prefill_keys)], adapter=adapter)
    steps = [(n, 1, total_len if static else q_len + t) for t in range(1, length)]
    last = trunk_flops(facts, [(n, 1, total_len)], 0, prefix_depth) if prefix_depth else 0
    return flops + trunk_flops(facts, steps, adapter=adapter) + last + lm_head_flops(facts, n * length)


def merge_flops(facts: ModelFacts, adapter: Adapters) -> int:
    """`lora.merged_copy`: B @ A for every adapted layer (the merged export of a policy or reward model)."""
    return sum(2 * lin.d_out * adapter.rank * lin.d_in
               for b in range(facts.n_layers) for lin in facts.linears if adapter.adapted(b, lin))  # fmt: skip


def flop_counter() -> Any:
    """torch's FlopCounterMode (as a context manager; `.get_total_flops()` after), also counting the CPU's fused
    attention, which it counts on CUDA only, with its own formulas for the CUDA kernels: 2 matmuls forward, 5
    backward; and oneDNN's linear (`models.cpu_linear`), which it does not count. What the counts here are checked
    against."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    def linear(x, w, *args, out_shape=None, **kwargs) -> int:  # x [..., in], w [out, in]
        return 2 * math.prod(x[:-1]) * w[0] * w[1]

    cpu = {aten._scaled_dot_product_flash_attention_for_cpu: forward,
           aten._scaled_dot_product_flash_attention_for_cpu_backward: backward,
           torch.ops.mkldnn._linear_pointwise: linear}  # fmt: skip
    return FlopCounterMode(display=False, custom_mapping=cpu)
