"""Saved models are standard artifacts: LoRA adapters in peft's format, a
reward model that AutoModelForSequenceClassification loads with lmprefs' scores, a generation_config.json with the
training temperature, and reward models from elsewhere (TRL's layout) loadable as rewards.trained_model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmprefs.config import LoraConfig
from lmprefs.data.tasks import PAD
from lmprefs.models.artifacts import (
    is_reward_model_dir,
    load_policy,
    load_reward_model,
    save_policy,
    save_reward_model,
)
from lmprefs.models.loading import load_lm
from lmprefs.models.lora import add_adapter, using
from lmprefs.models.policy import Policy
from lmprefs.models.reward_model import RewardModel


def _randomize_adapter(model, name: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    from lmprefs.models.lora import lora_modules

    with torch.no_grad():
        for m in lora_modules(model):
            m.B[name].normal_(0, 0.5, generator=g)


@pytest.fixture()
def lora_policy():
    lm, tok = load_lm("tiny-gpt2")
    add_adapter(lm, LoraConfig(rank=4, alpha=8.0, layers=1), "policy", seed=1)
    _randomize_adapter(lm, "policy", 2)
    return Policy(lm, tok, 0.7, adapter="policy")


def test_lora_policy_saves_peft_adapters_and_a_merged_model_once(lora_policy, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, GenerationConfig

    ids = torch.randint(0, 50257, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), using(lora_policy.lm, "policy"):
        want = lora_policy.lm(ids).logits
    save_policy(lora_policy, tmp_path / "final")  # the end of a run: adapters and the merged model
    peft_model = PeftModel.from_pretrained(load_lm("tiny-gpt2")[0], str(tmp_path / "final" / "adapter")).eval()
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, want, atol=1e-5)
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final").eval()
        assert torch.allclose(merged(ids).logits, want, atol=1e-5)
    gen = GenerationConfig.from_pretrained(tmp_path / "final")
    assert (gen.do_sample, gen.temperature, gen.top_k) == (True, 0.7, 0)
    cfg = json.loads((tmp_path / "final" / "adapter" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8.0 and cfg["fan_in_fan_out"]

    # a checkpoint's policy holds the adapters only: a few KB instead of another copy of the model
    from lmprefs.models.artifacts import _save_policy

    (tmp_path / "ckpt").mkdir()
    _save_policy(lora_policy, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "model.safetensors").exists()
    size = sum(p.stat().st_size for p in (tmp_path / "ckpt").rglob("*.safetensors"))
    assert size < (tmp_path / "final" / "model.safetensors").stat().st_size / 20
    with torch.no_grad():
        assert torch.allclose(load_policy(tmp_path / "ckpt").lm(ids).logits, want, atol=1e-5)


@pytest.mark.parametrize("lora", [False, "merged", "adapter"])
def test_reward_model_loads_as_a_sequence_classifier_with_lmprefs_scores(lora, tmp_path):
    """Full fine-tuning and a merged LoRA reward model: a whole classifier; a LoRA one by default: its adapter and
    head in peft's format, ~1% of the size, loaded by the same call with num_labels=1."""
    from transformers import AutoModelForSequenceClassification

    lm, tok = load_lm("tiny-gpt2")
    if lora:
        add_adapter(lm, LoraConfig(rank=4, alpha=8.0), "reward", seed=1)
        _randomize_adapter(lm, "reward", 3)
    rm = RewardModel(lm, tok, adapter="reward" if lora else None, seed=0).eval()
    with torch.no_grad():
        rm.gain.fill_(2.5)
        rm.bias.fill_(-0.7)
        rm.head.linear.bias.fill_(0.3)
    g = torch.Generator().manual_seed(0)
    q, r = torch.randint(0, 50257, (3, 6), generator=g), torch.randint(0, 50257, (3, 5), generator=g)
    r[0, 3:] = PAD  # a truncated response: the reward is read at its last real token
    with torch.no_grad():
        want = rm(q, r)
    save_reward_model(rm, tmp_path / "rm", extra={"task": {}}, merged=lora != "adapter")
    assert is_reward_model_dir(tmp_path / "rm")
    if lora == "adapter":
        from peft import PeftModel

        from lmprefs.assets.models import resolve_model

        assert not (tmp_path / "rm" / "model.safetensors").exists()
        size = (tmp_path / "rm" / "adapter_model.safetensors").stat().st_size
        assert size < resolve_model_size("tiny-gpt2") / 20
        # the adapter names its base by the asset name: plain transformers loads the asset's directory, then peft
        base = AutoModelForSequenceClassification.from_pretrained(resolve_model("tiny-gpt2"), num_labels=1,
                                                                  pad_token_id=50256)  # fmt: skip
        seq = PeftModel.from_pretrained(base, str(tmp_path / "rm"))
    else:
        seq = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    seq.eval()
    pad = seq.config.pad_token_id
    ids = torch.cat([q, r], 1)
    with torch.no_grad():  # right padding with the config's pad id, as a transformers user would batch
        got = seq(input_ids=torch.where(ids == PAD, pad, ids), attention_mask=(ids != PAD).long()).logits[:, 0]
        assert torch.allclose(got, want, atol=1e-4), (got, want)
        assert torch.allclose(load_reward_model(tmp_path / "rm").eval()(q, r), want, atol=1e-4)


