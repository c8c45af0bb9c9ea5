import copy
import dataclasses

import torch

from lmprefs.config import LoraConfig, preset
from lmprefs.models.lm import Policy, RewardModel, response_logits_hidden
from lmprefs.models.lora import add_adapter, lora_modules, merged_copy, using
from lmprefs.pipeline import setup_task
from lmprefs.queries import QueryStream
from lmprefs.training.policy import build_run, load_checkpoint, make_rollout, save_checkpoint
from lmprefs.training.ppo import ppo_update

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
    rollout, _, _ = make_rollout(run, lambda q, r: (r < 25000).float().mean(1), run.stream.next(16), cfg, [], [],
                                 t.device, t.dtype)  # fmt: skip
    ppo_update(lambda mb: policy(mb.queries, mb.responses), run.optimizer, rollout, cfg.ppo, run.gen_ppo)
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
