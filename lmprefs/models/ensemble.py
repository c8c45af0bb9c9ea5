"""Reward-model ensembles: K reward models scored together.

Interface (for query selection and anything else that needs the members' disagreement):

- `RewardEnsemble(members)`: an nn.Module over K `RewardModel`s. `member_scores(queries, responses, prefix=None,
  repeats=1) -> Tensor [K, B]` takes what `RewardModel.forward` takes (formatted queries [B / k, Q] with the task's
  prefix and suffix, `TaskContext.format`, and token responses [B, T], PAD right; `repeats` = k responses per
  query) and gives each member's normalized reward. `forward(...)` is their mean [B], so an ensemble scores
  wherever a reward model does (`rm_rewards`, `evaluate`); `forward(..., members=True)` is `member_scores`, what
  `rm_score_fn` scores a policy's rollouts with (reduced by rewards.ensemble_reduce, training/conservative.py).
  `mean(scores)` / `spread(scores)` [B]: the mean and the standard deviation over members (population, over K).
  Members that are LoRA adapters on one base share its frozen prefix: the blocks below the adapters run once per
  batch for all K.
- `lmprefs.training.reward.member_rewards(rm, queries, responses, ctx, batch_size, repeats)` -> [K, B * k]: the
  same in batches, from unformatted queries [B, Q] (PAD right) as the label store and the samplers hold them.
- `train_reward_model(t, store, out_dir)` (lmprefs.pipeline.reward_model) returns a RewardEnsemble when
  train_reward.ensemble > 1 (a RewardModel otherwise), its members sharing t.model's base under LoRA.
- `load_reward(path, device)`: a reward-model directory -> RewardModel, an ensemble directory -> RewardEnsemble.
  `is_ensemble_dir(path)`: whether `path` holds an ensemble.
- On disk an ensemble is one published directory: `member-0/` .. `member-{K-1}/`, each a reward-model directory as
  `save_reward_model` writes it (transformers/peft load each as they load a single one), and `ensemble.json`
  (`ENSEMBLE_FILE`): {"kind": "reward_ensemble", "members": [dir names], "seeds": [...], "bootstrap": bool,
  "normalization": [{"gain", "bias", "norm_before", "norm_after"} per member], "summary": {...}}.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from lmprefs.errors import UserError
from lmprefs.models.artifacts import (
    adapter_base,
    atomic_dir,
    is_reward_model_dir,
    load_reward_model,
    verified,
    write_reward_model,
)
from lmprefs.models.loading import _trunk_names, load_lm
from lmprefs.models.lora import load_peft_adapter
from lmprefs.models.model_card import CardInfo
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.trunk import FrozenPrefix, frozen_depth, frozen_prefix, frozen_prefix_shared

ENSEMBLE_FILE = "ensemble.json"
"""The manifest of an ensemble directory: its members, their seeds and normalization."""


def member_seed(seed: int, k: int) -> int:
    """The initialization seed of member k of an ensemble trained with run.seed `seed`: member 0 takes `seed` itself
    (an ensemble's first member is the reward model a single run trains), the others seeds far from it and from
    each other's neighbours (run.seed + 1 is another run's seed)."""
    return seed if k == 0 else (seed + 1_000_003 * k) % 2**63


def member_name(k: int) -> str:
    """The directory of member k inside an ensemble directory."""
    return f"member-{k}"


class RewardEnsemble(nn.Module):
    """K reward models; rewards are their mean (`forward`), each member's are `member_scores` [K, B]."""

    def __init__(self, members: list[RewardModel]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def __len__(self) -> int:
        return len(self.members)

    def models(self) -> list[RewardModel]:
        """The members, in order."""
        return cast("list[RewardModel]", list(self.members))

    @property
    def tokenizer(self):
        return self.models()[0].tokenizer

    @property
    def lm(self):
        """The first member's trunk (the shared base when the members are adapters on one)."""
        return self.models()[0].lm

    @property
    def adapter(self) -> str | None:
        return self.models()[0].adapter

    def shares_base(self) -> bool:
        """Whether every member is an adapter on one base with frozen blocks below the adapters."""
        lm = self.lm
        return all(m.lm is lm and m.adapter is not None for m in self.models()) and frozen_depth(lm) > 0

    def member_scores(self, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None,
                      repeats: int = 1) -> Tensor:  # fmt: skip
        """Rewards [K, B] of every member for queries [B / k, Q] (formatted) and responses [B, T] (k = repeats).
        Members on one base take the frozen prefix given, or one computed here once for all of them."""
        if prefix is None and len(self.members) > 1 and self.shares_base():
            if repeats > 1 and queries.shape[1] > 0:  # each query once for its k responses, as the members would
                prefix = frozen_prefix_shared(self.lm, queries, responses, repeats)
            else:
                prefix = frozen_prefix(self.lm, torch.cat([queries.repeat_interleave(repeats, 0), responses], dim=1))
        return torch.stack([m(queries, responses, prefix, repeats) for m in self.models()])  # [K, B]

    def forward(self, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None, repeats: int = 1,
                members: bool = False) -> Tensor:  # fmt: skip
        """The members' mean reward [B]; members: their scores [K, B] (`member_scores` through the module's call,
        which FSDP's hooks and torch.compile see)."""
        scores = self.member_scores(queries, responses, prefix, repeats)
        return scores if members else scores.mean(0)

    @staticmethod
    def mean(scores: Tensor) -> Tensor:
        """scores [K, B] -> [B]: the ensemble's reward."""
        return scores.mean(0)

    @staticmethod
    def spread(scores: Tensor) -> Tensor:
        """scores [K, B] -> [B]: the standard deviation over members (population: divided by K; 0 for K = 1)."""
        return scores.std(0, unbiased=False)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for m in self.models() for p in m.trainable_parameters()]

    def freeze(self) -> RewardEnsemble:
        for m in self.models():
            m.freeze()
        return self


