"""Work shared between the reward models of an experiment's arms: frozen prefixes computed once for all of them, and
the untrained model's normalization and held-out figures once per seed. A reward model trained with them is bitwise
the one trained alone, and a row the shared prefixes lack falls back to computing."""

import dataclasses

import pytest
import torch

from lmprefs.config import preset
from lmprefs.pipeline import reward_model as rm_mod
from lmprefs.pipeline.labeling import collect_labels, open_store
from lmprefs.pipeline.reward_model import RewardState, shared_reward_prefixes
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.task import setup_task

R = dataclasses.replace
DTYPE = "bfloat16"  # as the SmolLM2 presets compute (bf16 autocast), where batch shapes could matter most


def arm_cfg(seed: int, n: int):
    """The tiny preset with LoRA in its top block (the bottom one frozen) and 2 epochs: the cached path."""
    cfg = preset("tiny")
    cfg = R(cfg, lora=R(cfg.lora, rank=4, layers=1), train_reward=R(cfg.train_reward, epochs=2),
            run=R(cfg.run, seed=seed, dtype=DTYPE))  # fmt: skip
    return R(cfg, labels=R(cfg.labels, num_train=n, subset_seed=seed, heldout_fraction=0.2))


def trained(cfg, store, out, shared=None, before=None):
    t = setup_task(cfg, 8)  # a fresh model, as every arm of an experiment has
    t.shared_prefixes, t.shared_before = shared, before
    rm, summary = train_reward_model(t, store, out)
    weights = RewardState(rm).state_dict() | {n: p.detach().clone() for n, p in t.model.named_parameters()
                                              if "reward" in n}  # fmt: skip
    return weights, {k: v for k, v in summary.items() if k != "seconds"}


@pytest.fixture(scope="module")
def store_and_shared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labels")
    store = open_store(tmp / "labels.sqlite")
    collect_labels(setup_task(arm_cfg(0, 8), 8), store, 40, source="test")
    configs = [arm_cfg(s, n) for s in (0, 1) for n in (8, 24)]  # two seeds, nested counts
    shared = shared_reward_prefixes(setup_task(configs[0], 8), store, configs)
    return store, configs, shared


def test_a_reward_model_from_shared_work_equals_one_from_its_own(store_and_shared, tmp_path, monkeypatch):
    store, configs, shared = store_and_shared
    assert shared is not None and shared.start == 1 and len(shared.items) <= 40
    assert shared.hidden.shape[0] == 4 * len(shared.items)  # best-of-4: four rows a question
    before: dict = {}
    calls = []
    normalize = rm_mod.normalize
    # seed 0's two counts in the experiment's order (the second takes the first's untrained figures), then seed 1's
    for i, cfg in enumerate((configs[0], configs[1], configs[3])):
        own = trained(cfg, store, tmp_path / f"own{i}")
        monkeypatch.setattr(rm_mod, "label_prefixes", lambda *a, **k: pytest.fail("computed its own prefixes"))
        monkeypatch.setattr(rm_mod, "normalize", lambda *a, i=i, **k: calls.append(i) or normalize(*a, **k))
        from_shared = trained(cfg, store, tmp_path / f"shared{i}", shared, before)
        monkeypatch.undo()
        # bitwise: the frozen blocks see each row alone (fixed shapes, no cross-row reduction), so a row's prefix
        # does not depend on the batch it was computed in; the untrained model is the same for every count of a seed
        assert own[0].keys() == from_shared[0].keys() and len(own[0]) > 3
        for k in own[0]:
            assert torch.equal(own[0][k], from_shared[0][k]), (i, k)
        assert own[1] == from_shared[1]
    assert calls == [0, 0, 1, 2, 2]  # normalized before and after; seed 0's second count only after


def test_rows_the_shared_prefixes_lack_are_computed(store_and_shared, tmp_path):
    store, configs, shared = store_and_shared
    from lmprefs.pipeline.reward_model import training_labels

    t = setup_task(configs[3], 8)
    train = training_labels(t, store).train
    rm = rm_mod.reward_frame(t)
    assert shared.for_data(rm, train) is not None
    missing = R(shared, items={k: v for k, v in shared.items.items() if k != int(train.items[0])})
    assert missing.for_data(rm, train) is None
    changed = R(shared, samples=shared.samples.clone())
    changed.samples[changed.items[int(train.items[0])], 0, 0] += 1  # another store's tokens under the same item id
    assert changed.for_data(rm, train) is None


def test_the_labeling_pass_keeps_the_prefixes_its_reward_model_trains_on(tmp_path, monkeypatch):
    """collect_labels(keep_prefixes=True) keeps the sampling pass's frozen prefix of every row it labels; a reward
    model trained on those labels takes its training and held-out rows from them, computing none of its own, and
    ends where one that computes its own ends (fp32: up to float rounding)."""
    cfg = R(arm_cfg(0, 24), run=R(arm_cfg(0, 24).run, dtype="float32"))
    store = open_store(tmp_path / "labels.sqlite")
    out = collect_labels(setup_task(cfg, 8), store, 30, source="test", keep_prefixes=True)
    kept = out["prefixes"]
    assert kept is not None and kept.start == 1 and kept.hidden.shape[:2] == (4 * 30, kept.queries.shape[1] + 8)
    own = trained(cfg, store, tmp_path / "own")
    seen = []
    evaluate = rm_mod.evaluate
    monkeypatch.setattr(rm_mod, "label_prefixes", lambda *a, **k: pytest.fail("computed its own prefixes"))
    monkeypatch.setattr(rm_mod, "evaluate", lambda *a, **k: seen.append(k["prefixes"]) or evaluate(*a, **k))
    from_labeling = trained(cfg, store, tmp_path / "kept", kept)
    assert len(seen) == 2 and all(s is not None for s in seen)  # held out: before and after training
    # Adam steps lr-sized even where a gradient is near 0, and the gain and bias are large: rounding, not a drift
    for k in own[0]:
        a, b = own[0][k], from_labeling[0][k]
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), (k, a - b)
    assert own[1]["heldout/accuracy"] == from_labeling[1]["heldout/accuracy"]
    assert own[1]["heldout/loss"] == pytest.approx(from_labeling[1]["heldout/loss"], abs=1e-4)
