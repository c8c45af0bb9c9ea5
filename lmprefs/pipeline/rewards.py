"""The reward a policy run optimizes: a reward model, a built-in scorer or a user's function, normalized and
checked; and the true reward tracked beside it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from lmprefs.assets.tokenizers import load_tokenizer
from lmprefs.config import Config
from lmprefs.data.tasks import decode, query_texts, response_texts, stop_tokens
from lmprefs.errors import UserError, first_line
from lmprefs.io.inputs import input_dir
from lmprefs.labels.labelers import SCORE_FNS, score_fn, score_texts
from lmprefs.models import parallel
from lmprefs.models.ensemble import is_ensemble_dir, is_reward_dir, load_reward, read_manifest
from lmprefs.pipeline.labeling import label_source
from lmprefs.pipeline.reward_model import RewardState, TrainingLabels, reward_frame, reward_logger
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.task import Task
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.device import compiles_forwards
from lmprefs.training.reward import normalization_samples, rm_rewards
from lmprefs.training.rollout import rm_score_fn, text_score_fn


def reward_function(reward, flag: str = "--reward") -> tuple[str, object]:
    """(name, fn) for a reward on response texts, fn(list[str]) -> list[float]: a callable (the Python API), a
    built-in name (vader, descriptiveness), or `module:function` naming one of the user's own. A bad one is a
    UserError naming `flag`, the option that gave it."""
    import importlib

    if callable(reward):
        mod, name = getattr(reward, "__module__", None), getattr(reward, "__qualname__", "")
        name = f"{mod}:{name}" if mod and "<" not in name else "callable"
        return name, _guarded(reward, f"reward {name}")
    if reward in SCORE_FNS:
        return reward, score_fn(reward)
    if ":" not in reward:
        raise UserError(f"{flag} {reward!r}: choose model, {', '.join(sorted(SCORE_FNS))}, or module:function "
                        "(a function of a list of response texts returning a list of floats)")  # fmt: skip
    mod_name, _, fn_name = reward.partition(":")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except ImportError as e:
        raise UserError(f"{flag} {reward}: cannot import {mod_name!r} ({e}); is it on PYTHONPATH?") from None
    except AttributeError:
        raise UserError(f"{flag} {reward}: module {mod_name!r} has no {fn_name!r}") from None
    if not callable(fn):
        raise UserError(f"{flag} {reward}: {fn_name!r} is not a function")
    return reward, _guarded(fn, f"{flag} {reward}")


def _guarded(fn, where: str):
    """A user's reward function whose failure is one line naming `where` (the flag and the function): what it
    raised, or what it returned that is not one finite number per text (a NaN was averaged into the scores and
    written into results.json as a bare NaN)."""
    import functools

    @functools.wraps(fn)  # keeps fn.reads_query
    def call(texts, *queries):
        try:
            out = fn(texts, *queries)
        except Exception as e:  # the user's code: any error is theirs to fix, named in one line
            raise UserError(f"{where}: raised {first_line(e)}") from None
        return finite_scores(out, texts, where)

    return call


def finite_scores(out, texts: list[str], where: str) -> list[float]:
    """`out`, a reward's scores of `texts`, as floats; a UserError naming `where` unless it is one finite number
    per text."""
    try:
        scores = [float(x) for x in out]
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: must return a list of floats, one per text ({e})") from None
    if len(scores) != len(texts):
        raise UserError(f"{where}: returned {len(scores)} values for {len(texts)} texts")
    bad = next((i for i, x in enumerate(scores) if not math.isfinite(x)), None)
    if bad is not None:
        raise UserError(f"{where}: returned {scores[bad]} for text {bad} ({texts[bad][:40]!r}); a reward must be a "
                        "finite number")  # fmt: skip
    return scores


def check_trained_model(cfg: Config, tok) -> None:
    """rewards.trained_model, if set, is a reward model that reads the policy's tokens (checked before any work)."""
    if not cfg.rewards.trained_model:
        return
    rm_dir = Path(cfg.rewards.trained_model)
    input_dir(rm_dir, "rewards.trained_model", "reward-model directory")
    if not is_reward_dir(rm_dir):
        raise UserError(f"rewards.trained_model={rm_dir}: not a reward-model directory (a sequence classifier "
                        "with num_labels=1, as train-reward or TRL's RewardTrainer save) nor a reward-model "
                        "ensemble (ensemble.json)")  # fmt: skip
    first = rm_dir / read_manifest(rm_dir)["members"][0] if is_ensemble_dir(rm_dir) else rm_dir
    check_same_tokenizer(first, tok, f"rewards.trained_model={rm_dir}")