def is_ensemble_dir(path: Path) -> bool:
    """Whether `path` is an ensemble directory (it holds ENSEMBLE_FILE)."""
    return (Path(path) / ENSEMBLE_FILE).is_file()


def read_manifest(path: Path) -> dict:
    """The ensemble manifest of `path`, checked: a UserError naming the file when it is unreadable or names no
    members."""
    f = Path(path) / ENSEMBLE_FILE
    try:
        manifest = json.loads(f.read_text())
        names = manifest["members"]
        assert isinstance(names, list) and names and all(isinstance(n, str) for n in names)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise UserError(f"{f}: not an ensemble manifest (a JSON object listing its members)") from None
    return manifest


def load_reward_ensemble(path: Path, device: torch.device | str = "cpu") -> RewardEnsemble:
    """An ensemble directory's members: LoRA adapters (lora.merged_reward_model false) on one base model loaded
    once, the members sharing it and its frozen prefix as in training; otherwise each member loaded as
    load_reward_model loads a reward model."""
    path = verified(Path(path))
    dirs = [path / name for name in read_manifest(path)["members"]]
    for d in dirs:
        if not is_reward_model_dir(d):
            raise UserError(f"{path}: its member {d.name} is not a reward-model directory")
    shared = _adapters_on_one_base(dirs, device)
    return (shared or RewardEnsemble([load_reward_model(d, device) for d in dirs])).to(device)


def _adapters_on_one_base(dirs: list[Path], device) -> RewardEnsemble | None:
    """The members as adapters on one copy of their base (`load_peft_adapter`), each with its saved head: score =
    w . h + c, where c is the constant save_reward_model folded into the final norm's bias along w (recovered as
    w . (saved bias - base bias)) or kept in lmprefs.json as score_bias. None unless every member is lmprefs' LoRA
    adapter on the same base with the base's final-norm weight (then they load one by one)."""
    metas = []
    for d in dirs:
        if not (d / "adapter_config.json").is_file() or not (d / "lmprefs.json").is_file():
            return None
        metas.append(json.loads((d / "lmprefs.json").read_text()))
    bases = {adapter_base(d, d) for d in dirs}
    if len(bases) != 1:
        return None
    lm, tok = load_lm(bases.pop(), device)
    prefix, norm_name = lm.base_model_prefix, _trunk_names(lm)[1]
    norm = getattr(lm.base_model, norm_name)
    members = []
    for k, (d, meta) in enumerate(zip(dirs, metas, strict=True)):
        name = "reward" if k == 0 else f"reward_{k}"
        whole = load_peft_adapter(lm, name, d)
        w = whole.get("score.weight")  # [1, d]
        if w is None:
            return None
        c = float(meta.get("score_bias", 0.0))
        if getattr(norm, "bias", None) is not None:
            nw, nb = whole.get(f"{prefix}.{norm_name}.weight"), whole.get(f"{prefix}.{norm_name}.bias")
            if nw is None or nb is None or not torch.equal(nw.to(norm.weight.device), norm.weight.detach()):
                return None
            c += float(w[0].float() @ (nb.float() - norm.bias.detach().float().cpu()))
        rm = RewardModel(lm, tok, adapter=name)
        with torch.no_grad():
            rm.head.linear.weight.copy_(w)
            rm.head.linear.bias.fill_(c)
        members.append(rm.to(device))
    return RewardEnsemble(members)


def load_reward(path: Path, device: torch.device | str = "cpu") -> RewardModel | RewardEnsemble:
    """A reward model or, from an ensemble directory, a RewardEnsemble."""
    if is_ensemble_dir(path):
        return load_reward_ensemble(path, device)
    return load_reward_model(path, device)


def is_reward_dir(path: Path) -> bool:
    """A reward-model directory or an ensemble directory."""
    return is_ensemble_dir(path) or is_reward_model_dir(path)


def save_reward_ensemble(members: list[RewardModel], out: Path, extras: list[dict], manifest: dict,
                         merged: bool = True, cards: list[CardInfo] | None = None) -> None:  # fmt: skip
    """An ensemble directory, published at once (atomic_dir): each member as save_reward_model writes a reward model
    (with `extras[k]` in its lmprefs.json and cards[k] as its README.md) under member_name(k), and ENSEMBLE_FILE,
    `manifest` plus the member list and each member's gain and bias."""
    names = [member_name(k) for k in range(len(members))]
    gains = [{"gain": float(m.gain), "bias": float(m.bias)} for m in members]
    norms = manifest.get("normalization") or [{} for _ in members]
    body = {"kind": "reward_ensemble", **manifest, "members": names,
            "normalization": [g | n for g, n in zip(gains, norms, strict=True)]}  # fmt: skip
    with atomic_dir(out) as tmp:
        for k, (m, extra) in enumerate(zip(members, extras, strict=True)):
            d = tmp / names[k]
            d.mkdir()
            write_reward_model(m, d, extra, merged, cards[k] if cards else None)
        (tmp / ENSEMBLE_FILE).write_text(json.dumps(body, indent=1))
