"""Steps 1-4 of a PPO update (train_policy.py @cbfd210): sample responses, score the policy's and the reference's
logprobs and values, truncate and score the responses, and form the KL-penalized per-token rewards."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lmprefs.config import Config
from lmprefs.data.tasks import (
    TaskContext,
    apply_penalty,
    decode,
    query_texts,
    response_mask,
    stop_tokens,
    truncate_responses,
)
from lmprefs.models import parallel
from lmprefs.models.ensemble import RewardEnsemble
from lmprefs.models.lora import using
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.models.token_logprobs import token_logprobs
from lmprefs.models.trunk import FrozenPrefix, frozen_depth, frozen_prefix, response_logits_hidden
from lmprefs.runtime.device import compiles_forwards
from lmprefs.training.conservative import members_std, reduced_scores
from lmprefs.training.grpo import dr_grpo_advantages, grpo_advantages, reinforce_pp_baseline_advantages
from lmprefs.training.masked import partial_mask
from lmprefs.training.policy_run import PolicyRun, ScoreFn
from lmprefs.training.ppo import Rollout, kl_penalized_rewards
from lmprefs.training.rloo import rloo_advantages, rloo_returns


def rm_score_fn(rm, compile: bool = False) -> ScoreFn:
    """Scores from a reward model [B], or a RewardEnsemble's member scores [K, B] (each member normalized), which
    the caller reduces (`reduced_scores`, by rewards.ensemble_reduce); a reward adapter on the policy's base reuses
    the rollout's frozen prefix. compile: its forward under torch.compile (`compiles_forwards`), a graph per batch
    shape."""
    call = torch.compile(rm, dynamic=False) if compile else rm
    members = {"members": True} if isinstance(rm, RewardEnsemble) else {}

    def score(queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None) -> Tensor:
        with torch.no_grad():
            return call(queries, responses, prefix, **members).float()

    return score


def text_score_fn(fn: Callable[[list[str], list[str]], list[float]], tok, mean: float = 0.0, std: float = 1.0,
                  prefix: Sequence[int] = (), suffix: Sequence[int] = (),
                  stop: Sequence[int] = ()) -> ScoreFn:  # fmt: skip
    """A reward on the response text (e.g. VADER): the paper's 'direct access to the true reward', as
    (fn(responses, queries) - mean) / std; the queries are the query texts without the task's prefix and suffix,
    the responses' texts without a stop token that ended them (`stop`, the task's stop_tokens)."""

    def score(queries: Tensor, responses: Tensor, frozen: FrozenPrefix | None = None) -> Tensor:
        texts = fn(decode(tok, responses, stop), query_texts(tok, queries, prefix, suffix))
        raw = torch.tensor(texts, dtype=torch.float32, device=responses.device)
        return (raw - mean) / std

    return score


def ref_logprobs(ref_lm, queries: Tensor, responses: Tensor, temperature: float, vocab: int,
                 prefix: FrozenPrefix | None = None, repeats: int = 1, *,
                 compile: bool = False) -> Tensor:  # fmt: skip
    """log pi_ref(response_t) [B, T] of responses [B * k, T] to queries [B, Q] (k = repeats). compile: under
    torch.compile (`compiles_forwards`), where inductor fuses the trunk's elementwise work and the log-softmax over
    the vocabulary that eager runs as passes over a [B, T, V] fp32 tensor."""
    fn = _compiled_ref_logprobs() if compile else _ref_logprobs
    return fn(ref_lm, queries, responses, temperature, vocab, prefix, repeats)


def _ref_logprobs(ref_lm, queries: Tensor, responses: Tensor, temperature: float, vocab: int,
                  prefix: FrozenPrefix | None, repeats: int) -> Tensor:  # fmt: skip
    _, logits = response_logits_hidden(ref_lm, queries, responses, prefix, repeats)
    return token_logprobs(logits, responses, temperature, vocab)[0]


@functools.cache
def _compiled_ref_logprobs() -> Callable:
    """Made once per process: dynamo keeps a graph per model and shape under it."""
    return torch.compile(_ref_logprobs, dynamic=False)


@torch.no_grad()
def make_rollout(run: PolicyRun, score_fn: ScoreFn, queries: Tensor, cfg: Config, ctx: TaskContext):
    """Steps 1-4 of an update: (Rollout, stats, texts for printing). With a group estimator (ppo.estimator rloo,
    grpo, dr_grpo, reinforce_pp_baseline), each of the queries [B / k, Q] is answered by k = ppo.rloo_k samples
    (rows i * k + j), sampled from one prefill of the query."""

    policy, task = run.policy, cfg.task
    k = cfg.ppo.samples_per_query
    stop = stop_tokens(task, policy.tokenizer)  # () unless task.stop_at_eos
    q = ctx.format(queries)

    def policy_pass():
        # logprobs and values come from the sampling pass itself (policy.respond in the original): no extra forward;
        # with LoRA in the top blocks, so does the frozen prefix below them, which the reference, the reward model
        # and every PPO epoch of this batch then start from (None when all blocks train)
        with using(policy.lm, policy.adapter):
            responses, logprobs, hidden, prefix = sample(
                policy.lm, q, task.response_length, task.temperature, policy.vocab, run.gen_sample,
                return_hidden=True, repeats=k, stop_tokens=stop, prefix_depth=frozen_depth(policy.lm),
                **sampler_options(cfg.run))  # fmt: skip
        q_rows = q.repeat_interleave(k, 0) if k > 1 else q  # [B, Q] one row per sample
        if prefix is None:  # a compiled sampler's step keeps none
            prefix = frozen_prefix(policy.lm, torch.cat([q_rows, responses], dim=1))
        # a group estimator's baseline is the other samples' returns: the value head is neither read nor trained
        values = torch.zeros_like(logprobs) if k > 1 else policy.values_from(q_rows, responses, hidden, prefix)
        return q_rows, responses, logprobs, values, prefix

    def ref_pass():
        with using(policy.lm, None):  # with LoRA the reference is the shared base, adapters off
            return ref_logprobs(run.ref_lm or policy.lm, q, responses, task.temperature, policy.vocab, prefix,
                                compile=compiles_forwards(cfg.run.compile, ctx.device))  # fmt: skip

    with ctx.autocast():  # under FSDP each pass gathers its model's shards first (a collective)
        q, responses, logprobs, values, prefix = parallel.gathered(policy, policy_pass)
        ref = parallel.gathered(run.ref_lm, ref_pass) if run.ref_lm is not None else ref_pass()
    logprobs, values, ref = logprobs.float(), values.float(), ref.float()
    real = response_mask(responses)  # [B, T] 1 up to each row's stop token (all ones without task.stop_at_eos)
    mask = partial_mask(real) if stop else None  # None while every row is full length: the original's math
    if mask is not None:  # the padding's logprobs and values are of no token: 0, as the sampler's logprobs there
        keep = mask.bool()
        ref, values = torch.where(keep, ref, 0), torch.where(keep, values, 0)
    post = truncate_responses(responses, task.truncate_token, task.truncate_after)  # 3. score the truncated text
    with ctx.autocast():
        out = score_fn(q, post, prefix)  # a reward model reads each row's last real token
    raw, members = reduced_scores(out, cfg.rewards.ensemble_reduce, cfg.rewards.uwo_lambda)  # [B], [K, B] | None
    scores = apply_penalty(raw, post, task)
    rewards, non_score, kl = kl_penalized_rewards(logprobs, ref, scores, run.kl_ctl.value, mask)  # 4.
    stats = {  # record_step_stats (train_policy.py#L241)
        "objective/kl": kl.sum(1).mean().item(),
        "objective/kl_coef": run.kl_ctl.value,
        "objective/entropy": (-logprobs).sum(1).mean().item(),
        "objective/score": scores.mean().item(),
        "objective/score_total": (non_score.sum(1) + scores).mean().item(),
        "objective/penalized_fraction": (scores != raw).float().mean().item(),
        "objective/response_length": real.sum(1).mean().item(),  # sampled tokens, the stop token included
    }
    if members is not None:  # an ensemble: objective/score is its reduced score (rewards.ensemble_reduce)
        stats |= member_stats(members, post, task)
    advantages, loss_kl_coef = None, None
    if k > 1:
        advantages, group_stats = group_advantages(cfg, scores, kl, run.kl_ctl.value, mask)
        stats |= group_stats
        if cfg.ppo.kl_in_loss:  # the same beta on every row, so that a minibatch's rows carry it
            loss_kl_coef = torch.full_like(scores, run.kl_ctl.value)
    rollout = Rollout(q, responses, logprobs, ref, values, scores, rewards, prefix, advantages, mask, loss_kl_coef)
    return rollout, stats, {"responses": post, "kl": kl.sum(1)}


def member_stats(members: Tensor, post: Tensor, task) -> dict[str, float]:
    """An ensemble's members' scores [K, B] of the truncated responses `post` [B, T], as stats:
    objective/score_members_mean, the members' mean with the task's penalty (objective/score under
    ensemble_reduce=mean), and objective/score_members_std, their disagreement: the population std over members of
    each response's scores, averaged over the batch, in the members' normalized units (std 1 on the labels'
    distribution). It is taken on every response, penalized or not: the penalty is no member's opinion. Each
    member's own mean score, with the penalty, is objective/score_member_k."""
    own = apply_penalty(members, post, task).mean(1)  # [K]
    return {"objective/score_members_mean": apply_penalty(members.mean(0), post, task).mean().item(),
            "objective/score_members_std": members_std(members).mean().item()} | {
        f"objective/score_member_{k}": v for k, v in enumerate(own.tolist())}  # fmt: skip