def check_ensemble_reduce(cfg: Config, reward, resume: bool = False) -> None:
    """rewards.ensemble_reduce min and uwo reduce a reward-model ensemble's members' scores: a UserError, before any
    work, where the run's reward is none (a reward function, a single reward model in rewards.trained_model, or one
    this run trains with train_reward.ensemble 1). A rewards.trained_model that is no reward model at all is left
    to check_trained_model to name."""
    how = cfg.rewards.ensemble_reduce
    if how == "mean":
        return
    source, rm_dir = reward_source(cfg, reward, resume), cfg.rewards.trained_model
    if source == "function":
        what = f"--reward {reward if isinstance(reward, str) else 'callable'} is a reward function"
    elif rm_dir:
        if is_ensemble_dir(Path(rm_dir)) or not is_reward_dir(Path(rm_dir)):
            return
        what = f"rewards.trained_model={rm_dir} is a single reward model"
    elif cfg.train_reward.ensemble > 1:
        return
    else:
        what = f"train_reward.ensemble={cfg.train_reward.ensemble} trains a single reward model"
    raise UserError(no_ensemble(how, what))


def no_ensemble(how: str, what: str) -> str:
    """The refusal of rewards.ensemble_reduce `how` (min, uwo) for a reward that is no ensemble (`what` says why)."""
    return (f"rewards.ensemble_reduce={how} reduces a reward-model ensemble's members' scores, but {what}; give an "
            "ensemble (train_reward.ensemble >= 2, or an ensemble directory) or keep mean")


def reward_source(cfg: Config, reward, resume: bool, kept: bool = False) -> str:
    """Where reward_for_policy takes the reward from: "function" (`--reward NAME`), "saved" (rewards.trained_model,
    or this run's reward_model/ when resuming from a checkpoint written before checkpoints kept a fully fine-tuned
    reward model), "frame" (resuming with LoRA, or from a checkpoint that `kept` this run's reward model: the
    checkpoint holds its exact weights) or "train" (a new reward model from the label store)."""
    if reward is not None and reward != "model":
        return "function"
    if cfg.rewards.trained_model:
        return "saved"
    if resume:
        return "frame" if cfg.lora.rank > 0 or kept else "saved"
    return "train"


def trains_reward_model(cfg: Config, reward, resume: bool) -> bool:
    """Whether reward_for_policy will train a reward model from the label store."""
    return reward_source(cfg, reward, resume) == "train"


def reward_for_policy(t: Task, run_dir: Path, reward, store, resume: bool, labels: TrainingLabels | None = None,
                      kept: bool = False):  # fmt: skip
    """The score function PPO optimizes: a reward function (`--reward vader`, `--reward module:function`, a
    callable), a trained reward model (rewards.trained_model, or this run's reward_model/ when resuming), or a new
    one trained from `store` (a LabelStore, or a path for label_source; `labels`: its training_labels, if checked
    already). With LoRA a reward model trained in this run is an adapter on the policy's base. info["state"] is a
    reward model trained in this run as RewardState, for the checkpoint, and on resume from a checkpoint that kept
    it (`kept`; always with LoRA) an empty frame the checkpoint fills.
    rewards.trained_model is the caller's to check first (check_trained_model), before it writes anything."""

    cfg = t.cfg
    source = reward_source(cfg, reward, resume, kept)
    if source == "function":
        reward, fn = reward_function(reward)
        # normalized like a reward model (mean 0, std 1 on initial-policy samples), so that kl_coef and the KL
        # target weigh it as they weigh a learned reward: unnormalized, VADER's small spread on those samples makes
        # the KL penalty dominate and the direct arm of `experiment mock-sentiment` learns far less
        # (docs/results.md).
        gen = torch.Generator(device=t.device).manual_seed(dist.rank_seed(cfg.run.seed) + 2)
        q, r, _ = normalization_samples(t.model, t.tok, t.train_queries, cfg, t.ctx, gen)
        raw = dist.gather_rows(checked_scores(fn, response_texts(t.tok, r, cfg.task), reward, decode(t.tok, q)))
        mean, std = raw.mean().item(), max(raw.std(unbiased=False).item(), 1e-6)
        if dist.is_main():
            print(f"reward {reward}: normalized with mean {mean:+.4f}, std {std:.4f} of {len(raw)} initial-policy "
                  "samples", flush=True)  # fmt: skip
        return text_score_fn(lambda texts, queries: checked_scores(fn, texts, reward, queries).tolist(), t.tok, mean,
                             std, t.prefix, t.suffix, stop_tokens(cfg.task, t.tok)), {"reward": reward}  # fmt: skip
    rm_dir = Path(cfg.rewards.trained_model) if cfg.rewards.trained_model else run_dir / "reward_model"
    compiled = compiles_forwards(cfg.run.compile, t.device)
    info: dict[str, object] = {"reward": "model", "reward_model": str(rm_dir)}
    if source == "frame":
        rm = reward_frame(t).eval().freeze()
        return rm_score_fn(rm, compiled), info | {"state": RewardState(rm)}
    if source == "saved":
        if not is_reward_dir(rm_dir):  # a checkpoint is written only after the run's reward model is saved
            raise UserError(f"--resume {run_dir}: it has a checkpoint but no reward model in {rm_dir}")
        rm = load_reward(rm_dir, t.device).eval().requires_grad_(False)
        if not (rm_dir / "lmprefs.json").is_file() and not is_ensemble_dir(rm_dir):
            normalize_foreign(t, rm, rm_dir)
        # under FSDP scored through its forward: FSDP gathers a block at a time
        scorer = parallel.wrap(rm, "fsdp", t.dtype) if cfg.run.parallel == "fsdp" else rm
        return rm_score_fn(scorer, compiled), info
    if store is None or isinstance(store, str | Path):
        store = label_source(str(store or cfg.labels.source or "labels.sqlite"))
    # a reward model trained here logs into the run directory (phase "reward"), as PPO does after it; rank 0 only
    log = reward_logger(run_dir, cfg)
    try:
        rm, summary = train_reward_model(t, store, rm_dir, log, labels=labels)
    finally:
        log.close()
    rm.freeze()
    info["reward_training"] = summary
    # in the checkpoint whole, not only a LoRA adapter's: reward_model/ is an export with the gain and constant folded
    # into the head and final norm (and in the base model's dtype), so a run resumed from it would score otherwise.
    # FSDP's shards are not: rank 0 alone writes the checkpoint (such a run resumes from reward_model/)
    kept = rm.adapter is not None or not parallel.is_sharded(rm)
    return rm_score_fn(rm, compiled), info | ({"state": RewardState(rm)} if kept else {})


