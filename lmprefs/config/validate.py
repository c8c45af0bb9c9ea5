"""The checks every config passes when it is built: each field's type and range, and the cross-field checks (the
original's HParams.validate). Configs are built only through here (presets, overrides, config files, the Python API),
so no command can start with a value it would crash on or silently reinterpret. Messages name the offending values.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Literal

# simulated labelers (labels/labelers.py:SCORE_FNS) and 'none'
LABELERS = ("vader", "descriptiveness", "faithfulness", "none")
# run.device, and the device flags of the commands that take one
DEVICES = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
# the largest seed (run.seed, labels.subset_seed, --seed): numpy's range, and far enough below torch's 64 bits that
# the seeds derived from it (seed + arm, seed + rank * 100003, seed * 1_000_003 + epoch) fit too
SEED_MAX = 2**32 - 1
# the lowest sampling temperature: below it sampling is greedy in all but name, and a value that float32 rounds to 0
# (1e-300) made every logit inf and every sample end-of-text, without a word
MIN_TEMPERATURE = 1e-6
INT_MAX = 2**63 - 1  # torch's int64: a larger value of any int field ends in an OverflowError where torch reads it


class _Problems(list):
    def need(self, ok: bool, msg: str) -> None:
        if not ok:
            self.append(msg)


def validate(cfg) -> list[str]:
    """Every problem of a Config (empty when it is fine)."""
    out = _type_problems(cfg, "")
    if out:  # ranges below assume the types
        return out
    for sec in dataclasses.fields(cfg):
        for f in dataclasses.fields(getattr(cfg, sec.name)):
            v = getattr(getattr(cfg, sec.name), f.name)
            if isinstance(v, float) and not math.isfinite(v):
                out.append(f"{sec.name}.{f.name}={v} must be a finite number")
            ints = v if isinstance(v, tuple) else (v,)
            if any(isinstance(x, int) and not -INT_MAX <= x <= INT_MAX for x in ints):
                out.append(f"{sec.name}.{f.name}={v} is past the 64-bit integers torch computes with")
    return [*out, *_task(cfg.task), *_labels(cfg.labels), *_train_reward(cfg.train_reward), *_rewards(cfg.rewards),
            *_ppo(cfg.ppo), *_lora(cfg.lora), *_run(cfg), *_sft(cfg), *_dpo(cfg.dpo), *_selection(cfg)]


def _type_problems(obj, prefix: str) -> list[str]:
    """Fields whose value is not of the declared type (a config.json can hold "lr": "fast")."""
    out = []
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        v, t, key = getattr(obj, f.name), hints[f.name], prefix + f.name
        if isinstance(t, type) and dataclasses.is_dataclass(t):  # a section's class (not an instance)
            out += _type_problems(v, key + ".") if isinstance(v, t) else [f"{key} must be a section, not {v!r}"]
            continue
        args = typing.get_args(t)
        allowed = tuple(a for a in args if a is not type(None)) if type(None) in args else (t,)
        if v is None and type(None) in args:
            continue
        ok = False
        for a in allowed:
            if typing.get_origin(a) is Literal:
                ok |= v in typing.get_args(a)
            elif typing.get_origin(a) is tuple:  # tuple[str, ...] or tuple[int, ...]
                item = typing.get_args(a)[0]
                ok |= isinstance(v, tuple) and all(isinstance(x, item) and not isinstance(x, bool) for x in v)
            elif a is float:
                ok |= isinstance(v, int | float) and not isinstance(v, bool)
            elif a is int:
                ok |= isinstance(v, int) and not isinstance(v, bool)
            else:
                ok |= isinstance(v, a)
        if not ok:
            out.append(f"{key}={v!r}: expected {' or '.join(map(_type_name, allowed))}")
    return out


def _type_name(t) -> str:
    """A declared type as a user reads it: int, tuple[int, ...], one of 'a', 'b'."""
    if typing.get_origin(t) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(t)))
    return t.__name__ if isinstance(t, type) else str(t).replace("typing.", "")



def _task(t) -> list[str]:
    """What the policy continues."""
    out = _Problems()
    need = out.need
    need(bool(t.query_dataset), "task.query_dataset must name a dataset")
    need(bool(t.initial_model), "task.initial_model must name a model")
    if t.response_length <= 0 or t.query_length <= 0:
        out.append(f"task.query_length={t.query_length} and task.response_length={t.response_length} must be positive")
    need(t.temperature >= MIN_TEMPERATURE, f"task.temperature={t.temperature} must be at least {MIN_TEMPERATURE:g}")
    need(t.truncate_token is None or t.truncate_token >= 0, f"task.truncate_token={t.truncate_token} must be >= 0")
    need(t.truncate_after >= 0, f"task.truncate_after={t.truncate_after} must be >= 0")
    need(all(x >= 0 for x in t.stop_tokens), f"task.stop_tokens={t.stop_tokens} must be token ids (>= 0)")
    need(t.stop_at_eos or not t.stop_tokens,
         f"task.stop_tokens={t.stop_tokens} end responses only with task.stop_at_eos true (it is false)")
    return out


def _labels(lab) -> list[str]:
    """Labels and labelers."""
    out = _Problems()
    need = out.need
    try:
        check_label_type(lab.type)
    except ValueError as e:
        out.append(f"labels.type: {e}")
    need(lab.labeler in LABELERS, f"labels.labeler={lab.labeler!r}: choose one of {', '.join(LABELERS)}")
    need(lab.num_train > 0, f"labels.num_train={lab.num_train} must be positive")
    need(lab.labeler_temperature >= 0, f"labels.labeler_temperature={lab.labeler_temperature} must be >= 0")
    need(0 <= lab.labeler_random_rate <= 1, f"labels.labeler_random_rate={lab.labeler_random_rate} must be in [0, 1]")
    need(lab.subset_seed is None or 0 <= lab.subset_seed <= SEED_MAX,
         f"labels.subset_seed={lab.subset_seed} must be 0 to {SEED_MAX}")
    need(0 <= lab.heldout_fraction < 1, f"labels.heldout_fraction={lab.heldout_fraction} must be in [0, 1)")
    need(0 <= lab.min_gold_accuracy <= 1, f"labels.min_gold_accuracy={lab.min_gold_accuracy} must be in [0, 1]")
    need(lab.scores_as == "rating" or lab.type == "scalar_rating",
         f"labels.scores_as={lab.scores_as!r} compares per-response scores: it needs labels.type=scalar_rating, not "
         f"{lab.type!r}")
    need(lab.min_score_gap >= 0, f"labels.min_score_gap={lab.min_score_gap} must be >= 0")
    need(not (lab.weight_by_gold and lab.type == "scalar_rating"),
         "labels.weight_by_gold weighs labelers by their answers to gold best_of_N questions; scalar_rating labels "
         "have none")
    need(not (lab.weight_by_confidence and lab.type.startswith("scalar_")),
         f"labels.weight_by_confidence weighs best_of_N and ranking_K labels; {lab.type} losses take no weights")
    need(lab.online_questions > 0, f"labels.online_questions={lab.online_questions} must be positive")
    need(lab.online_interval > 0, f"labels.online_interval={lab.online_interval} must be positive")
    need(lab.online_retrains >= 0, f"labels.online_retrains={lab.online_retrains} must be >= 0")
    need(lab.pool_factor >= 1, f"labels.pool_factor={lab.pool_factor} must be >= 1 (candidates per question asked)")
    need(lab.select_round > 0, f"labels.select_round={lab.select_round} must be positive")
    need(0 <= lab.select_diversity <= 1, f"labels.select_diversity={lab.select_diversity} must be in [0, 1]")
    return out


def _selection(cfg) -> list[str]:
    """Directed query selection: what its acquisition is computed from."""
    out = _Problems()
    sel = cfg.labels.select
    if sel == "random":
        return out
    members = cfg.train_reward.ensemble
    out.need(members >= 2, f"labels.select={sel} ranks questions by a reward-model ensemble's disagreement; "
             f"train_reward.ensemble={members} has none: set it to 2 or more")  # fmt: skip
    out.need(re.fullmatch(r"best_of_\d+", cfg.labels.type) is not None,
             f"labels.select={sel} chooses among best_of_N questions, not labels.type={cfg.labels.type}")
    return out


def _train_reward(tr) -> list[str]:
    """Reward-model training."""
    out = _Problems()
    need = out.need
    need(tr.batch_size > 0, f"train_reward.batch_size={tr.batch_size} must be positive")
    need(tr.lr > 0, f"train_reward.lr={tr.lr} must be positive")
    need(tr.epochs > 0, f"train_reward.epochs={tr.epochs} must be positive")
    need(tr.microbatch >= 0, f"train_reward.microbatch={tr.microbatch} must be >= 0 (0: the whole batch)")
    need(tr.rollout_batch_size > 0, f"train_reward.rollout_batch_size={tr.rollout_batch_size} must be positive")
    need(tr.ensemble >= 1, f"train_reward.ensemble={tr.ensemble} must be >= 1 (1: one reward model)")
    need(tr.normalize_samples > 1, f"train_reward.normalize_samples={tr.normalize_samples} must be >= 2")
    return out


def _rewards(rw) -> list[str]:
    """The KL penalty and its controller."""
    out = _Problems()
    need = out.need
    need(rw.kl_coef >= 0, f"rewards.kl_coef={rw.kl_coef} must be >= 0")
    need(rw.kl_target is None or rw.kl_target > 0, f"rewards.kl_target={rw.kl_target} must be positive or None")
    need(rw.kl_horizon > 0, f"rewards.kl_horizon={rw.kl_horizon} must be positive")
    need(math.isfinite(rw.uwo_lambda) and rw.uwo_lambda >= 0,
         f"rewards.uwo_lambda={rw.uwo_lambda} must be a finite number >= 0")
    return out


def _ppo(p) -> list[str]:
    """PPO."""
    out = _Problems()
    need = out.need
    if p.batch_size <= 0 or p.nminibatches <= 0 or p.batch_size % p.nminibatches:
        out.append(f"ppo.batch_size={p.batch_size} must be a positive multiple of ppo.nminibatches={p.nminibatches}")
    need(p.total_episodes >= p.batch_size,
         f"ppo.total_episodes={p.total_episodes} must be at least ppo.batch_size={p.batch_size} (one update)")
    need(p.noptepochs > 0, f"ppo.noptepochs={p.noptepochs} must be positive")
    need(p.lr > 0, f"ppo.lr={p.lr} must be positive")
    need(p.vf_coef >= 0, f"ppo.vf_coef={p.vf_coef} must be >= 0")
    need(p.vf_lr is None or p.vf_lr > 0, f"ppo.vf_lr={p.vf_lr} must be positive or None (= ppo.lr)")
    need(p.vf_lr is None or p.value_model == "separate",
         f"ppo.vf_lr={p.vf_lr} sets the optimizer of a separate value model; ppo.value_model is {p.value_model!r} "
         "(the shared trunk trains with ppo.lr)")
    need(p.cliprange > 0, f"ppo.cliprange={p.cliprange} must be positive")
    need(p.cliprange_value > 0, f"ppo.cliprange_value={p.cliprange_value} must be positive")
    need(0 <= p.gamma <= 1, f"ppo.gamma={p.gamma} must be in [0, 1]")
    need(0 <= p.lam <= 1, f"ppo.lam={p.lam} must be in [0, 1]")
    need(p.score_drop_stop is None or p.score_drop_stop > 0,
         f"ppo.score_drop_stop={p.score_drop_stop} must be positive or None")
    need(p.overoptimization_stop is None or p.overoptimization_stop > 0,
         f"ppo.overoptimization_stop={p.overoptimization_stop} must be positive or None")
    group = ("rloo", "grpo", "dr_grpo", "reinforce_pp_baseline")
    need(p.estimator in ("ppo",) + group, f"ppo.estimator={p.estimator!r}: choose ppo, {', '.join(group)}")
    need(p.rloo_ratio in ("token", "sequence"), f"ppo.rloo_ratio={p.rloo_ratio!r}: choose token or sequence")
    need(p.rloo_k >= 2, f"ppo.rloo_k={p.rloo_k} must be at least 2 (the baseline is the other samples' mean)")
    need(p.kl_in in (None, "reward", "loss"), f"ppo.kl_in={p.kl_in!r}: choose reward or loss")
    need(p.kl_in is None or p.estimator in ("grpo", "dr_grpo"),
         f"ppo.kl_in={p.kl_in!r} applies to ppo.estimator grpo or dr_grpo; {p.estimator} takes its KL in the reward "
         "only")  # fmt: skip
    if p.estimator in group:
        need(p.rloo_k < 2 or p.batch_size % p.rloo_k == 0,
             f"ppo.rloo_k={p.rloo_k} must divide ppo.batch_size={p.batch_size} (samples per query)")
        need(p.value_model == "shared", f"ppo.estimator={p.estimator} trains no value model; ppo.value_model=separate "
             "does not apply")  # fmt: skip
    return out


def _lora(lo) -> list[str]:
    """LoRA adapters."""
    out = _Problems()
    need = out.need
    need(lo.rank >= 0, f"lora.rank={lo.rank} must be >= 0 (0: full fine-tuning)")
    need(lo.alpha > 0, f"lora.alpha={lo.alpha} must be positive")
    need(lo.layers >= 0, f"lora.layers={lo.layers} must be >= 0 (0: every block)")
    need(lo.rank == 0 or len(lo.targets) > 0, "lora.targets must name at least one module")
    return out


def _run(cfg) -> list[str]:
    """The run, and what run.parallel does not combine with."""
    out = _Problems()
    run, lo, p = cfg.run, cfg.lora, cfg.ppo
    need = out.need
    need(0 <= run.seed <= SEED_MAX, f"run.seed={run.seed} must be 0 to {SEED_MAX}")
    need(run.log_interval > 0, f"run.log_interval={run.log_interval} must be positive")
    need(run.save_interval > 0, f"run.save_interval={run.save_interval} must be positive")
    need(run.threads >= 0, f"run.threads={run.threads} must be >= 0 (0: torch's default)")
    need(bool(DEVICES.fullmatch(run.device)), f"run.device={run.device!r}: choose auto, cpu, cuda, cuda:N or mps")
    if run.parallel == "fsdp":
        need(lo.rank == 0, f"run.parallel=fsdp does not combine with LoRA (lora.rank={lo.rank}): the adapters are "
                           "small and the frozen base is shared, so run.parallel=ddp suits LoRA")
        need(p.value_model == "shared", "run.parallel=fsdp does not combine with ppo.value_model=separate yet (the "
             "value model's own optimizer state is not gathered into the checkpoint)")
        need(run.compile != "on", "run.parallel=fsdp does not combine with run.compile=on (CUDA graphs need fixed "
                                  "parameter addresses, and FSDP frees the gathered blocks after sampling); use auto")
    for name in run.report_to:
        need(name in ("tensorboard", "wandb", "mlflow"),
             f"run.report_to: {name!r} is not tensorboard, wandb or mlflow")
    return out


def _sft(cfg) -> list[str]:
    """Supervised fine-tuning."""
    out = _Problems()
    need = out.need
    need(cfg.sft.epochs > 0 and cfg.sft.batch_size > 0,
         f"sft.epochs={cfg.sft.epochs} and sft.batch_size={cfg.sft.batch_size} must be positive")
    need(cfg.sft.lr > 0, f"sft.lr={cfg.sft.lr} must be a positive number")
    need(cfg.sft.max_length == 0 or cfg.sft.max_length >= 2,
         f"sft.max_length={cfg.sft.max_length} must be 0 (the model's context) or at least 2")
    return out


def _dpo(d) -> list[str]:
    """Direct preference optimization."""
    out = _Problems()
    need = out.need
    need(d.beta > 0, f"dpo.beta={d.beta} must be positive")
    need(d.lr > 0, f"dpo.lr={d.lr} must be positive")
    need(d.batch_size > 0, f"dpo.batch_size={d.batch_size} must be positive")
    need(d.microbatch is None or d.microbatch >= 0,
         f"dpo.microbatch={d.microbatch} must be >= 0 (0: the whole batch; None: chosen from the memory)")
    need(d.epochs > 0, f"dpo.epochs={d.epochs} must be positive")
    need(d.online_samples >= 2, f"dpo.online_samples={d.online_samples} must be at least 2 (a choice needs two)")
    need(d.online_steps > 0, f"dpo.online_steps={d.online_steps} must be positive")
    return out


RANKING_MAX = 9  # a labeler orders the options with the keys 1-9


def label_type_shape(label_type: str) -> tuple[str, int]:
    """(label field, samples per item) of a label-type name, without importing torch: best_of_4 -> ("best", 4),
    ranking_4 -> ("ranking", 4) (a full order of the 4 samples, best first)."""
    if label_type == "scalar_rating":
        return "score", 1
    if label_type == "scalar_compare":
        return "difference", 2
    m = re.fullmatch(r"best_of_(\d+)", label_type)
    if m and int(m.group(1)) >= 2:
        return "best", int(m.group(1))
    m = re.fullmatch(r"ranking_(\d)", label_type)
    if m and 2 <= int(m.group(1)) <= RANKING_MAX:
        return "ranking", int(m.group(1))
    raise ValueError(f"unknown label type {label_type!r}; expected 'best_of_N' (N >= 2), 'ranking_K' (K 2 to "
                     f"{RANKING_MAX}), 'scalar_rating' or 'scalar_compare'")  # fmt: skip


def check_label_type(label_type: str) -> tuple[str, int]:
    """`label_type_shape` of a label type to write with (a config's labels.type, a new item's), spelt only as the
    name is written (ASCII digits, no leading zero). label_type_shape reads any digits, so that a store holding such
    a name from before this check still works; a new best_of_04 or best_of_<Arabic-Indic four> would be a second name
    for best_of_4, whose items train-reward and the exports, which match the name exactly, would never see."""
    value_field, n = label_type_shape(label_type)
    name = {"best": f"best_of_{n}", "ranking": f"ranking_{n}"}.get(value_field, label_type)
    if label_type != name:
        raise ValueError(f"label type {label_type!r} must be written {name!r}")
    return value_field, n


# keys that act only under another setting: key -> (whether the config lets it act, that setting, as a user sets it)
ACTS_ONLY_UNDER = {
    "ppo.rloo_k": (lambda c: c.ppo.estimator != "ppo", "a group ppo.estimator (rloo, grpo, dr_grpo, "
                   "reinforce_pp_baseline)"),
    "ppo.rloo_ratio": (lambda c: c.ppo.estimator == "rloo", "ppo.estimator=rloo"),
    "rewards.kl_horizon": (lambda c: c.rewards.kl_target is not None, "a rewards.kl_target (the adaptive KL)"),
    "rewards.uwo_lambda": (lambda c: c.rewards.ensemble_reduce == "uwo", "rewards.ensemble_reduce=uwo"),
    "lora.alpha": (lambda c: c.lora.rank > 0, "lora.rank > 0"),
    "lora.targets": (lambda c: c.lora.rank > 0, "lora.rank > 0"),
    "lora.layers": (lambda c: c.lora.rank > 0, "lora.rank > 0"),
}


def inert_overrides(cfg, pairs) -> list[str]:
    """The overrides (dotted key, text) that cfg runs without a word, each as one line: a command that runs cfg as
    it is (train-policy, quickstart; not an experiment whose arms change the setting) refuses them."""
    out = []
    for raw, text in pairs:
        key = raw.replace("-", "_")
        acts, needs = ACTS_ONLY_UNDER.get(key, (None, ""))
        if acts is not None and not acts(cfg):
            out.append(f"--{raw} {text}: acts only with {needs}, which this config does not set; set it, or drop "
                       f"--{raw}")  # fmt: skip
    return out
