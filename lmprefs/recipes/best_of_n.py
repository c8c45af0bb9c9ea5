"""Best-of-n as a policy, an arm of `experiment compare`: n samples of rho per query, the reward model's first
highest kept, no training; its KL from rho the analytic log n - (n-1)/n."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from lmprefs.config import Config
from lmprefs.data.tasks import apply_penalty, decode, response_texts, stop_tokens, truncate_responses
from lmprefs.labels.labelers import score_texts
from lmprefs.models.ensemble import load_reward
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.pipeline.task import Task, setup_task
from lmprefs.recipes.compare_arms import Plan
from lmprefs.training.conservative import reduced_scores
from lmprefs.training.rollout import rm_score_fn
from lmprefs.training.scaling_laws import bon_kl


def best_of_n_arm(cfg: Config, rm_dir: Path, key: str, n: int, plan: Plan, true_fn) -> tuple[dict, int]:
    """Best-of-n against the reward model on the held-out queries; episodes: the samples it drew."""
    print(f"[{key}] sampling {n} x {plan.eval_samples} responses per held-out query", flush=True)
    t = setup_task(cfg, plan.n_eval)
    rm = load_reward(rm_dir, t.device).eval().requires_grad_(False)
    ev = best_of_n_policy(t, rm, t.heldout_queries[: plan.n_eval], true_fn, n, plan.eval_samples, cfg.run.seed + 5)
    print(f"[{key}] true reward {ev['mean']:+.4f} +/- {ev['stderr']:.4f}, KL {ev['kl']:.2f} (analytic)", flush=True)
    return ev, n * plan.eval_samples * ev["n_queries"]


@torch.no_grad()
def best_of_n_policy(t: Task, rm, queries: torch.Tensor, true_fn, n: int, samples: int, seed: int, *,
                     batch_size: int = 64) -> dict:  # fmt: skip
    """The true reward of best-of-n as a policy: per query `samples` times the first of the highest reward-model
    score (an ensemble's reduced by rewards.ensemble_reduce) among n samples of rho, scored as a rollout scores them
    (truncated, the task's penalty); mean +/- s.e. over queries of each query's mean, and KL(best-of-n, rho) =
    log n - (n-1)/n (analytic, for distinct scores)."""
    task, k = t.cfg.task, n * samples
    gen = torch.Generator(device=t.device).manual_seed(seed)
    score, per_query = rm_score_fn(rm), []
    step = max(1, batch_size // k)
    for i in range(0, len(queries), step):
        q = queries[i : i + step].to(t.device)
        formatted = t.ctx.format(q)
        with t.ctx.autocast():
            r, _ = sample(t.model, formatted, task.response_length, task.temperature, len(t.tok), gen, repeats=k,
                          stop_tokens=stop_tokens(task, t.tok), **sampler_options(t.cfg.run))  # fmt: skip
            post = truncate_responses(r, task.truncate_token, task.truncate_after)
            out = score(formatted.repeat_interleave(k, 0), post, None)  # an ensemble's: [K, B]
            rw = t.cfg.rewards
            proxy = apply_penalty(reduced_scores(out, rw.ensemble_reduce, rw.uwo_lambda)[0], post, task)
        articles = [x for x in decode(t.tok, q) for _ in range(k)]  # a judge may read the query
        true = torch.tensor(score_texts(true_fn, response_texts(t.tok, post, task), articles), dtype=torch.float64)
        pick = proxy.view(len(q), samples, n).argmax(2, keepdim=True).cpu()  # the first of the highest
        per_query += true.view(len(q), samples, n).gather(2, pick).squeeze(2).mean(1).tolist()
    x = torch.tensor(per_query, dtype=torch.float64)
    return {"mean": x.mean().item(), "stderr": (x.std() / math.sqrt(len(x))).item(), "n_queries": len(x),
            "samples_per_query": samples, "kl": bon_kl(n), "kl_stderr": 0.0, "kl_analytic": True}  # fmt: skip
