"""A policy on held-out queries: its reward (a reward on texts, the true one, or a reward model's score, the proxy)
as mean +/- s.e. over queries and its KL from a reference policy (`evaluate_policy`, `evaluate_model`); and a run's
learning curves (`plot_curves`). Shared by `quickstart`, the experiments, `train-policy` and `evaluate`."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from lmprefs.data.tasks import PAD, decode, stop_tokens, truncate_responses
from lmprefs.labels.labelers import score_texts
from lmprefs.models.lora import using
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.models.trunk import FrozenPrefix, frozen_depth
from lmprefs.pipeline.task import Task
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.runlog import progress
from lmprefs.training.rollout import ref_logprobs

# what each simulated labeler stands for, in reports and plots
TRUE_REWARD_NAMES = {"vader": "mock sentiment (VADER)", "descriptiveness": "mock descriptiveness",
                     "faithfulness": "summaries (MiniLM faithfulness judge)"}  # fmt: skip


def true_reward_name(labeler: str) -> str:
    return TRUE_REWARD_NAMES.get(labeler, labeler)


def _scores(t: Task, reward, formatted, post, resp: list[str], queries: torch.Tensor, k: int) -> torch.Tensor:
    """[len(queries), k] rewards of the truncated responses: a reward model (an nn.Module) reads the tokens as
    rollouts give them to it; a reward on texts reads the decoded responses (and the queries, for a judge)."""
    if isinstance(reward, torch.nn.Module):
        with t.ctx.autocast():
            return reward(formatted, post, repeats=k).float().cpu().view(len(queries), k)
    articles = [x for x in decode(t.tok, queries) for _ in range(k)]  # a judge may read the query
    return torch.tensor(score_texts(reward, resp, articles)).view(len(queries), k)


@torch.no_grad()
def evaluate_policy(t: Task, queries: torch.Tensor, true_fn, adapter: str | None, samples_per_query: int,
                    seed: int, *, batch_size: int = 256, desc: str = "evaluating", ref_model=None,
                    kl_batch_size: int = 64) -> dict:  # fmt: skip
    """True reward of a policy on held-out queries: mean and standard error over queries (each query's reward is
    the mean over its samples), every sample's reward ("scores", [queries][samples]), and the texts of the first
    sample of each query. `true_fn`: a reward on texts, or a RewardModel (its score: the proxy). With `ref_model`
    (the initial policy: adapters off), also the KL of the policy from it, sum over the response of logp - logp_ref
    as in objective/kl, averaged over every sample: a steadier figure than the last training batch's.
    Under several ranks each rank evaluates its strided share of the queries with its own seed (seed + rank *
    100003) and the shares are gathered, so every rank returns the same figures over all queries in 1/N of the
    time; a collective, every rank calls it. With task.stop_at_eos, also the mean length of the responses in tokens
    (the stop token included, as objective/response_length counts them) +/- its s.e. over samples.
    Samples are drawn `batch_size` rows at a time (the decode step's fixed costs shared by more rows), and the
    reference logprobs computed `kl_batch_size` rows at a time (their logits over the vocabulary are the largest
    tensor of an evaluation)."""

    task = t.cfg.task
    gen = torch.Generator(device=t.device).manual_seed(dist.rank_seed(seed))
    stop = stop_tokens(task, t.tok)
    per_query, texts, kls, every, lens = [], [], [], [], []
    bar = progress(len(queries), desc)
    mine = dist.shard(queries)
    # the reference pass starts from the sampling pass's frozen prefix where the reference is the sampled model's
    # base (LoRA in its top blocks)
    depth = frozen_depth(t.model) if ref_model is t.model else 0
    for i in range(0, len(mine), max(1, batch_size // samples_per_query)):
        q = mine[i : i + max(1, batch_size // samples_per_query)].to(t.device)
        formatted = t.ctx.format(q)
        with t.ctx.autocast(), using(t.model, adapter):
            r, logp, prefix = sample(t.model, formatted, task.response_length, task.temperature, len(t.tok), gen,
                                     repeats=samples_per_query, stop_tokens=stop, prefix_depth=depth,
                                     **sampler_options(t.cfg.run))  # fmt: skip
        if ref_model is not None:
            kls += _kl(t, ref_model, formatted, r, logp, samples_per_query, kl_batch_size, prefix=prefix)
        lens += (r != PAD).sum(1).tolist()
        post = truncate_responses(r, task.truncate_token, task.truncate_after)
        resp = decode(t.tok, post, stop)
        scores = _scores(t, true_fn, formatted, post, resp, q, samples_per_query)
        per_query += scores.mean(1).tolist()
        every += scores.tolist()
        texts += resp[::samples_per_query]
        bar.update(len(q) * dist.world())
    bar.close()
    if dist.world() > 1:  # every rank's share, back in the queries' order (rank r held queries r, r + N, ...)
        parts = dist.all_gather_objects((per_query, texts, kls, every, lens))
        per_query, texts = _interleave([p[0] for p in parts]), _interleave([p[1] for p in parts])
        every = _interleave([p[3] for p in parts])
        kls, lens = [k for p in parts for k in p[2]], [n for p in parts for n in p[4]]
    x = torch.tensor(per_query, dtype=torch.float64)
    out = {"mean": x.mean().item(), "stderr": (x.std() / math.sqrt(len(x))).item(), "n_queries": len(x),
           "samples_per_query": samples_per_query, "per_query": per_query, "scores": every,
           "texts": texts}  # fmt: skip
    if kls:
        k = torch.tensor(kls, dtype=torch.float64)
        out |= {"kl": k.mean().item(), "kl_stderr": (k.std() / math.sqrt(len(k))).item()}
    if stop:
        n = torch.tensor(lens, dtype=torch.float64)
        out |= {"response_length": n.mean().item(), "response_length_stderr": (n.std() / math.sqrt(len(n))).item()}
    return out


def _kl(t: Task, ref_model, queries: torch.Tensor, responses: torch.Tensor, logp: torch.Tensor, repeats: int,
        batch_size: int, *, prefix: FrozenPrefix | None = None) -> list[float]:  # fmt: skip
    """Per sample, the sum over its real tokens of logp - logp_ref: queries [B, Q], responses and logp
    [B * repeats, T]; `prefix`: the rows' frozen prefix [B * repeats, Q + T, d] (the sampler's)."""
    out, per = [], max(1, batch_size // repeats)
    for j in range(0, len(queries), per):
        rows = slice(j * repeats, (j + per) * repeats)
        with t.ctx.autocast(), using(ref_model, None):
            ref = ref_logprobs(ref_model, queries[j : j + per], responses[rows], t.cfg.task.temperature, len(t.tok),
                               prefix[rows] if prefix is not None else None, repeats)  # fmt: skip
        # rows that stopped at a stop token: the padding after it is no token of either policy
        diff = torch.where(responses[rows] != PAD, logp[rows].float() - ref.float(), 0.0)
        out += diff.sum(1).tolist()
    return out


def _interleave(parts: list[list]) -> list:
    out: list = [None] * sum(len(p) for p in parts)
    for r, p in enumerate(parts):
        out[r :: len(parts)] = p
    return out


def evaluate_model(t: Task, policy, queries, true_fn, samples: int, seed: int, desc: str) -> dict:
    """evaluate_policy of a trained policy (a Policy: an adapter on t.model, or its own LM; None: t.model itself),
    with its KL from t.model, the initial policy (0 +/- 0 for t.model itself)."""

    adapter = policy.adapter if policy is not None else None
    task = t if policy is None or adapter else Task(**{**t.__dict__, "model": policy.lm})
    e = evaluate_policy(task, queries, true_fn, adapter, samples, seed, desc=desc,
                        ref_model=None if policy is None else t.model)  # fmt: skip
    return e if "kl" in e else e | {"kl": 0.0, "kl_stderr": 0.0}


def evaluate_arm(t, policy, queries, true_fn, samples: int, seed: int, desc: str) -> dict:
    """True reward (mean +/- s.e. over queries) and KL(pi, rho) on policy samples (sum over the response of log pi -
    log rho at the task temperature, mean +/- s.e. over samples) of a trained policy (None: the initial one)."""

    e = evaluate_model(t, policy, queries, true_fn, samples, seed, desc)
    return {k: e[k] for k in ("mean", "stderr", "n_queries", "samples_per_query", "kl", "kl_stderr")}


def plot_curves(metrics: list[dict], out: Path, labeler: str | None = "vader") -> list[str]:
    """curves.png: the original's objective/score, objective/true_reward, objective/kl and objective/kl_coef over
    PPO updates, each panel titled with its metric name (a metric the run did not log says so)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    true = f"true reward: {true_reward_name(labeler)}" if labeler else "true reward"
    panels = [("objective/score", "the reward PPO optimizes"), ("objective/true_reward", true),
              ("objective/kl", "KL(policy || initial), nats"),
              ("objective/kl_coef", "KL coefficient beta")]  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    steps = [m["step"] for m in metrics]
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        ys = [m.get(key, float("nan")) for m in metrics]
        ax.plot(steps, ys, marker=".")
        if not any(key in m for m in metrics):
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
        # y given: matplotlib then skips measuring the axis to lift a title above top tick labels (there are none)
        ax.set_title(f"{key}\n{title}", fontsize=10, y=1.0)
        ax.set_xlabel("PPO update")
        ax.locator_params(nbins=5)  # each tick is drawn text, and most of the figure's cost: at most 5 intervals
        ax.ticklabel_format(axis="y", useOffset=False)  # beta moves in its 5th digit: plain values, not an offset
        ax.grid(alpha=0.3)
    # fixed margins that fit two-line titles and 7-digit tick labels: tight_layout measures every text first, a third
    # of this figure's cost, paid by every run
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.07, top=0.92, wspace=0.22, hspace=0.42)
    path = out / "curves.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path.name]
