"""Online DPO (`lmprefs train-dpo --online`; Guo et al. 2024, "Direct Language Model Alignment from Online AI
Feedback", arXiv 2402.04792): at each step, dpo.online_samples responses to each of dpo.batch_size fresh queries are
sampled from the current policy, judged by a reward (a reward model, or a function such as the simulated labeler),
and the DPO loss of `dpo_train` is taken on them, the judged best as the chosen response, against the frozen
reference. With two samples it is the paper's pairwise online DPO; with more, dpo.loss=pairwise averages the chosen
response's pairs with each other one and listwise takes the best-of-N softmax.

Each step's queries come from a QueryStream (as PPO's do) and its samples from a generator of its own; both are in
the checkpoint, so a killed run resumes bitwise. The loss's log-probabilities are at the sampling temperature, with
padding after a stop token counting nothing, as train-dpo's.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import Tensor

from lmprefs.config import Config
from lmprefs.data.queries import QueryStream
from lmprefs.data.tasks import TaskContext, apply_penalty, stop_tokens, truncate_responses
from lmprefs.io.atomic import crash_point
from lmprefs.models.lora import using
from lmprefs.models.policy import Policy
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.runtime.runlog import progress
from lmprefs.training.conservative import reduced_scores
from lmprefs.training.dpo import preference_stats
from lmprefs.training.dpo_train import STATS, dpo_microbatch, log_step, losses, response_logprobs, trained_parameters
from lmprefs.training.optim import TFAdam
from lmprefs.training.policy_run import ScoreFn
from lmprefs.training.step_checkpoint import load_step_checkpoint, save_step_checkpoint

SAMPLING_SEED = 7  # the sampling generator's offset from run.seed, apart from the adapters' (+3, +4)


@torch.no_grad()
def judged_samples(policy: Policy, score_fn: ScoreFn, queries: Tensor, cfg: Config, ctx: TaskContext,
                   gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(samples [b, S, T], scores [b, S], the judged best of each query [b]) for queries [b, Q] (unformatted): S =
    dpo.online_samples responses from the policy, truncated and penalized as PPO scores them."""
    task, S = cfg.task, cfg.dpo.online_samples
    q = ctx.format(queries)
    with using(policy.lm, policy.adapter), ctx.autocast():
        responses, _ = sample(policy.lm, q, task.response_length, task.temperature, policy.vocab, gen, repeats=S,
                              stop_tokens=stop_tokens(task, policy.tokenizer), **sampler_options(cfg.run))  # fmt: skip
    post = truncate_responses(responses, task.truncate_token, task.truncate_after)
    with ctx.autocast():
        out = score_fn(q.repeat_interleave(S, 0), post, None)
    raw = reduced_scores(out, cfg.rewards.ensemble_reduce, cfg.rewards.uwo_lambda)[0]  # [b * S]
    scores = apply_penalty(raw, post, task).view(-1, S)  # [b, S]
    return responses.view(len(queries), S, -1), scores, scores.argmax(1)


def online_step(policy: Policy, samples: Tensor, queries: Tensor, best: Tensor, cfg: Config, ctx: TaskContext,
                ref_lm=None, *, micro: int) -> dict[str, float]:  # fmt: skip
    """Forward and backward of one step's judged samples [b, S, T], in microbatches of `micro` queries
    (dpo_microbatch) whose gradients add up to the step's mean loss; the step's stats, with the policy's KL from the
    reference on its own samples (the summed log-ratio, nats per response)."""
    b = len(queries)
    sums = dict.fromkeys((*STATS, "kl"), 0.0)
    for m0 in range(0, b, micro):
        sl = slice(m0, m0 + micro)
        with torch.no_grad():
            ref = response_logprobs(policy, queries[sl], samples[sl], ctx, reference=True, ref_lm=ref_lm)  # [m, S]
        logp = response_logprobs(policy, queries[sl], samples[sl], ctx)  # [m, S] with gradients
        each, h = losses(logp, ref, best[sl].to(logp.device), cfg)
        (each.sum() / b).backward()
        part = {"loss": each.detach().mean(), "kl": (logp.detach() - ref).mean()}
        part |= preference_stats(h.detach(), best[sl].to(h.device))
        for k in sums:
            sums[k] += float(part[k]) * len(each) / b
    return sums


def train_online_dpo(cfg: Config, policy: Policy, score_fn: ScoreFn, stream: QueryStream, ctx: TaskContext, *,
                     ref_lm=None, log=None, run_dir: Path | None = None, resume: bool = False) -> dict:  # fmt: skip
    """dpo.online_steps steps of online DPO. ref_lm: the frozen reference (None: the policy's base with its adapter
    off, LoRA). run_dir: a checkpoint every run.save_interval steps (None: none); resume: continue from it, bitwise
    as a run that never stopped. Returns the summary; the caller saves the policy."""
    d, t0 = cfg.dpo, time.time()
    params = trained_parameters(policy)
    opt = TFAdam(params, lr=d.lr)
    gen = torch.Generator(device=ctx.device).manual_seed(cfg.run.seed + SAMPLING_SEED)
    total, done = d.online_steps, 0
    if resume:
        if run_dir is None:
            raise ValueError("train_online_dpo: resume needs the run_dir of the checkpoint")
        state, _ = load_step_checkpoint(run_dir, cfg, params, opt, "online DPO")
        done = int(state["step"])
        gen.set_state(state["sampling"])
        stream.load_state_dict(state["queries"])
        print(f"resuming {run_dir} at step {done}/{total}", flush=True)
    # chosen once per process: dpo.online_samples responses of task.response_length tokens a query
    micro = dpo_microbatch(d, d.online_samples, cfg.task.response_length, policy.vocab, ctx.device)
    bar, stats = progress(total, "train-dpo --online", initial=done), {}
    try:
        for step in range(done, total):
            for group in opt.param_groups:  # linear decay to 0, as every lmprefs trainer
                group["lr"] = d.lr * (1 - step / total)
            queries = stream.next(d.batch_size).to(ctx.device)
            policy.eval()
            samples, scores, best = judged_samples(policy, score_fn, queries, cfg, ctx, gen)
            policy.train()
            opt.zero_grad(set_to_none=True)
            sums = online_step(policy, samples, queries, best, cfg, ctx, ref_lm, micro=micro)
            opt.step()
            stats = {f"dpo/{k}": v for k, v in sums.items() if k != "kl"}
            stats |= {"dpo/lr": opt.param_groups[0]["lr"], "objective/kl": sums["kl"],
                      "objective/score": scores.mean().item(),
                      "objective/score_best": scores.max(1).values.mean().item()}  # fmt: skip
            log_step(log, stats, step, cfg, "online DPO")
            bar.update(1)
            bar.set_postfix(loss=f"{stats['dpo/loss']:.3f}", score=f"{stats['objective/score']:.2f}")
            if run_dir is not None and (step + 1) % max(1, cfg.run.save_interval) == 0 and step + 1 < total:
                save_step_checkpoint(run_dir, cfg, step + 1, params, opt,
                                     {"sampling": gen.get_state(), "queries": stream.state_dict()}, {})  # fmt: skip
                crash_point("dpo:saved")
    finally:
        bar.close()
    policy.eval()
    summary = {f"final/{k}": v for k, v in stats.items()}
    summary |= {"dpo/steps": total, "dpo/episodes": total * d.batch_size * d.online_samples,
                "elapsed/time": time.time() - t0}  # fmt: skip
    if log is not None:
        log.scalars(summary, total, phase="dpo")
    return summary