def resolve_model_size(name: str) -> int:
    from lmprefs.assets.models import resolve_model

    return (Path(resolve_model(name)) / "model.safetensors").stat().st_size


def test_a_plain_sequence_classifier_is_a_trained_reward_model(tmp_path, capsys):
    """A reward model saved the way TRL's RewardTrainer saves one (num_labels=1, no lmprefs files) scores in
    lmprefs and drives train-policy as rewards.trained_model, normalized on initial-policy samples as lmprefs'
    own reward models are (its scale is arbitrary), which the run says."""
    from transformers import GPT2ForSequenceClassification

    from lmprefs.cli.dispatch import main

    base_dir = load_lm("tiny-gpt2")[0].config.name_or_path
    seq = GPT2ForSequenceClassification.from_pretrained(base_dir, num_labels=1, pad_token_id=50256).eval()
    seq.save_pretrained(tmp_path / "trl_rm")
    load_lm("tiny-gpt2")[1].save_pretrained(tmp_path / "trl_rm")
    rm = load_reward_model(tmp_path / "trl_rm").eval()
    ids = torch.randint(0, 50257, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(rm(ids[:, :4], ids[:, 4:]), seq(ids).logits[:, 0], atol=1e-5)
    args = ["train-policy", "tiny", "--rewards.trained-model", str(tmp_path / "trl_rm"), "--run-dir",
            str(tmp_path / "run"), "--ppo.total-episodes", "16"]  # fmt: skip
    assert main(args) == 0
    assert (tmp_path / "run" / "policy" / "model.safetensors").is_file()
    assert f"rewards.trained_model={tmp_path / 'trl_rm'}: not trained by lmprefs (no lmprefs.json): normalized with " \
        "mean" in capsys.readouterr().out

    from lmprefs.config import preset
    from lmprefs.pipeline.rewards import normalize_foreign
    from lmprefs.pipeline.task import setup_task
    from lmprefs.runtime.distributed import rank_seed
    from lmprefs.training.reward import normalization_samples, rm_rewards

    t = setup_task(preset("tiny"))
    normalize_foreign(t, rm, tmp_path / "trl_rm")
    gen = torch.Generator().manual_seed(rank_seed(t.cfg.run.seed) + 2)  # the samples normalize_foreign drew
    q, r, _ = normalization_samples(t.model, t.tok, t.train_queries, t.cfg, t.ctx, gen)
    rewards = rm_rewards(rm, q, r, t.ctx).double()
    assert abs(rewards.mean().item()) < 1e-4 and abs(rewards.std(unbiased=False).item() - 1) < 1e-4


def test_lora_exports_keep_the_base_models_dtype(tmp_path):
    """lmprefs trains in fp32, but a merged export of a bf16 base (the merged policy, a merged
    reward model) is written in bf16, not as an fp32 copy twice the size; the adapters stay fp32 as trained."""
    from safetensors import safe_open

    lm, tok = load_lm("tiny-gpt2")
    lm.to(torch.bfloat16).save_pretrained(tmp_path / "bf16_base")
    tok.save_pretrained(tmp_path / "bf16_base")
    lm, tok = load_lm(str(tmp_path / "bf16_base"))
    assert next(lm.parameters()).dtype == torch.float32  # trained in fp32
    add_adapter(lm, LoraConfig(rank=4, alpha=8.0), "policy", seed=1)
    add_adapter(lm, LoraConfig(rank=4, alpha=8.0), "reward", seed=1)
    save_policy(Policy(lm, tok, 0.7, adapter="policy"), tmp_path / "policy")
    save_reward_model(RewardModel(lm, tok, adapter="reward", seed=0), tmp_path / "rm", merged=True)

    def dtypes(f):
        with safe_open(str(f), "pt") as s:
            return {s.get_slice(k).get_dtype() for k in s.keys()}

    assert dtypes(tmp_path / "policy" / "model.safetensors") == {"BF16"}
    assert dtypes(tmp_path / "rm" / "model.safetensors") == {"BF16"}
    assert dtypes(tmp_path / "policy" / "adapter" / "adapter_model.safetensors") == {"F32"}


def test_adapters_name_their_base_without_a_local_path_and_load_back_anywhere(tmp_path, monkeypatch):
    """An asset by its name (lmprefs resolves it on any machine; its cache directory is this machine's), a local
    directory by its own name, never its absolute path (lmprefs.json keeps the path for loading here); lmprefs
    loads each adapter back from elsewhere."""
    from lmprefs.models.artifacts import _save_policy

    lm, tok = load_lm("tiny-gpt2")
    lm.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    (tmp_path / "elsewhere").mkdir()
    ids = torch.randint(0, 50257, (2, 8), generator=torch.Generator().manual_seed(0))
    for name, base in (("tiny-gpt2", "tiny-gpt2"), ("base", "base")):
        monkeypatch.chdir(tmp_path)
        lm, tok = load_lm(name)
        add_adapter(lm, LoraConfig(rank=2, alpha=4.0), "policy", seed=1)
        add_adapter(lm, LoraConfig(rank=2, alpha=4.0), "reward", seed=2)
        _randomize_adapter(lm, "policy", 3)
        (tmp_path / f"ckpt-{name}").mkdir()
        _save_policy(Policy(lm, tok, 0.7, adapter="policy"), tmp_path / f"ckpt-{name}")  # adapters only
        rm = RewardModel(lm, tok, adapter="reward", seed=0).eval()
        save_reward_model(rm, tmp_path / f"rm-{name}", merged=False)
        for d in (tmp_path / f"ckpt-{name}" / "adapter", tmp_path / f"rm-{name}"):
            assert json.loads((d / "adapter_config.json").read_text())["base_model_name_or_path"] == base
        with torch.no_grad(), using(lm, "policy"):
            want = lm(ids).logits
        with torch.no_grad():
            want_rm = rm(ids[:, :4], ids[:, 4:])
        monkeypatch.chdir(tmp_path / "elsewhere")
        with torch.no_grad():
            assert torch.allclose(load_policy(tmp_path / f"ckpt-{name}").lm(ids).logits, want, atol=1e-5)
            got_rm = load_reward_model(tmp_path / f"rm-{name}").eval()(ids[:, :4], ids[:, 4:])
            assert torch.allclose(got_rm, want_rm, atol=1e-4)


def test_a_reward_model_that_scores_everything_alike_is_refused_in_one_line(tmp_path, capsys):
    from transformers import GPT2ForSequenceClassification

    from lmprefs.cli.dispatch import main

    lm, tok = load_lm("tiny-gpt2")
    seq = GPT2ForSequenceClassification.from_pretrained(lm.config.name_or_path, num_labels=1, pad_token_id=50256)
    with torch.no_grad():
        seq.score.weight.zero_()  # an untrained head: every text scores 0
    seq.save_pretrained(tmp_path / "flat_rm")
    tok.save_pretrained(tmp_path / "flat_rm")
    run = tmp_path / "run"
    assert main(["train-policy", "tiny", "--rewards.trained-model", str(tmp_path / "flat_rm"), "--run-dir",
                 str(run)]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "it cannot rank responses" in err[0] and not run.exists(), err
