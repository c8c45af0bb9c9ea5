"""A saved ensemble of LoRA reward models loads as adapters on one copy of its base, its members scoring as the
trained ones did and as each loaded alone does: GPT-2 (the head's constant folded into the final norm's bias) in
tests/pipeline/test_reward_ensemble.py, Llama (RMSNorm has no bias: the constant kept in lmprefs.json) here."""

import torch

from lmprefs.config import LoraConfig
from lmprefs.models.artifacts import load_reward_model
from lmprefs.models.ensemble import RewardEnsemble, load_reward_ensemble, save_reward_ensemble
from lmprefs.models.lora import add_adapter, lora_modules
from lmprefs.models.reward_model import RewardModel


def _tiny_llama_dir(tmp_path):
    """A random 4-block Llama (SmolLM2's architecture) saved with the GPT-2 tokenizer, as a local base model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmprefs.assets.tokenizers import gpt2_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    d = tmp_path / "llama"
    LlamaForCausalLM(cfg).save_pretrained(d)
    gpt2_tokenizer().save_pretrained(d)
    return d


def test_a_llama_lora_ensemble_loads_on_one_base_with_each_members_constant(tmp_path):
    from lmprefs.models.loading import load_lm

    lm, tok = load_lm(str(_tiny_llama_dir(tmp_path)))
    members = []
    for k in range(3):
        name = "reward" if k == 0 else f"reward_{k}"
        add_adapter(lm, LoraConfig(rank=2, alpha=4.0, layers=2), name, seed=k)
        rm = RewardModel(lm, tok, adapter=name, seed=k)
        with torch.no_grad():  # trained-looking: adapters away from the identity, a gain and bias set
            for m in lora_modules(lm):
                m.B[name].normal_(0, 0.5, generator=torch.Generator().manual_seed(10 + k))
            rm.head.linear.bias.fill_(0.3 * k - 0.2)
            rm.set_norm(0.5 + k, 2.0 + k)
        members.append(rm)
    trained = RewardEnsemble(members).eval()
    task = {"query_prefix": "", "query_suffix": "", "query_length": 8, "response_length": 8}
    save_reward_ensemble(members, tmp_path / "ens", [{"task": task}] * 3, {"seeds": [0, 1, 2]}, merged=False)
    loaded = load_reward_ensemble(tmp_path / "ens").eval()
    assert loaded.shares_base() and len(loaded) == 3
    g = torch.Generator().manual_seed(0)
    q, r = torch.randint(100, 1000, (4, 6), generator=g), torch.randint(100, 1000, (8, 5), generator=g)
    with torch.no_grad():
        want = trained.member_scores(q, r, repeats=2)  # [3, 8]
        got = loaded.member_scores(q, r, repeats=2)
        alone = torch.stack([load_reward_model(tmp_path / "ens" / f"member-{k}").eval()(q, r, repeats=2)
                             for k in range(3)])  # fmt: skip
    assert want.shape == (3, 8) and len({round(float(x), 3) for x in want[:, 0]}) == 3  # three different members
    assert torch.allclose(got, want, atol=1e-4 * (1 + want.abs().max()))
    assert torch.allclose(alone, want, atol=1e-4 * (1 + want.abs().max()))
