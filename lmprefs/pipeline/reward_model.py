"""Reward-model training from a label store: the labels as comparisons, the held-out split, normalization before
and after, and the reward model a policy run uses (trained in the run, or loaded)."""

from __future__ import annotations

import copy
import time
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path

import torch

from lmprefs.config import Config
from lmprefs.data.chat import saved_task
from lmprefs.errors import UserError
from lmprefs.labels.quality import describe_labelers as describe
from lmprefs.labels.quality import select_labelers
from lmprefs.labels.types import PickBest
from lmprefs.labels.types import get as get_label_type
from lmprefs.models.ensemble import RewardEnsemble, member_seed
from lmprefs.models.lora import add_adapter, reset_adapter
from lmprefs.models.model_card import CardInfo
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.trunk import frozen_depth
from lmprefs.pipeline.task import Task
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.runlog import open_logger, progress
from lmprefs.training.comparisons import Comparisons
from lmprefs.training.prefix_share import SharedPrefixes
from lmprefs.training.question_prefixes import PREFIX_CACHE_BYTES, QuestionPrefixes, label_prefixes, prefix_bytes
from lmprefs.training.reward import (
    evaluate,
    examples_to_comparisons,
    normalize,
    pairs_from_scores,
    split_heldout_mask,
    tokenizer_id,
    train_epoch,
)


def reward_logger(run_dir: Path, cfg: Config):
    """The logger of a reward model trained in a run directory. A reward model is trained again from its start after
    a kill, so the rows of phase "reward" an earlier attempt logged are dropped first: the log holds each step once
    (an ensemble's members that finished before the kill write their staged rows again, `ensemble_staging`)."""
    again = (Path(run_dir) / "metrics.jsonl").exists()
    return open_logger(run_dir, cfg, resume_step=-1 if again else None, resume_phase="reward")


def load_examples(cfg: Config, store, tok, report: dict | None = None, exclude_items: Set[int] = frozenset()):
    """Every label of labels.type in the store (but those on `exclude_items`), as tensors in `tok`'s ids (the caller
    splits off held-out labels and keeps labels.num_train); per-response scores as they are, or compared within each
    prompt into best_of_2 questions (labels.scores_as=comparisons); without the labels of labelers under
    labels.min_gold_accuracy. `report`, if given, receives {labeler: {"labels", "gold", "dropped", "weight"}}
    (quality.select_labelers); with labels.weight_by_gold the comparisons carry those weights, scaled to mean 1, and
    with labels.weight_by_confidence each label's confidence / 3 (times the gold weight where both are set)."""

    examples = store.labeled_examples(cfg.labels.type, tokenizer=tokenizer_id(tok))
    examples = [e for e in examples if e.item_id not in exclude_items]
    if not examples:
        others = [x for x in store.label_types() if x != cfg.labels.type]
        if others:
            raise UserError(f"the label store holds {', '.join(others)} labels, not labels.type={cfg.labels.type}; "
                            f"train on them with --labels.type {others[0]}")  # fmt: skip
        how = "import-labels --format scores" if cfg.labels.type == "scalar_rating" else "lmprefs label"
        raise UserError(f"the label store holds no {cfg.labels.type} labels; run `{how}` or `lmprefs import-labels "
                        "FILE`")  # fmt: skip
    examples, by_labeler = select_labelers(examples, store, cfg.labels.min_gold_accuracy)
    if report is not None:
        report.update(by_labeler)
    if not examples:
        raise UserError(f"labels.min_gold_accuracy={cfg.labels.min_gold_accuracy} drops every labeler "
                        f"({describe(by_labeler)})")  # fmt: skip
    data = examples_to_comparisons(examples, tok, cfg.task)
    if cfg.labels.scores_as == "comparisons":
        data = pairs_from_scores(data, cfg.labels.min_score_gap)
        if not len(data):
            raise UserError(f"labels.scores_as=comparisons: no two responses to one prompt have scores more than "
                            f"labels.min_score_gap={cfg.labels.min_score_gap} apart ({len(examples)} scores)")
    if cfg.labels.weight_by_gold:
        w = torch.tensor([by_labeler[e.labeler]["weight"] for e in examples], dtype=torch.float32)  # [N]
        if w.sum() <= 0:
            raise UserError(f"labels.weight_by_gold: every labeler is at chance on gold questions "
                            f"({describe(by_labeler)})")  # fmt: skip
        data.weights = w / w.mean()  # mean 1: the loss keeps its scale, and the learning rate its meaning
    if cfg.labels.weight_by_confidence:  # an unsure label counts for less; one without a confidence counts whole
        sure = torch.tensor([(e.confidence or 3) / 3 for e in examples], dtype=torch.float32)  # [N]
        data.weights = sure if data.weights is None else data.weights * sure
    return data


