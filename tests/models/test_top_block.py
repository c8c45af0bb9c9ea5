"""The top block at the read positions alone (`trunk.top_block_at`): a reward model's rewards and a policy's
log-probabilities, values and their gradients equal those of the whole top block, on a Llama with grouped-query
attention and on a GPT-2, with padded queries, truncated responses, a question's samples sharing their query and a
frozen prefix."""

import pytest
import torch

from lmprefs.config import LoraConfig
from lmprefs.data.tasks import PAD
from lmprefs.models import trunk
from lmprefs.models.lora import add_adapter, lora_modules
from lmprefs.models.policy import Policy
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.trunk import frozen_prefix_shared, top_block_reads


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmprefs.models import attention

    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)).eval()  # fmt: skip
    attention.use(lm)
    add_adapter(lm, LoraConfig(rank=2, layers=2), "a")
    for m in lora_modules(lm):
        torch.nn.init.normal_(m.B["a"], std=0.1)
    return lm


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    from lmprefs.models import attention

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0,
                                    embd_pdrop=0, attn_pdrop=0)).eval()  # fmt: skip
    attention.use(lm)
    add_adapter(lm, LoraConfig(rank=2, layers=2), "a")
    for m in lora_modules(lm):
        torch.nn.init.normal_(m.B["a"], std=0.1)
    return lm


def _both(monkeypatch, fn):
    """fn() with the top block at the read positions, then whole; (outputs, gradients) of each."""
    out = []
    for reads in (True, False):
        if not reads:
            monkeypatch.setattr(trunk, "top_block_reads", lambda model: False)
        out.append(fn())
    return out


def _grads(loss, params):
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_reward_model_and_policy_equal_the_whole_top_block(monkeypatch, make):
    lm = make()
    assert top_block_reads(lm)
    q = torch.tensor([[5, 6, 7, 8], [9, 10, PAD, PAD]])
    r = torch.randint(0, 300, (6, 5), generator=torch.Generator().manual_seed(1))
    r[1, 3:] = PAD  # truncated
    rm = RewardModel(lm, None, adapter="a", seed=0)
    policy = Policy(lm, [0] * 300, 0.7, adapter="a")
    torch.nn.init.normal_(policy.value_head.linear.weight)
    params = [p for m in lora_modules(lm) for p in (m.A["a"], m.B["a"])]
    pre = frozen_prefix_shared(lm, q, r, 3)

    def reward(prefix):
        out = rm(q, r, prefix, 3)
        return out, _grads(out.pow(2).sum(), params)

    def policy_pass():
        rows = q.repeat_interleave(3, 0)
        logp, values, ent = policy(rows, r)
        return torch.cat([logp, values, ent]), _grads((logp.sum() + values.pow(2).sum()), params)

    for fn in (lambda: reward(None), lambda: reward(pre), policy_pass):
        (got, g_got), (want, g_want) = _both(monkeypatch, fn)
        monkeypatch.undo()
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        for a, b in zip(g_got, g_want, strict=True):  # within fp32 rounding of the gradient's scale
            assert (a - b).abs().max() <= 1e-6 * b.abs().max() + 1e-5, ((a - b).abs().max(), b.abs().max())


def test_no_forward_hands_transformers_its_deprecated_cache_keyword():
    """Sampling (static and dynamic caches, with the frozen prefix kept), a question's samples sharing their query and
    the top block at the read positions pass their KV caches under the keyword the installed transformers takes:
    from 5.24 on `cache`, where `past_key_values` warns on every run and is to be removed."""
    import warnings

    from lmprefs.models.sampling import sample

    lm = _llama()
    q = torch.tensor([[5, 6, 7, 8], [9, 10, PAD, PAD]])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for cache in ("static", "dynamic"):
            r, *_ = sample(lm, q, 5, 0.7, 300, torch.Generator().manual_seed(0), repeats=3, cache=cache,
                           prefix_depth=1)  # fmt: skip
        RewardModel(lm, None, adapter="a", seed=0)(q, r, None, 3)
    assert not [w for w in seen if "past_key_values" in str(w.message)], [str(w.message) for w in seen]


@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("top_reads", [True, False], ids=["top-at-reads", "top-whole"])
def test_the_last_response_token_is_not_run_and_what_is_read_is_unchanged(monkeypatch, make, top_reads):
    lm = make()
    if not top_reads:
        monkeypatch.setattr(trunk, "top_block_reads", lambda model: False)
    q = torch.tensor([[5, 6, 7, 8], [9, 10, PAD, PAD]])
    r = torch.randint(0, 300, (6, 5), generator=torch.Generator().manual_seed(1))
    r[1, 3:] = PAD  # truncated
    rows = q.repeat_interleave(3, 0)
    tokens = torch.cat([rows, r], 1)
    full = trunk.trunk_hidden(lm, tokens)  # every position, the last response token's too
    idx = trunk.response_positions(rows, r.shape[1])
    want = full.gather(1, idx.unsqueeze(-1).expand(-1, -1, full.shape[-1]))
    lengths = []
    block = trunk.trunk_blocks(lm)[0]
    block.register_forward_pre_hook(lambda m, a, k: lengths.append((a[0] if a else k["hidden_states"]).shape[1]),
                                    with_kwargs=True)  # fmt: skip
    pre = trunk.frozen_prefix(lm, tokens)
    lengths.clear()
    for got in (trunk.response_hidden(lm, rows, r), trunk.response_hidden(lm, rows, r, pre),
                trunk.response_hidden(lm, q, r, None, 3)):
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    L = tokens.shape[1]
    assert lengths and max(lengths) == L - 1  # the plain pass's rows, without their last token
