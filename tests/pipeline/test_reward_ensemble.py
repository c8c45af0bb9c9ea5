"""Reward-model ensembles (train_reward.ensemble K): K members trained in one command on one shared frozen prefix and
one set of normalization samples; member 0 is the reward model a run without an ensemble trains; saved as standard
reward-model directories plus ensemble.json; loaded as a RewardEnsemble whose mean scores wherever a reward model
does."""

import dataclasses
import json

import pytest
import torch

from lmprefs.config import preset
from lmprefs.models.artifacts import is_reward_model_dir, load_reward_model
from lmprefs.models.ensemble import (
    ENSEMBLE_FILE,
    RewardEnsemble,
    is_ensemble_dir,
    load_reward,
    member_seed,
)
from lmprefs.pipeline import reward_ensemble as ens_mod
from lmprefs.pipeline import reward_model as rm_mod
from lmprefs.pipeline.labeling import collect_labels, open_store
from lmprefs.pipeline.reward_ensemble import bootstrap_rows
from lmprefs.pipeline.reward_model import RewardState
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.task import setup_task
from lmprefs.training import prefix_share
from lmprefs.training import reward as reward_mod
from lmprefs.training.reward import member_rewards, rm_rewards

R = dataclasses.replace


def lora_cfg(K: int = 1, bootstrap: bool = False, epochs: int = 2, seed: int = 0):
    """The tiny preset with LoRA in its top block (the bottom one frozen, so the members share it)."""
    cfg = preset("tiny")
    return R(cfg, lora=R(cfg.lora, rank=4, layers=1), run=R(cfg.run, seed=seed),
             train_reward=R(cfg.train_reward, ensemble=K, bootstrap=bootstrap, epochs=epochs),
             labels=R(cfg.labels, heldout_fraction=0.2))  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("labels") / "labels.sqlite")
    collect_labels(setup_task(lora_cfg(), 8), s, 40, source="test")
    return s


def weights(rm, t) -> dict:
    """A reward model's own tensors (head, gain, bias) and its LoRA adapter's, by name."""
    own = RewardState(rm).state_dict()
    name = rm.adapter
    return own | {n.replace(f".{name}", ".ADAPTER"): p.detach().clone() for n, p in t.model.named_parameters()
                  if n.endswith(f".{name}")}  # fmt: skip


def test_ensemble_1_is_a_single_reward_model_and_member_0_of_an_ensemble_is_it_bitwise(store, tmp_path):
    t1 = setup_task(lora_cfg(1), 8)
    rm1, s1 = train_reward_model(t1, store, tmp_path / "one")
    assert not is_ensemble_dir(tmp_path / "one") and not (tmp_path / "one" / "member-0").exists()
    assert is_reward_model_dir(tmp_path / "one") and "members" not in s1
    t2 = setup_task(lora_cfg(2), 8)
    ens, s2 = train_reward_model(t2, store, tmp_path / "two")
    assert isinstance(ens, RewardEnsemble) and len(ens) == 2
    first, second = (weights(m, t2) for m in ens.models())
    mine = weights(rm1, t1)
    assert mine.keys() == first.keys() and len(mine) > 3
    for k in mine:  # member 0: run.seed's init, order and normalization samples, the same frozen prefix
        assert torch.equal(mine[k], first[k]), k
    assert any(not torch.equal(first[k], second[k]) for k in first)  # member 1 has its own seed
    assert s2["members"][0]["heldout/accuracy"] == s1["heldout/accuracy"]


def test_members_share_one_frozen_prefix_and_one_set_of_normalization_samples(store, tmp_path, monkeypatch):
    prefixes, samples = [], []
    compute, draw = prefix_share.label_prefixes, reward_mod.normalization_samples
    monkeypatch.setattr(prefix_share, "label_prefixes", lambda *a, **k: prefixes.append(1) or compute(*a, **k))
    monkeypatch.setattr(reward_mod, "normalization_samples", lambda *a, **k: samples.append(1) or draw(*a, **k))
    monkeypatch.setattr(rm_mod, "label_prefixes", lambda *a, **k: pytest.fail("a member ran the frozen blocks"))
    t = setup_task(lora_cfg(3, epochs=2), 8)
    ens, _ = train_reward_model(t, store, tmp_path / "three")
    assert len(prefixes) == 1  # the frozen blocks over every labeled row, once for the three members
    assert len(samples) == 2  # before and after training, once for the three members
    g = [float(m.gain) for m in ens.models()]
    assert len(set(g)) == 3  # each member normalized on its own