@dataclass
class TrainingLabels:
    """The labels a reward model trains on and is evaluated on."""

    train: Comparisons
    held: Comparisons
    split: str  # how the held-out labels were chosen (summary["heldout/split"])
    by_labeler: dict


def training_labels(t: Task, store, exclude_items: Set[int] = frozenset(), *, every_label: bool = False
                    ) -> TrainingLabels:  # fmt: skip
    """The store's labels split for training. Held out (`heldout_labels`): by labels.heldout_by, the items of an
    imported split other than `train`, and the items (per-response scores: the prompts) whose hash of (run.seed, item
    id or prompt) falls under labels.heldout_fraction. Every refusal of a store that cannot train a reward model is
    raised here, so a command can call it before it writes anything.
    `exclude_items`: labels not to use (an online run redoing updates after its checkpoint: later batches').
    `every_label`: every label not held out trains (an online retrain: all labels so far), not labels.num_train."""
    cfg = t.cfg
    by_labeler: dict = {}
    data = load_examples(cfg, store, t.tok, by_labeler, exclude_items)
    is_held, measured = heldout_labels(cfg, store, data)
    held, train = data[is_held], data[~is_held]
    if cfg.labels.subset_seed is not None:  # a random subset: seeds of one experiment train on different labels
        train = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.labels.subset_seed))]
    if not every_label:
        train = train[: cfg.labels.num_train]
    if len(train) == 0:
        raise UserError(f"no labels left for training: all {len(data)} are held out ({measured}; labels.heldout_by="
                        f"{cfg.labels.heldout_by}, heldout_fraction {cfg.labels.heldout_fraction})")  # fmt: skip
    return TrainingLabels(train, held, measured, by_labeler)


