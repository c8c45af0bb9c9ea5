import copy
import dataclasses

import pytest
import torch
from torch import nn

from lmprefs.config import LoraConfig, preset
from lmprefs.data.queries import QueryStream
from lmprefs.data.tasks import TaskContext
from lmprefs.models.lora import LoRALinear, add_adapter, lora_modules, merged_copy, using
from lmprefs.models.policy import Policy
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.trunk import frozen_prefix, response_logits_hidden
from lmprefs.pipeline.task import setup_task
from lmprefs.training.policy_checkpoint import load_checkpoint, save_checkpoint
from lmprefs.training.policy_run import build_run
from lmprefs.training.ppo import ppo_update
from lmprefs.training.rollout import make_rollout

R = dataclasses.replace


def _queries(tok):
    return torch.tensor([tok(" It was a fine morning and").input_ids, tok(" She said that she would not").input_ids])


def test_adapters_start_as_identity_and_switch_per_role(tiny_lm):
    base, tok = tiny_lm
    lm = copy.deepcopy(base)
    cfg = LoraConfig(rank=4, alpha=8, targets=("c_attn", "c_proj"))
    add_adapter(lm, cfg, "policy")
    add_adapter(lm, cfg, "reward", seed=1)
    assert len(lora_modules(lm)) == 2 * 3  # 2 layers x (attn.c_attn, attn.c_proj, mlp.c_proj)
    assert all(not p.requires_grad for n, p in lm.named_parameters() if ".A." not in n and ".B." not in n)
    q = _queries(tok)
    r = torch.randint(0, 50000, (2, 6))
    with torch.no_grad():
        plain = response_logits_hidden(base, q, r)[1]
        with using(lm, "policy"):
            adapted = response_logits_hidden(lm, q, r)[1]
    assert torch.allclose(plain, adapted, atol=1e-6)  # B = 0: an adapter starts as the identity
    for m in lora_modules(lm):
        torch.nn.init.normal_(m.B["policy"], std=0.1)
    with torch.no_grad():
        with using(lm, "policy"):
            moved = response_logits_hidden(lm, q, r)[1]
        with using(lm, None):
            ref = response_logits_hidden(lm, q, r)[1]
        with using(lm, "reward"):
            other = response_logits_hidden(lm, q, r)[1]
        merged = response_logits_hidden(merged_copy(lm, "policy"), q, r)[1]
    assert not torch.allclose(moved, plain, atol=1e-3)
    assert torch.allclose(ref, plain, atol=1e-6) and torch.allclose(other, plain, atol=1e-6)
    assert torch.allclose(merged, moved, atol=1e-4)  # the exported model is the adapted policy


def test_lora_ppo_trains_only_adapters_and_checkpoints_exactly(tmp_path):
    cfg = preset("tiny")
    cfg = R(cfg, lora=R(cfg.lora, rank=4), ppo=R(cfg.ppo, value_model="separate"))
    t = setup_task(cfg, n_heldout=8)
    base_before = {k: v.clone() for k, v in t.model.state_dict().items()}
    add_adapter(t.model, cfg.lora, "policy")
    add_adapter(t.model, cfg.lora, "value", seed=1)
    policy = Policy(t.model, t.tok, cfg.task.temperature, adapter="policy", value_adapter="value")
    run = build_run(cfg, policy, QueryStream(t.train_queries, 1), t.device)
    assert run.ref_lm is None  # the reference is the base with adapters off: no second copy
    rollout, _, _ = make_rollout(run, lambda q, r, _: (r < 25000).float().mean(1), run.stream.next(16), cfg,
                                 TaskContext([], [], t.device, t.dtype))  # fmt: skip
    ppo_update(lambda mb: policy(mb.queries, mb.responses), run.optimizers, rollout, cfg.ppo, run.gen_ppo)
    after = {k.replace(".base.", "."): v for k, v in t.model.state_dict().items()}
    assert all(torch.equal(after[k], v) for k, v in base_before.items())  # base weights untouched
    changed = [m.B["policy"].abs().sum() > 0 for m in lora_modules(t.model)]
    assert all(changed) and all(m.B["value"].abs().sum() > 0 for m in lora_modules(t.model))
    save_checkpoint(run, tmp_path)
    fresh = setup_task(cfg, n_heldout=8)
    add_adapter(fresh.model, cfg.lora, "policy")
    add_adapter(fresh.model, cfg.lora, "value", seed=1)
    p2 = Policy(fresh.model, fresh.tok, cfg.task.temperature, adapter="policy", value_adapter="value")
    run2 = build_run(cfg, p2, QueryStream(fresh.train_queries, 1), fresh.device)
    load_checkpoint(run2, tmp_path)
    a, b = t.model.state_dict(), fresh.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(policy.value_head.linear.weight, p2.value_head.linear.weight)


