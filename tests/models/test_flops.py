"""The analytic FLOP count of lmprefs.models.flops against torch's FlopCounterMode on the passes themselves: the
sampler (both caches, shared prefills), the frozen prefix, the reward model's and the policy's training forward and
backward with LoRA above a frozen prefix and with full fine-tuning, on GPT-2 and on a Llama with grouped-query
attention. The count must be exact: both count the same matmuls."""

import pytest
import torch
from torch import nn

from lmprefs.config.schema import LoraConfig
from lmprefs.models import attention
from lmprefs.models import flops as F
from lmprefs.models.lora import add_adapter, using
from lmprefs.models.policy import Policy
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.sampling import sample
from lmprefs.models.trunk import frozen_prefix, frozen_prefix_shared

B, Q, T = 3, 7, 5


def make_model(kind: str):
    """(model, vocab): the tiny GPT-2 asset, or a random 3-block Llama with 4 query heads over 2 key/value heads,
    both with lmprefs' attention."""
    if kind == "gpt2":
        from lmprefs.models.loading import load_lm

        lm, tok = load_lm("tiny-gpt2")
        return lm, len(tok)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, num_hidden_layers=3, tie_word_embeddings=True)  # fmt: skip
    lm = LlamaForCausalLM(cfg).eval()
    attention.use(lm)  # as load_lm does
    return lm, 300


def counted(fn) -> int:
    with F.flop_counter() as mode:
        fn()
    return mode.get_total_flops()


@pytest.fixture(params=["gpt2", "llama"])
def model(request):
    lm, vocab = make_model(request.param)
    q = torch.randint(0, vocab, (B, Q), generator=torch.Generator().manual_seed(0))
    q[0, -2:] = -1  # a padded query runs like the others
    return lm, vocab, q, F.ModelFacts.from_config(lm.config)


def test_facts_hold_every_matmul_weight_of_the_model(model):
    lm, _, _, facts = model
    weights = sum(m.weight.numel() for m in lm.modules() if type(m).__name__ in ("Linear", "Conv1D"))
    block = sum(lin.d_in * lin.d_out for lin in facts.linears)
    assert facts.n_layers * block + facts.head_rows * facts.d == weights  # the blocks' linears and the LM head


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("repeats", [1, 3])
def test_sampler(model, cache, repeats):
    lm, vocab, q, facts = model
    g = torch.Generator().manual_seed(0)
    got = counted(lambda: sample(lm, q, T, 1.0, vocab, g, repeats=repeats, cache=cache))
    assert F.sample_flops(facts, B, Q, T, repeats, static=cache == "static") == got


def lora(lm, facts, layers: int):
    cfg = LoraConfig(rank=4, alpha=8.0, layers=layers)
    add_adapter(lm, cfg, "a", seed=1)
    ad = F.Adapters.from_lora(facts, cfg)
    assert ad is not None and ad.start == (facts.n_layers - layers if layers else 0)
    return ad


@pytest.mark.parametrize("layers", [1, 0])
def test_lora_sampler_frozen_prefix_and_reward_model_training(model, layers):
    lm, vocab, q, facts = model
    ad = lora(lm, facts, layers)
    g = torch.Generator().manual_seed(0)
    with using(lm, "a"):
        assert counted(lambda: sample(lm, q, T, 1.0, vocab, g)) == F.sample_flops(facts, B, Q, T, adapter=ad)
    r, _ = sample(lm, q, T, 1.0, vocab, g, repeats=4)
    segments = F.query_response_segments(B, Q, T, 4)
    if ad.start:
        assert counted(lambda: frozen_prefix_shared(lm, q, r, 4)) == F.trunk_flops(facts, segments, 0, ad.start)
    rm = RewardModel(lm, None, adapter="a")
    head = F.scalar_head_flops(facts, B * 4)
    for prefix in [None] + ([frozen_prefix_shared(lm, q, r, 4)] if ad.start else []):
        lo = ad.start if prefix is not None else 0
        got = counted(lambda prefix=prefix: rm(q, r, prefix, 4).sum().backward())
        read = (B * 4, Q + T, 1)  # the reward model reads each row's last token
        want = (F.trunk_flops(facts, segments, lo, None, ad, read) + F.trunk_backward(facts, segments, lo, None, ad,
                read) + head + F.head_backward(head, True))  # fmt: skip
        assert want == got


@pytest.mark.parametrize("fine_tuning", ["lora", "full"])
def test_policy_training_forward_and_backward(model, fine_tuning):
    lm, vocab, q, facts = model
    ad = lora(lm, facts, 1) if fine_tuning == "lora" else None
    r, _ = sample(lm, q, T, 1.0, vocab, torch.Generator().manual_seed(0))
    prefix = frozen_prefix(lm, torch.cat([q, r], 1)) if ad else None
    policy = Policy(lm, [0] * vocab, 1.0, adapter="a" if ad else None)
    nn.init.normal_(policy.value_head.linear.weight)  # a zero head would still be multiplied: no matter

    def step():
        logprobs, values, _ = policy(q, r, prefix)
        (logprobs.sum() + values.sum()).backward()

    rows = F.plain_segments(B, Q + T - 1)  # the last response token predicts nothing: it is not run
    lo = ad.start if ad else 0
    lm_head, v_head = F.lm_head_flops(facts, B * T), F.scalar_head_flops(facts, B * T)
    read = (B, Q + T - 1, T)  # the policy and its value head read the positions that predict the response
    want = (F.trunk_flops(facts, rows, lo, None, ad, read) + F.trunk_backward(facts, rows, lo, None, ad, read)
            + lm_head + F.head_backward(lm_head, ad is None) + v_head + F.head_backward(v_head, True))  # fmt: skip
    assert want == counted(step)


def test_merge_counts_b_times_a_of_every_adapted_layer(model):
    from lmprefs.models.lora import merged_copy

    lm, _, _, facts = model
    ad = lora(lm, facts, 1)
    assert counted(lambda: merged_copy(lm, "a")) == F.merge_flops(facts, ad) > 0


def test_unknown_architectures_are_refused_in_one_line():
    with pytest.raises(ValueError, match="model_type 'bert': the FLOP count knows GPT-2 and Llama"):
        F.ModelFacts.from_config({"model_type": "bert"})
    with pytest.raises(ValueError, match="model_type 'gpt2': its config has no 'n_head'"):
        F.ModelFacts.from_config({"model_type": "gpt2", "n_embd": 32})


def test_cuda_pads_the_lm_head_as_lm_logits_does():
    cfg = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "vocab_size": 50257}
    assert F.ModelFacts.from_config(cfg).head_rows == 50257
    assert F.ModelFacts.from_config(cfg, cuda=True).head_rows == 50304