def train_member(t: Task, labels: TrainingLabels, log=None, member: int = 0, norm_memo: dict | None = None,
                 train: Comparisons | None = None) -> tuple[RewardModel, dict]:  # fmt: skip
    """One reward model trained and evaluated, not saved: member `member` of an ensemble (0: the reward model of a
    run without one), initialized from its own seed (`member_seed`), on `train` (default labels.train).
    `norm_memo`: normalization samples kept across members (`normalize`)."""
    cfg = t.cfg
    held, measured, by_labeler = labels.held, labels.split, labels.by_labeler
    train = labels.train if train is None else train
    seed = member_seed(cfg.run.seed, member)
    lt = training_label_type(cfg)
    t0 = time.time()
    rm = member_frame(t, member)
    if cfg.lora.rank > 0:
        assert rm.adapter is not None  # member_frame's adapter under LoRA
        reset_adapter(t.model, rm.adapter, seed=seed)  # a retrain starts from the initial model, as the paper
    else:
        rm.lm.requires_grad_(True)
    gen = torch.Generator(device=t.device).manual_seed(dist.rank_seed(cfg.run.seed) + 2)
    summary = {"labels_train": len(train), "labels_heldout": len(held), "heldout/split": measured,
               "labelers": by_labeler}  # fmt: skip
    gap = cfg.labels.min_score_gap
    scales = lt.target_scales(train.labels())  # scalar ratings: the scores' mean and std; None for choices
    # the frozen blocks' outputs for these rows when the caller has them (the labeling pass's, or computed once for
    # several reward models): the same rows, the same values
    shared = t.shared_prefixes
    held_cache = shared.for_data(rm, held) if shared is not None else None
    summary |= before_training(t, rm, held, lt, gen, scales, held_cache, seed=seed, norm_memo=norm_memo)
    cache = shared.for_data(rm, train) if shared is not None else None
    if cache is None and cfg.train_reward.epochs > 1 and frozen_depth(rm.lm) > 0:
        # LoRA in the top blocks only: run the frozen blocks below once for all epochs, if that fits in memory
        if prefix_bytes(rm.lm, train, t.ctx) <= PREFIX_CACHE_BYTES:
            bar = progress(len(train), "reward model: frozen blocks")
            own = label_prefixes(rm.lm, train, t.ctx, cfg.train_reward.microbatch or cfg.train_reward.batch_size, bar)
            cache = QuestionPrefixes.own(own, train) if own is not None else None
            bar.close()
    bar = progress(len(train) * cfg.train_reward.epochs, "training reward model")
    rm.train()
    last = train_epoch(rm, train, lt, cfg, t.ctx, log=log, bar=bar, cache=cache, seed=seed)
    del cache
    rm.eval()
    bar.close()
    # a regression is evaluated in the scores' units, before normalize_after rescales its output (the correlation and
    # the pair accuracy do not change with the scale)
    final = evaluate(rm, held, lt, t.ctx, min_gap=gap, prefixes=held_cache) if scales else None
    if cfg.train_reward.normalize_after:
        na = normalize(rm, t.model, t.tok, t.train_queries, cfg, t.ctx, gen, memo=norm_memo)
        summary["norm_after"] = {"mean": na["mean_before"], "std": na["std_before"]}
    summary |= final or evaluate(rm, held, lt, t.ctx, min_gap=gap, prefixes=held_cache)
    summary |= {"final_minibatch": last, "seconds": time.time() - t0}
    if log is not None:
        # the wall-clock seconds under PPO's name for them (elapsed/time), which comparisons of runs leave out
        row = {("elapsed/time" if k == "seconds" else k): v for k, v in summary.items() if isinstance(v, float)}
        log.scalars(row, len(train) * cfg.train_reward.epochs, phase="reward")
    return rm, summary


def member_meta(t: Task, summary: dict) -> dict:
    """What a reward model's lmprefs.json records beside its kind and base: its training summary, label type, and
    the task it frames texts with."""
    cfg = t.cfg
    task = saved_task(cfg.task, t.tok)  # `lmprefs score` and the card frame texts as training did
    extra = {"summary": summary, "label_type": training_label_type(cfg).name, "task": task}
    if cfg.labels.type == "scalar_rating":
        extra["scores_as"] = cfg.labels.scores_as
    return extra


