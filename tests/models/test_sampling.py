import copy
import itertools
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lmprefs.data.tasks import PAD
from lmprefs.models.loading import trunk_blocks
from lmprefs.models.sampling import _STATIC_CACHES, sample
from lmprefs.models.token_logprobs import token_logprobs
from lmprefs.models.trunk import cache_of, response_logits_hidden, with_cache


class NextTokenModel(nn.Module):
    """A fake LM whose next token is always previous + 1 (language/test_sample.py): hidden = one-hot of the input,
    head = a huge logit on (token + 1) mod V. It follows the HF interface the dynamic-cache sampler uses."""

    def __init__(self, V: int):
        super().__init__()
        self.V = V
        self.head = nn.Linear(V, V, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(100.0 * torch.roll(torch.eye(V), 1, dims=0))

    @property
    def base_model(self):
        return self

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        h = nn.functional.one_hot(input_ids, self.V).float()
        return SimpleNamespace(last_hidden_state=h, past_key_values=None)


def test_fake_next_token_model_gives_exact_tokens():
    m = NextTokenModel(10)
    q = torch.tensor([[1, 2, 3], [7, PAD, PAD], [PAD, 4, 5]])
    r, lp = sample(m, q, 5, temperature=1.0, vocab=10, generator=torch.Generator().manual_seed(0), cache="dynamic")
    assert r.tolist() == [[4, 5, 6, 7, 8], [8, 9, 0, 1, 2], [6, 7, 8, 9, 0]]
    assert torch.allclose(lp, torch.zeros_like(lp), atol=1e-6)


def test_the_cache_goes_under_the_keyword_the_forward_takes():
    """transformers 5.24 renamed a forward's `past_key_values` to `cache`, in its outputs too; older versions (and
    the fake model above) know only `past_key_values`."""

    class Renamed(nn.Module):
        def forward(self, input_ids, cache=None, use_cache=False):
            return SimpleNamespace(cache=cache)

    kv = object()
    assert with_cache(NextTokenModel(4), kv) == {"past_key_values": kv}
    assert with_cache(Renamed(), kv) == {"cache": kv}
    assert cache_of(Renamed()(None, **with_cache(Renamed(), kv))) is kv
    assert cache_of(SimpleNamespace(past_key_values=kv)) is kv


def test_logits_beyond_the_real_vocabulary_are_never_sampled():
    m = NextTokenModel(10)
    r, _ = sample(m, torch.tensor([[7]]), 6, temperature=1.0, vocab=9, generator=torch.Generator().manual_seed(0),
                  cache="dynamic")  # the fake model has no config for a static cache
    # token 8 -> 9 is outside a 9-token vocabulary, so the sampler must not produce 9
    assert (r < 9).all()


def test_sampler_logprobs_equal_a_full_forward_pass(tiny_lm):
    model, tok = tiny_lm
    a, b = tok(" The house was quiet").input_ids, tok(" Mr. Darcy said that he would").input_ids
    q = torch.tensor([a + [PAD] * (len(b) - len(a)), b])
    gen = torch.Generator().manual_seed(0)
    r, lp = sample(model, q, 8, temperature=0.7, vocab=len(tok), generator=gen)
    assert r.shape == (2, 8) and (r >= 0).all() and (r < len(tok)).all()
    with torch.no_grad():
        _, logits = response_logits_hidden(model, q, r)
        full, _ = token_logprobs(logits, r, 0.7, len(tok))
    assert torch.allclose(lp, full, atol=1e-5), (lp - full).abs().max()


def test_left_and_right_padded_batches_sample_the_same_tokens(tiny_lm):
    model, tok = tiny_lm
    a, b = tok("It was a truth").input_ids, tok("She smiled at him and").input_ids
    n = max(len(a), len(b))
    right = torch.tensor([a + [PAD] * (n - len(a)), b + [PAD] * (n - len(b))])
    left = torch.tensor([[PAD] * (n - len(a)) + a, [PAD] * (n - len(b)) + b])
    r1, lp1 = sample(model, right, 10, 0.7, len(tok), torch.Generator().manual_seed(3))
    r2, lp2 = sample(model, left, 10, 0.7, len(tok), torch.Generator().manual_seed(3))
    assert r1.equal(r2)
    assert torch.allclose(lp1, lp2, atol=1e-5)


def _padded_queries(tok):
    rows = [tok(t).input_ids for t in ("It was a truth", "She smiled at him and said", "The rain")]
    n = max(map(len, rows)) + 1
    q = [r + [PAD] * (n - len(r)) for r in rows[:2]] + [[PAD] * (n - len(rows[2])) + rows[2]]  # right and left
    return torch.tensor(q)


def test_static_cache_sampler_equals_the_dynamic_one(tiny_lm):
    """transformers' StaticCache (fixed shapes, what torch.compile and CUDA graphs need) draws the same tokens with
    the same logprobs and hidden states as the DynamicCache path, padded rows included; an eager step's cache is
    not held after the call (only a compiled step's is, for its graphs)."""
    model, tok = tiny_lm
    q = _padded_queries(tok)
    _STATIC_CACHES.pop(model, None)
    dyn = sample(model, q, 12, 0.7, len(tok), torch.Generator().manual_seed(5), True, cache="dynamic")
    st = sample(model, q, 12, 0.7, len(tok), torch.Generator().manual_seed(5), True, cache="static")
    again = sample(model, q, 12, 0.7, len(tok), torch.Generator().manual_seed(5), True, cache="static")
    assert model not in _STATIC_CACHES
    for a, b, c in zip(dyn, st, again, strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-5), (a.float() - b.float()).abs().max()
        assert b.equal(c)
    assert dyn[0].equal(st[0])
    with torch.no_grad():  # and the static sampler's logprobs are those of a full forward pass
        _, logits = response_logits_hidden(model, q, st[0])
        full, _ = token_logprobs(logits, st[0], 0.7, len(tok))
    assert torch.allclose(st[1], full, atol=1e-5)


def test_sampler_mode_resolves_auto_by_device():
    from lmprefs.models.sampling import sampler_mode

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert sampler_mode("auto", "auto", cpu) == (True, False)
    assert sampler_mode("dynamic", "off", cpu) == (False, False)
    assert sampler_mode("auto", "auto", cuda) == (True, True)
    assert sampler_mode("auto", "on", cpu) == (True, True)
    assert sampler_mode("static", "off", cuda) == (True, False)
    assert sampler_mode("dynamic", "auto", cuda) == (False, False)
    with pytest.raises(ValueError, match="run.kv_cache"):
        sampler_mode("dynamic", "on", cpu)


@pytest.mark.slow
def test_compiled_static_decode_step_equals_eager(tiny_lm):
    """torch.compile of the static decode step (about 1-2 min to compile on a 2-core CPU, hence slow) gives the
    eager sampler's tokens and logprobs, and compiles one graph for all steps and calls, over one held cache."""
    import torch._dynamo.utils

    model, tok = tiny_lm
    q = _padded_queries(tok)
    eager = sample(model, q, 8, 0.7, len(tok), torch.Generator().manual_seed(2), cache="static")
    torch._dynamo.utils.counters.clear()
    caches = []
    for _ in range(2):
        comp = sample(model, q, 8, 0.7, len(tok), torch.Generator().manual_seed(2), cache="static", compile="on")
        assert comp[0].equal(eager[0]) and torch.allclose(comp[1], eager[1], atol=1e-5)
        caches.append(_STATIC_CACHES[model][1])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1 and caches[0] is caches[1]


def test_static_cache_under_bf16_autocast_on_gpt2_and_llama(tiny_lm, monkeypatch):
    """Under bf16 autocast a Llama's keys come out of the rotary embedding in fp32 and its values in bf16; the
    static cache keeps both in bf16 (attention casts the keys to bf16 anyway) and samples what the dynamic cache
    samples."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmprefs.models import sampling
    from lmprefs.runtime.device import autocast

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64)).eval()  # fmt: skip
    q = torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10]])
    made = []
    new_cache = sampling._new_static_cache
    monkeypatch.setattr(sampling, "_new_static_cache", lambda *a: made.append(new_cache(*a)) or made[-1])
    for model, vocab in ((tiny_lm[0], len(tiny_lm[1])), (llama, 300)):
        out = {}
        for cache in ("dynamic", "static"):
            with autocast(torch.device("cpu"), torch.bfloat16):
                out[cache] = sample(model, q, 6, 0.7, vocab, torch.Generator().manual_seed(1), cache=cache)
        assert out["static"][0].equal(out["dynamic"][0])
        assert torch.allclose(out["static"][1], out["dynamic"][1], atol=1e-2)
        layer = made[-1].layers[0]  # the call's cache, of query + response
        assert layer.keys.dtype == layer.values.dtype == torch.bfloat16 and layer.keys.shape[2] == 4 + 6


def test_repeats_sample_as_the_repeated_queries_with_one_prefill(tiny_lm):
    """sample(q, repeats=k) (each query run once, its keys and values copied k times) draws the tokens, logprobs
    and hidden states of sample(q.repeat_interleave(k)), padded rows included, with either cache, on GPT-2 and
    Llama, in fp32 and under bf16 autocast; and the prefill sees each query once."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmprefs.runtime.device import autocast

    model, tok = tiny_lm
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64)).eval()  # fmt: skip
    cases = ((model, len(tok), _padded_queries(tok)), (llama, 300, torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10]])))
    for m, vocab, q in cases:
        for cache in ("dynamic", "static"):
            for dtype in (None, torch.bfloat16):
                with autocast(torch.device("cpu"), dtype or torch.float32):
                    plain = sample(m, q.repeat_interleave(3, 0), 7, 0.7, vocab, torch.Generator().manual_seed(4),
                                   True, cache=cache)  # fmt: skip
                    shared = sample(m, q, 7, 0.7, vocab, torch.Generator().manual_seed(4), True, repeats=3,
                                    cache=cache)  # fmt: skip
                tol = 1e-5 if dtype is None else 2e-2
                assert shared[0].equal(plain[0]), (cache, dtype)
                for a, b in zip(shared[1:], plain[1:], strict=True):
                    assert torch.allclose(a.float(), b.float(), atol=tol), (cache, dtype, (a - b).abs().max())
    rows = []
    hook = model.base_model.register_forward_hook(lambda mod, args, kw, out: rows.append(kw["input_ids"].shape),
                                                   with_kwargs=True)  # fmt: skip
    try:
        sample(model, _padded_queries(tok), 3, 0.7, len(tok), torch.Generator().manual_seed(4), repeats=4)
    finally:
        hook.remove()
    assert rows[0] == _padded_queries(tok).shape and all(r == (12, 1) for r in rows[1:])