def test_a_saved_ensemble_loads_as_its_members_and_scores_by_their_mean(store, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from lmprefs.assets.models import resolve_model

    t = setup_task(lora_cfg(3, bootstrap=True), 8)
    ens, summary = train_reward_model(t, store, tmp_path / "ens")
    d = tmp_path / "ens"
    manifest = json.loads((d / ENSEMBLE_FILE).read_text())
    assert manifest["members"] == ["member-0", "member-1", "member-2"] and manifest["bootstrap"] is True
    assert manifest["seeds"] == [member_seed(0, k) for k in range(3)] and len(set(manifest["seeds"])) == 3
    assert [n["gain"] for n in manifest["normalization"]] == [float(m.gain) for m in ens.models()]
    assert all("norm_before" in n and "norm_after" in n for n in manifest["normalization"])
    loaded = load_reward(d)
    assert isinstance(loaded, RewardEnsemble) and len(loaded) == 3
    assert loaded.shares_base()  # adapters on one base, as in training: its frozen blocks run once for all three
    one_by_one = RewardEnsemble([load_reward_model(d / f"member-{k}") for k in range(3)])
    g = torch.Generator().manual_seed(0)
    q = t.ctx.format(torch.randint(100, 1000, (4, 6), generator=g))  # no PAD: transformers reads the rows as they are
    r = torch.randint(100, 1000, (4, 5), generator=g)
    with torch.no_grad():
        trained, saved = ens.member_scores(q, r), loaded.member_scores(q, r)  # [3, 4]
        assert trained.shape == (3, 4)
        assert torch.allclose(trained, saved, atol=2e-3 * (1 + trained.abs().max()))
        assert torch.allclose(one_by_one.member_scores(q, r), saved, atol=1e-4 * (1 + saved.abs().max()))
        assert torch.allclose(loaded(q, r), saved.mean(0)) and torch.allclose(RewardEnsemble.spread(saved),
                                                                              saved.std(0, unbiased=False))
        # each member a reward model as a single one is saved: its adapter in peft's format on the named base
        base_name = json.loads((d / "member-1" / "adapter_config.json").read_text())["base_model_name_or_path"]
        base = AutoModelForSequenceClassification.from_pretrained(resolve_model(base_name), num_labels=1,
                                                                  pad_token_id=50256)  # fmt: skip
        seq = PeftModel.from_pretrained(base, str(d / "member-1")).eval()
        tokens = torch.cat([q, r], dim=1)[:1]
        assert torch.allclose(seq(tokens).logits[0, 0], saved[1, 0], atol=2e-3 * (1 + saved[1, 0].abs()))
    assert summary["ensemble"] == 3 and len(summary["members"]) == 3 and "heldout/accuracy" in summary
    # in batches from the store's unformatted queries: each member as it scores alone, the frozen blocks run once
    queries, responses = t.train_queries[:5], t.train_queries[5:15, :6]  # best-of-2 rows
    each = member_rewards(ens, queries, responses, t.ctx, batch_size=4, repeats=2)  # [3, 10]
    alone = torch.stack([rm_rewards(m, queries, responses, t.ctx, batch_size=4, repeats=2) for m in ens.models()])
    assert each.shape == (3, 10) and torch.allclose(each, alone, atol=1e-5)
    assert torch.allclose(rm_rewards(ens, queries, responses, t.ctx, batch_size=4, repeats=2), alone.mean(0))


def test_bootstrap_resamples_differ_by_member_and_repeat_by_seed():
    a, b = bootstrap_rows(50, 0, 0), bootstrap_rows(50, 0, 1)
    assert a.shape == (50,) and int(a.max()) < 50 and len(set(a.tolist())) < 50  # drawn with replacement
    assert not torch.equal(a, b) and torch.equal(a, bootstrap_rows(50, 0, 0))
    assert not torch.equal(a, bootstrap_rows(50, 1, 0))


def test_bootstrap_trains_each_member_on_its_resample(store, tmp_path, monkeypatch):
    seen = []
    train = ens_mod.train_member
    monkeypatch.setattr(ens_mod, "train_member", lambda t, labels, *a, **k: seen.append(
        (labels.train.items, k["train"].items)) or train(t, labels, *a, **k))  # fmt: skip
    train_reward_model(setup_task(lora_cfg(2, bootstrap=True, epochs=1), 8), store, tmp_path / "b")
    for k, (items, resampled) in enumerate(seen):
        assert torch.equal(resampled, items[bootstrap_rows(len(items), 0, k)])
