"""`lmprefs sample`: continuations from the initial model of a preset or from a trained policy, printed in the
original's sample.py format (a rule of '=', the query, the response; newlines shown as ⏎); with best-of-n, the
highest-scoring of n continuations per query."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from lmprefs.config import RewardsConfig
from lmprefs.config.validate import MIN_TEMPERATURE
from lmprefs.data.queries import task_queries
from lmprefs.data.tasks import apply_penalty, decode, format_queries, response_texts, stop_tokens, truncate_responses
from lmprefs.errors import UserError
from lmprefs.io.inputs import input_dir
from lmprefs.models.artifacts import load_policy
from lmprefs.models.ensemble import RewardEnsemble, is_ensemble_dir, is_reward_dir, load_reward, read_manifest
from lmprefs.models.loading import load_lm, max_positions
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.pipeline.rewards import check_same_tokenizer, checked_scores, no_ensemble, reward_function
from lmprefs.pipeline.task import HELDOUT_QUERIES, note_chat_template
from lmprefs.runtime.device import autocast, setup_torch
from lmprefs.training.conservative import reduced_scores


def _setup(cfg, n: int, policy_dir: Path | None, temperature: float | None, seed: int | None, split: str):
    """(model, tokenizer, n queries of the split [n, Q], the task's prefix and suffix, the sampling generator,
    the temperature, device, dtype) for `lmprefs sample`."""
    device, dtype = setup_torch(cfg.run)
    temperature = temperature if temperature is not None else cfg.task.temperature
    if not (math.isfinite(temperature) and temperature >= MIN_TEMPERATURE):  # nan, inf and 1e-300 sample nothing
        raise UserError(f"--temperature {temperature}: must be a finite number of at least {MIN_TEMPERATURE:g}")
    if policy_dir is not None:
        policy = load_policy(policy_dir, device, temperature)
        model, tok = policy.lm, policy.tokenizer
    else:
        model, tok = load_lm(cfg.task.initial_model, device)
    train, heldout, prefix, suffix = task_queries(cfg.task, tok, max_positions(model), HELDOUT_QUERIES)
    note_chat_template(cfg, tok)
    pool = heldout if split == "heldout" else train
    if n > len(pool):  # randperm(...)[:n] would print fewer than asked, without a word
        raise UserError(f"--n {n}: the {split} split of task.query_dataset={cfg.task.query_dataset!r} has only "
                        f"{len(pool)} queries")  # fmt: skip
    seed = cfg.run.seed if seed is None else seed
    gen = torch.Generator(device=device).manual_seed(seed)
    pick = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:n]
    return model, tok, pool[pick].to(device), prefix, suffix, gen, temperature, device, dtype


def sample_texts(cfg, n: int, policy_dir: Path | None = None, temperature: float | None = None,
                 seed: int | None = None, split: str = "heldout") -> list[tuple[str, str]]:  # fmt: skip
    """(query, response) texts: n queries of the split continued by a saved policy, or by cfg's initial model."""

    model, tok, queries, prefix, suffix, gen, temperature, device, dtype = _setup(cfg, n, policy_dir, temperature,
                                                                                   seed, split)  # fmt: skip
    with autocast(device, dtype):
        responses, _ = sample(model, format_queries(queries, prefix, suffix), cfg.task.response_length,
                              temperature, len(tok), gen, stop_tokens=stop_tokens(cfg.task, tok),
                              **sampler_options(cfg.run))  # fmt: skip
    return list(zip(decode(tok, queries), response_texts(tok, responses, cfg.task), strict=True))