def test_reward_model_adapter_trains_on_shared_base(tiny_lm):
    base, tok = tiny_lm
    lm = copy.deepcopy(base)
    add_adapter(lm, LoraConfig(rank=2), "reward")
    rm = RewardModel(lm, tok, adapter="reward")
    names = {id(p) for p in rm.trainable_parameters()}
    assert all(id(m.A["reward"]) in names for m in lora_modules(lm)) and id(rm.gain) in names
    assert not any(id(p) in names for n, p in lm.named_parameters() if ".base." in n)


def test_adapters_in_the_top_blocks_only_stop_the_backward_there(tiny_lm):
    base, tok = tiny_lm
    lm = copy.deepcopy(base)
    add_adapter(lm, LoraConfig(rank=2, layers=1, targets=("c_attn", "c_proj")), "policy")
    names = [n for n, m in lm.named_modules() if type(m).__name__ == "LoRALinear"]
    assert names and all(".h.1." in n for n in names)  # block 1 of 2 only
    policy = Policy(lm, tok, 0.7, adapter="policy")
    lp, v, _ = policy(_queries(tok), torch.randint(0, 50000, (2, 4)))
    (lp.sum() + v.sum()).backward()
    assert all(p.grad is not None for p in policy.trainable_parameters())
    assert all(p.grad is None for n, p in lm.named_parameters() if ".h.0." in n)  # nothing below was touched