def group_advantages(cfg: Config, scores: Tensor, kl: Tensor, kl_coef: float,
                     mask: Tensor | None) -> tuple[Tensor, dict[str, float]]:  # fmt: skip
    """A group estimator's advantages ([B], or [B, T] for reinforce_pp_baseline) from scores [B] and the per-token
    KL [B, T], with their stats under the estimator's name. Where the KL is a term of the loss (ppo.kl_in=loss) the
    return is the score alone."""
    p = cfg.ppo
    k = p.rloo_k
    if p.estimator == "reinforce_pp_baseline":
        advantages = reinforce_pp_baseline_advantages(scores, kl, kl_coef, k, mask)
        return advantages, {f"{p.estimator}/score_group_std": scores.view(-1, k).std(1, correction=0).mean().item()}
    returns = scores if p.kl_in_loss else rloo_returns(scores, kl, kl_coef)  # [B]
    fn = {"rloo": rloo_advantages, "grpo": grpo_advantages, "dr_grpo": dr_grpo_advantages}[p.estimator]
    advantages = fn(returns, k)  # [B]
    return advantages, {f"{p.estimator}/advantage_std": advantages.std(correction=0).item(),
                        f"{p.estimator}/return_mean": returns.mean().item(),
                        f"{p.estimator}/return_std": returns.std(correction=0).item()}  # fmt: skip