def before_training(t: Task, rm: RewardModel, held, lt, gen: torch.Generator, scales,
                    held_cache: QuestionPrefixes | None = None, *, seed: int | None = None,
                    norm_memo: dict | None = None) -> dict:  # fmt: skip
    """Normalize the untrained reward model (train_reward.normalize_before) and evaluate it on the held-out labels:
    summary's norm_before and initial_* entries. An untrained reward model is the same for every label count of
    one seed (its init and the held-out split follow run.seed; its target is (0, 1) for choices), so with
    t.shared_before (a dict the caller keeps across the arms) the second and later of them take the first's
    figures, gain, bias and sampler state instead of sampling and scoring again: bitwise the same model after.
    held_cache: the frozen prefixes of the held-out rows, when the caller has them. `seed`: the reward model's own
    (an ensemble member's, default run.seed); `norm_memo`: `normalize`'s."""
    cfg, memo = t.cfg, t.shared_before
    key = None
    if memo is not None and scales is None and held.items is not None:
        tr = cfg.train_reward
        key = (cfg.run.seed if seed is None else seed, tr.normalize_before, tr.normalize_samples,
               tr.rollout_batch_size, cfg.labels.type, tuple(held.items.tolist()), float(rm.gain.detach()),
               float(rm.bias.detach()))  # fmt: skip
        if key in memo:
            found = memo[key]
            if "norm_before" in found["summary"]:  # to (0, 1), as normalize did for the first
                rm.set_norm(found["summary"]["norm_before"]["mean"], found["summary"]["norm_before"]["std"])
            gen.set_state(found["gen_state"])  # normalize_after draws what it would have drawn
            return dict(found["summary"])
    out: dict = {}
    if cfg.train_reward.normalize_before:
        # start at the scale of the labels (train_reward.py:target_mean_std), else at mean 0, std 1
        target = (0.0, 1.0) if scales is None else (float(scales[0]), max(float(scales[1]), 1e-6))
        nb = normalize(rm, t.model, t.tok, t.train_queries, cfg, t.ctx, gen, target=target, memo=norm_memo)
        out["norm_before"] = {"mean": nb["mean_before"], "std": nb["std_before"]}
    initial = evaluate(rm, held, lt, t.ctx, min_gap=cfg.labels.min_score_gap, prefixes=held_cache)
    out |= {f"initial_{k}": v for k, v in initial.items()}
    if key is not None and memo is not None:
        memo[key] = {"summary": dict(out), "gen_state": gen.get_state()}
    return out


def shared_reward_prefixes(t: Task, store, configs: list[Config]) -> SharedPrefixes | None:
    """The frozen prefixes of every labeled row that a reward model trained with any of `configs` (the arms of an
    experiment: one task, the seed and labels.num_train / subset_seed varying) trains on, computed once; None where
    train_reward_model would not cache them (one epoch, no frozen block, or over PREFIX_CACHE_BYTES). Adds the
    reward adapter to t.model (it is the frame's), so `t` is the caller's to drop afterwards."""
    cfg = t.cfg
    if cfg.lora.rank <= 0 or cfg.train_reward.epochs <= 1 or cfg.run.parallel == "fsdp" or not configs:
        return None
    items: set[int] = set()
    for c in configs:  # each arm's own split and subset, as training_labels draws them for it
        train = training_labels(Task(**{**t.__dict__, "cfg": c}), store).train
        assert train.items is not None  # a store's labels carry their item ids
        items |= set(train.items.tolist())
    data = load_examples(cfg, store, t.tok)
    assert data.items is not None  # a store's labels carry their item ids
    data = data[torch.isin(data.items, torch.tensor(sorted(items), dtype=data.items.dtype))]
    rm = reward_frame(t)
    if frozen_depth(rm.lm) == 0 or prefix_bytes(rm.lm, data, t.ctx) > PREFIX_CACHE_BYTES:
        return None
    bar = progress(len(data), "reward models: frozen blocks, once for all arms")
    shared = SharedPrefixes.compute(rm, data, t.ctx, cfg.train_reward.microbatch or cfg.train_reward.batch_size, bar)
    bar.close()
    return shared


def reward_model_card(cfg: Config, summary: dict) -> CardInfo:
    """The reward model's card: its held-out figures before and after training, and its label counts."""
    results = {k.replace("heldout/", "held-out ").replace("initial_", "before training: "): v
               for k, v in summary.items() if "heldout/" in k and isinstance(v, float)}  # fmt: skip
    labels = {"for training": summary.get("labels_train"), "held out": summary.get("labels_heldout"),
              "labelers": sorted(summary.get("labelers") or {})}
    return CardInfo("reward-model", cfg, results, {k: v for k, v in labels.items() if v is not None})