def _tiny_llama():
    """A random 4-block Llama (SmolLM2's architecture) built offline, with rotary positions and RMSNorm."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def test_frozen_prefix_gives_the_full_forward_exactly(tiny_lm):
    from lmprefs.models.trunk import frozen_depth, frozen_prefix, trunk_hidden

    for lm, top in ((copy.deepcopy(tiny_lm[0]), 1), (_tiny_llama(), 2)):  # GPT-2 (additive positions) and Llama
        assert frozen_prefix(lm, torch.zeros(1, 3, dtype=torch.long)) is None  # no adapters: nothing is frozen
        add_adapter(lm, LoraConfig(rank=2, layers=top), "a")
        for m in lora_modules(lm):
            torch.nn.init.normal_(m.B["a"], std=0.1)
        n_blocks = lm.config.num_hidden_layers
        assert frozen_depth(lm) == n_blocks - top
        tokens = torch.randint(0, 200, (3, 9))
        tokens[0, :2] = -1  # left padding
        cut = tokens.clone()
        cut[1, 6:] = -1  # a truncated response: pads after the last real token
        with torch.no_grad():
            prefix = frozen_prefix(lm, tokens)
            for adapter in ("a", None):  # the policy and the reference share it
                with using(lm, adapter):
                    assert torch.equal(trunk_hidden(lm, tokens, prefix), trunk_hidden(lm, tokens))
                    assert torch.equal(trunk_hidden(lm, cut, prefix)[1, :6], trunk_hidden(lm, cut)[1, :6])
            other = copy.deepcopy(lm)  # a prefix of another model is ignored, not misused
            assert torch.equal(trunk_hidden(other, tokens, prefix), trunk_hidden(other, tokens))
        assert len(lm.base_model.get_submodule("layers" if hasattr(lm.base_model, "layers") else "h")) == n_blocks


def test_reward_model_runs_a_questions_query_once_for_its_samples(tiny_lm):
    """A best-of-S question's samples share their query: RewardModel(q, r, prefix, repeats=S) runs each query once
    (its keys and values copied for the S samples; the frozen prefix and the evaluation's reference logits likewise)
    and gives the rewards and gradients of the S repeated rows, padded queries and truncated responses included, on
    GPT-2 and Llama."""
    from lmprefs.models.reward_model import RewardModel
    from lmprefs.models.trunk import (
        frozen_prefix,
        frozen_prefix_shared,
        response_logits_hidden,
        shared_query_trunk,
        trunk_hidden,
    )

    for lm in (copy.deepcopy(tiny_lm[0]).eval(), _tiny_llama()):
        q = torch.tensor([[5, 6, 7, 8], [-1, -1, 9, 10], [11, 12, -1, -1]])
        r = torch.randint(1, 200, (6, 5))
        r[1, 3:] = -1  # truncated responses
        r[4, 2:] = -1
        tokens = torch.cat([q.repeat_interleave(2, 0), r], 1)
        real = tokens != -1
        with torch.no_grad():
            assert torch.allclose(shared_query_trunk(lm, q, r, 2)[real], trunk_hidden(lm, tokens)[real], atol=1e-5)
            _, logits = response_logits_hidden(lm, q.repeat_interleave(2, 0), r)  # the evaluation's reference pass
            assert torch.allclose(response_logits_hidden(lm, q, r, None, 2)[1], logits, atol=1e-5)
        add_adapter(lm, LoraConfig(rank=2, layers=1), "rm")
        for m in lora_modules(lm):
            torch.nn.init.normal_(m.B["rm"], std=0.1)
        plain, shared = frozen_prefix(lm, tokens), frozen_prefix_shared(lm, q, r, 2)
        assert shared.start == plain.start and torch.allclose(shared.hidden[real], plain.hidden[real], atol=1e-5)
        rm = RewardModel(lm, None, adapter="rm", seed=0)
        params = rm.trainable_parameters()
        want = rm(q.repeat_interleave(2, 0), r, plain)
        grads = torch.autograd.grad(want.pow(2).sum(), params)
        for pre in (shared, None):
            got = rm(q, r, pre, repeats=2)
            assert torch.allclose(got, want, atol=1e-5), (got, want)
            for a, b in zip(torch.autograd.grad(got.pow(2).sum(), params), grads, strict=True):
                assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


def test_lora_rollout_with_the_frozen_prefix_matches_full_forwards():
    from lmprefs.data.tasks import apply_penalty, truncate_responses
    from lmprefs.training.rollout import ref_logprobs, rm_score_fn

    cfg = preset("tiny")
    cfg = R(cfg, lora=R(cfg.lora, rank=4, layers=1))
    t = setup_task(cfg, n_heldout=8)
    add_adapter(t.model, cfg.lora, "policy")
    add_adapter(t.model, cfg.lora, "reward", seed=1)
    for m in lora_modules(t.model):
        torch.nn.init.normal_(m.B["policy"], std=0.05)
        torch.nn.init.normal_(m.B["reward"], std=0.05)
    policy = Policy(t.model, t.tok, cfg.task.temperature, adapter="policy")
    rm = RewardModel(t.model, t.tok, adapter="reward", seed=3)
    run = build_run(cfg, policy, QueryStream(t.train_queries, 1), t.device)
    rollout, _, _ = make_rollout(run, rm_score_fn(rm), run.stream.next(8), cfg, t.ctx)
    assert rollout.prefix is not None and rollout[2:5].prefix.hidden.shape[0] == 3
    q, r = rollout.queries, rollout.responses
    # the prefix is the sampler's, computed a position at a time: the same values up to float rounding (fp32 here)
    with torch.no_grad(), using(t.model, None):
        want = ref_logprobs(t.model, q, r, cfg.task.temperature, policy.vocab)
        assert torch.allclose(rollout.ref_logprobs, want, atol=1e-5)
    post = truncate_responses(r, cfg.task.truncate_token, cfg.task.truncate_after)
    with torch.no_grad():  # rows with PAD included
        assert torch.allclose(rollout.scores, apply_penalty(rm(q, post), post, cfg.task), atol=1e-5)
        for a, b in zip(policy(q, r, rollout.prefix), policy(q, r), strict=True):
            assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_gpt2_gelu_runs_as_one_kernel_and_computes_the_same_function(tiny_lm):
    from transformers import AutoModelForCausalLM

    from lmprefs.assets.models import resolve_model

    lm, tok = tiny_lm
    assert lm.config.activation_function == "gelu_pytorch_tanh"
    reference = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-gpt2")).eval()  # HF's own: gelu_new
    assert reference.config.activation_function == "gelu_new"
    q, r = _queries(tok), torch.randint(0, 50000, (2, 6))
    with torch.no_grad():
        ours, theirs = response_logits_hidden(lm, q, r)[1], response_logits_hidden(reference, q, r)[1]
    assert (ours - theirs).abs().max() < 1e-4 and not torch.equal(ours, theirs)


def test_ppo_update_on_the_frozen_prefix_equals_the_full_forward():
    cfg = preset("tiny")
    cfg = R(cfg, lora=R(cfg.lora, rank=4, layers=1))

    def one_update(use_prefix: bool) -> dict:
        t = setup_task(cfg, n_heldout=8)
        add_adapter(t.model, cfg.lora, "policy")
        policy = Policy(t.model, t.tok, cfg.task.temperature, adapter="policy")
        run = build_run(cfg, policy, QueryStream(t.train_queries, 1), t.device)
        rollout, _, _ = make_rollout(run, lambda q, r, _: (r < 25000).float().mean(1), run.stream.next(16), cfg,
                                     TaskContext([], [], t.device, t.dtype))  # fmt: skip
        # the prefix as the batched forward computes it (the sampler's equals it up to rounding: test_sampling)
        rows = torch.cat([rollout.queries, rollout.responses], dim=1)
        rollout = R(rollout, prefix=frozen_prefix(t.model, rows))
        stats = ppo_update(lambda mb: policy(mb.queries, mb.responses, mb.prefix if use_prefix else None),
                           run.optimizer, rollout, cfg.ppo, run.gen_ppo)  # fmt: skip
        return {"stats": stats, "adapters": {k: v.clone() for k, v in t.model.state_dict().items() if ".B." in k}}

    # equal up to rounding, not bitwise: a minibatch's forward runs the bottom blocks on fewer rows than the
    # prefix's, and MKL's AVX2 kernels round some row counts differently (8 x 31 against 16 x 31 rows, 1e-5 apart)
    a, b = one_update(True), one_update(False)
    assert a["stats"] == pytest.approx(b["stats"], rel=1e-4, abs=1e-6)
    assert all(torch.allclose(v, b["adapters"][k], rtol=0, atol=1e-6) for k, v in a["adapters"].items())
    assert any(v.abs().sum() > 0 for v in a["adapters"].values())  # the update did move the adapters


def test_lora_under_autocast_matches_the_fp32_adapter_path():
    """Under bf16 autocast an adapter reads its bf16 input as it is (the matmul casts for itself): the output and
    the gradients equal those of the input first widened to fp32 and cast back by autocast, to the bit."""
    torch.manual_seed(0)
    m = LoRALinear(nn.Linear(48, 32, bias=False).requires_grad_(False), rank=4, alpha=8)
    m.add("p")
    m.active = "p"
    with torch.no_grad():
        m.B["p"].normal_()
    x = torch.randn(16, 48).bfloat16()

    def run(widen: bool):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", torch.bfloat16):
            if widen:  # the input widened to fp32 first, which autocast then casts back for the matmul
                y = m.base(xi) + (xi.float() @ m.A["p"].t() @ m.B["p"].t()) * m.scale
            else:
                y = m(xi)
        y.float().square().sum().backward()
        grads = [xi.grad, m.A["p"].grad.clone(), m.B["p"].grad.clone()]
        m.A["p"].grad = m.B["p"].grad = None
        return [y.detach(), *grads]

    for ours, widened in zip(run(False), run(True), strict=True):
        assert torch.equal(ours, widened)