def reward_scorer(tok, device, reward_model: Path | None = None, reward: str | None = None, stop: tuple = (),
                  rewards: RewardsConfig | None = None):  # fmt: skip
    """score(formatted queries [B, Q], responses [B, T], query texts) -> [B] float: a reward model's (it reads the
    policy's token ids, so it must share its tokenizer), an ensemble's members' scores reduced by
    `rewards`.ensemble_reduce (default mean), or a reward function's (vader, module:function) scores, on the texts
    without a stop token that ended them (`stop`)."""
    rewards = rewards or RewardsConfig()
    check_reduce(rewards, reward_model, reward)
    if reward_model is not None:
        path = input_dir(reward_model, "--reward-model", "reward-model directory")
        if not is_reward_dir(path):
            raise UserError(f"--reward-model {path}: not a reward-model directory (no sequence classifier with "
                            "num_labels=1) nor a reward-model ensemble (no ensemble.json)")  # fmt: skip
        first = path / read_manifest(path)["members"][0] if is_ensemble_dir(path) else path
        check_same_tokenizer(first, tok, f"--reward-model {path}")
        rm = load_reward(path, device).eval().requires_grad_(False)
        members = {"members": True} if isinstance(rm, RewardEnsemble) else {}
        how, lam = rewards.ensemble_reduce, rewards.uwo_lambda
        return lambda q, r, texts: reduced_scores(rm(q, r, **members), how, lam)[0]
    name, fn = reward_function(reward)
    return lambda q, r, texts: checked_scores(fn, decode(tok, r, stop), name, texts).float().to(r.device)


def check_reduce(rewards: RewardsConfig, reward_model: Path | None, reward) -> None:
    """rewards.ensemble_reduce min or uwo needs an ensemble directory as --reward-model: a UserError otherwise (a
    --reward-model that is no reward model at all is reward_scorer's to name)."""
    how = rewards.ensemble_reduce
    if how == "mean" or (reward_model is not None and is_ensemble_dir(Path(reward_model))):
        return
    if reward_model is None:
        raise UserError(no_ensemble(how, f"--reward {reward} is a reward function"))
    if is_reward_dir(Path(reward_model)):
        raise UserError(no_ensemble(how, f"--reward-model {reward_model} is a single reward model"))


def best_of_n(cfg, n: int, best_of: int, policy_dir: Path | None = None, temperature: float | None = None,
              seed: int | None = None, split: str = "heldout", *, reward_model: Path | None = None,
              reward: str | None = None) -> list[dict]:  # fmt: skip
    """Best-of-`best_of` as a policy: for each of n queries, `best_of` samples (one prefill per query), scored as a
    rollout scores them (truncated, with the task's penalty) and the first of the highest kept. One dict per query:
    query, response (the chosen one, untruncated as `sample_texts` prints it), score, and every drawn response and
    its score (`responses`, `scores`, in draw order)."""
    if best_of < 1:
        raise UserError(f"--best-of {best_of}: must be at least 1")
    check_reduce(cfg.rewards, reward_model, reward)  # before any model loads
    model, tok, queries, prefix, suffix, gen, temperature, device, dtype = _setup(cfg, n, policy_dir, temperature,
                                                                                   seed, split)  # fmt: skip
    score = reward_scorer(tok, device, reward_model, reward, stop_tokens(cfg.task, tok), cfg.rewards)
    task, q = cfg.task, format_queries(queries, prefix, suffix)
    with autocast(device, dtype):
        responses, _ = sample(model, q, task.response_length, temperature, len(tok), gen, repeats=best_of,
                              stop_tokens=stop_tokens(task, tok), **sampler_options(cfg.run))  # fmt: skip
        post = truncate_responses(responses, task.truncate_token, task.truncate_after)
        texts = [t for t in decode(tok, queries) for _ in range(best_of)]
        raw = score(q.repeat_interleave(best_of, 0), post, texts)  # [n * best_of]
    scores = apply_penalty(raw.float(), post, task).view(-1, best_of).cpu()  # [n, best_of]
    pick = scores.argmax(1)  # [n]
    drawn = response_texts(tok, responses, task)
    return [{"query": qt, "response": drawn[i * best_of + int(j)], "score": scores[i, j].item(),
             "responses": drawn[i * best_of : (i + 1) * best_of], "scores": scores[i].tolist()}
            for i, (qt, j) in enumerate(zip(decode(tok, queries), pick, strict=True))]  # fmt: skip