def heldout_labels(cfg: Config, store, data) -> tuple[torch.Tensor, str]:
    """[N] bool: which of the store's labels `data` (load_examples) are held out, by labels.heldout_by, and what they
    measure (reward.split_heldout_mask). Every rank reads the same store, so all agree."""

    lab = cfg.labels
    by_item = {} if lab.heldout_by == "hash" else store.item_splits()
    splits = [by_item.get(i) for i in data.items.tolist()]
    if lab.heldout_by == "split" and all(s is None for s in splits):
        raise UserError(f"labels.heldout_by=split: none of the {len(data)} {lab.type} labels in the store carries an "
                        "imported split (import-labels --format summarize keeps one); use auto or hash")  # fmt: skip
    return split_heldout_mask(data.split_keys(), splits, cfg.run.seed, lab.heldout_fraction)


def training_label_type(cfg: Config):
    """The label type whose loss trains the reward model: labels.type, except that per-response scores compared
    within a prompt (labels.scores_as=comparisons) train as best_of_2 questions."""

    return PickBest(2) if cfg.labels.scores_as == "comparisons" else get_label_type(cfg.labels.type)


def reward_frame(t: Task) -> RewardModel | RewardEnsemble:
    """A reward model shaped as train_reward_model makes it, before training: with LoRA the 'reward' adapter on the
    shared base (which stays the initial policy with adapters off), else a copy of the initial model; with
    train_reward.ensemble K > 1 a RewardEnsemble of K such members."""
    K = t.cfg.train_reward.ensemble
    return member_frame(t, 0) if K == 1 else RewardEnsemble([member_frame(t, k) for k in range(K)])


def member_frame(t: Task, member: int = 0) -> RewardModel:
    """Member `member` of reward_frame's ensemble (0: the reward model of a run without one), initialized from its
    own seed: with LoRA its own adapter on the shared base ('reward', then 'reward_1', ...)."""
    cfg = t.cfg
    seed = member_seed(cfg.run.seed, member)
    if cfg.lora.rank > 0:
        name = "reward" if member == 0 else f"reward_{member}"
        add_adapter(t.model, cfg.lora, name, seed=seed)
        return RewardModel(t.model, t.tok, adapter=name, seed=seed).to(t.device)
    return RewardModel(copy.deepcopy(t.model), t.tok, seed=seed).to(t.device)


class RewardState:
    """A reward model's weights as checkpoint state (PolicyRun.extras): head, gain and bias, and the trunk unless
    it is a LoRA adapter (the checkpoint's adapters.safetensors holds those weights, with the policy's). Resuming
    from it rebuilds the very model the uninterrupted run scored with, not the merged export in reward_model/."""

    def __init__(self, rm):
        self.rm = rm

    def members(self) -> list[tuple[str, RewardModel]]:
        """(key prefix, reward model): one unprefixed, or an ensemble's members as "members.K."."""
        if isinstance(self.rm, RewardEnsemble):
            return [(f"members.{k}.", m) for k, m in enumerate(self.rm.models())]
        return [("", self.rm)]

    def state_dict(self) -> dict:
        own: dict[str, torch.Tensor] = {}
        for pre, rm in self.members():
            own |= {f"{pre}head.{k}": v for k, v in rm.head.state_dict().items()}
            own |= {f"{pre}gain": rm.gain, f"{pre}bias": rm.bias}
            if rm.adapter is None:
                own |= {f"{pre}lm.{k}": v for k, v in rm.lm.state_dict().items()}
        return {k: v.detach().cpu().clone() for k, v in own.items()}

    def load_state_dict(self, s: dict) -> None:
        with torch.no_grad():
            for pre, rm in self.members():
                mine = {k[len(pre) :]: v for k, v in s.items() if k.startswith(pre)}
                rm.head.load_state_dict({k[5:]: v for k, v in mine.items() if k.startswith("head.")})
                rm.gain.copy_(mine["gain"])
                rm.bias.copy_(mine["bias"])
                if rm.adapter is None:
                    rm.lm.load_state_dict({k[3:]: v for k, v in mine.items() if k.startswith("lm.")})