def normalize_foreign(t: Task, rm, rm_dir: Path, what: str | None = None) -> None:
    """Normalize a reward model lmprefs did not train (e.g. TRL's: no lmprefs.json) to mean 0, std 1 on samples of
    the initial policy, as lmprefs normalizes its own when it trains them and reward functions: its scale is
    arbitrary, and kl_coef and the KL target weigh a reward of that scale. With rewards.normalize false it is left
    as it is; either way one line says which, with the mean and std found. Deterministic (its own generator), so a
    resumed run normalizes it as the first did. `what`: the flag that named it, for the messages."""
    cfg = t.cfg
    what = what or f"rewards.trained_model={rm_dir}"
    gen = torch.Generator(device=t.device).manual_seed(dist.rank_seed(cfg.run.seed) + 2)
    q, r, _ = normalization_samples(t.model, t.tok, t.train_queries, cfg, t.ctx, gen)
    raw = dist.gather_rows(rm_rewards(rm, q, r, t.ctx).double())
    mean, std = raw.mean().item(), raw.std(unbiased=False).item()
    if cfg.rewards.normalize and not std > 1e-6:
        raise UserError(f"{what}: gives every one of {len(raw)} initial-policy samples the reward {mean:+.4f}; it "
                        "cannot rank responses (is it trained?)")  # fmt: skip
    if cfg.rewards.normalize:
        rm.set_norm(mean, std)
    if dist.is_main():
        how = ("normalized with" if cfg.rewards.normalize else
               "not normalized (rewards.normalize=false); its scores have")  # fmt: skip
        print(f"{what}: not trained by lmprefs (no lmprefs.json): {how} mean {mean:+.4f}, std {std:.4f} on "
              f"{len(raw)} initial-policy samples", flush=True)  # fmt: skip


def checked_scores(fn, texts: list[str], name: str, queries: list[str] | None = None) -> torch.Tensor:
    """fn(texts) (or fn(texts, queries) for a judge that reads the query) as float64 [len(texts)], or a UserError
    saying what the reward function returned instead."""

    return torch.tensor(finite_scores(score_texts(fn, texts, queries), texts, f"reward {name}"), dtype=torch.float64)


def check_same_tokenizer(model_dir: Path, tok, what: str) -> None:
    """A reward model reads the policy's token ids as they are, so it must share the policy's vocabulary: another
    tokenizer's ids would index the wrong embeddings (or past the end of them, an IndexError deep in torch)."""
    try:
        other = load_tokenizer(model_dir)
    except (OSError, ValueError) as e:
        why = str(e).splitlines()[0][:100]
        raise UserError(f"{what}: no tokenizer to compare with the policy's ({why})") from None
    if other is not tok and other.get_vocab() != tok.get_vocab():
        raise UserError(f"{what}: its tokenizer ({len(other)} tokens) differs from the policy's "
                        f"({len(tok)} tokens, task.initial_model); train the reward model on the same base model")


def track_true_reward(score_fn, true_fn, tok, prefix: Sequence[int] = (), suffix: Sequence[int] = (),
                      stop: Sequence[int] = ()):
    """(score_fn, on_update): the same scores, plus objective/true_reward (the true reward of each rollout's
    truncated responses) added to every update's metrics, for curves of what the reward model stands in for.
    `prefix`/`suffix`: the task's, around the rollout's queries (a judge that reads the query gets the query alone);
    `stop`: the task's stop tokens, left out of the texts it reads (`decode`)."""

    last: dict[str, float] = {}

    def score(q, r, frozen=None):
        last["v"] = sum(score_texts(true_fn, decode(tok, r, stop), query_texts(tok, q, prefix, suffix))) / len(r)
        return score_fn(q, r, frozen)

    def on_update(_, stats):
        stats["objective/true_reward"] = last.get("v", float("nan"))

    return score, on_update