def test_sampled_prefix_equals_the_frozen_prefix_of_the_sampled_rows(tiny_lm):
    """sample(prefix_depth=d) hands back the frozen prefix below block d of query + response as trunk.frozen_prefix
    computes it from the sampled rows, at every real position: with either cache, repeats, rows that stop early (the
    stop token's own position included), on GPT-2 and Llama, in fp32 and under bf16 autocast; the draws are those
    of a call without it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmprefs.config import LoraConfig
    from lmprefs.models.lora import add_adapter
    from lmprefs.models.trunk import frozen_prefix
    from lmprefs.runtime.device import autocast

    model, tok = tiny_lm
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64)).eval()  # fmt: skip
    cases = ((copy.deepcopy(model), len(tok), _padded_queries(tok), 1),
             (llama, 300, torch.tensor([[5, 6, 7, 8], [PAD, PAD, 9, 10]]), 2))  # fmt: skip
    for m, vocab, q, depth in cases:
        add_adapter(m, LoraConfig(rank=2, layers=len(trunk_blocks(m)) - depth), "policy")  # frozen_depth(m) == depth
        stop = tuple(range(0, vocab, 7))  # some rows stop early
        for cache, dtype, repeats in itertools.product(("dynamic", "static"), (None, torch.bfloat16), (1, 3)):
            with autocast(torch.device("cpu"), dtype or torch.float32):
                r, lp, pre = sample(m, q, 7, 0.7, vocab, torch.Generator().manual_seed(4), repeats=repeats,
                                    cache=cache, stop_tokens=stop, prefix_depth=depth)  # fmt: skip
                plain = sample(m, q, 7, 0.7, vocab, torch.Generator().manual_seed(4), repeats=repeats, cache=cache,
                               stop_tokens=stop)  # fmt: skip
                rows = torch.cat([q.repeat_interleave(repeats, 0), r], dim=1)
                want = frozen_prefix(m, rows)
            assert r.equal(plain[0]) and lp.equal(plain[1])
            assert pre.start == want.start == depth and pre.hidden.shape == want.hidden.shape
            real = rows != PAD
            assert (r == PAD).any() and real[:, q.shape[1]:].any()  # the case this test is about
            tol = 1e-5 if dtype is None else 5e-2
            err = (pre.hidden - want.hidden)[real].abs().max()
            assert err <= tol, (type(m).__name__, cache, dtype, repeats, err)


def test_a_batch_past_the_kv_budget_is_sampled_in_parts(tiny_lm, monkeypatch):
    """On the CPU a call whose KV cache would pass KV_CACHE_BYTES samples its queries in parts, one after another:
    the same tokens, logprobs, hidden states and frozen prefix as separate calls on those parts with one generator."""
    from lmprefs.models import sampling

    model, tok = tiny_lm
    q = _padded_queries(tok)  # 3 queries
    L, k = q.shape[1] + 6, 2
    per_query = sampling.kv_cache_bytes(model, k, L, torch.float32)
    monkeypatch.setattr(sampling, "KV_CACHE_BYTES", 2 * per_query)  # parts of 2 queries: 2 + 1
    assert sampling._parts(model, q, 6, k) == [slice(0, 2), slice(2, 4)]
    whole = sample(model, q, 6, 0.7, len(tok), torch.Generator().manual_seed(3), True, repeats=k, prefix_depth=1)
    monkeypatch.setattr(sampling, "KV_CACHE_BYTES", 100 * per_query)
    g = torch.Generator().manual_seed(3)
    parts = [sample(model, q[p], 6, 0.7, len(tok), g, True, repeats=k, prefix_depth=1) for p in (slice(0, 2),
                                                                                                 slice(2, 3))]
    for i in range(3):  # responses, logprobs, hidden
        assert whole[i].shape[0] == 3 * k and whole[i].equal(torch.cat([p[i] for p in parts]))
    assert whole[3].start == 1 and whole[3].hidden.equal(torch.cat([p[3].hidden for p in parts]))
