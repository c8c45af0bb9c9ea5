"""`lmprefs experiment overoptimization`: Gao, Schulman and Hilton's (2022) protocol at small scale, with the
simulated labeler labels.labeler as the gold reward, and the conservative ensemble rewards of Coste et al. (2023).

Per seed, one store of labels (label-efficiency's shared pool: the largest count of questions and a set of held-out
questions, answered by the labeler once) and, for each label count N, one ensemble of K reward models trained on the
first N of them in a seeded order (train_reward.ensemble K). The proxies of a count:

- single: the ensemble's member 0 alone (run.seed's initialization and the same labels: a model trained alone);
- mean, min, uwo: the members' normalized scores reduced by training.conservative.ensemble_reduce (uwo with
  --uwo-lambda).

Arms, per proxy:

- best-of-n (method `bon`): M samples of the initial policy on each of Q held-out queries, drawn once per seed
  with their true reward (samples.json) and scored by every member of each count's ensemble (pool-N.json); for
  n = 1, 2, 4, ... M the expected true and proxy reward of the sample the proxy ranks first among n (the unbiased
  estimate over every n-subset of the M, training.scaling_laws.bon_weights), at KL log n - (n - 1)/n. Every proxy
  reads the same scores: free beside the first.
- PPO (method `ppo`): a train-policy run against the proxy at a small fixed KL coefficient (--kl-coef, no target),
  run for the preset's ppo.total_episodes; its curve is every update's rollouts (objective/kl, objective/score, the
  proxy it optimizes, and objective/true_reward) averaged in CHUNKS consecutive windows; its end point is evaluated
  on the Q held-out queries; an ensemble proxy is rewards.ensemble_reduce of its members' scores.

results.json is rewritten after every stage; a killed run started again with its command line skips what is done,
remakes a seed's pool scores or a reward model it stopped in, and resumes a PPO arm from its checkpoint (each
logged update once). The analysis is lmprefs.recipes.overoptimization_report.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import torch

from lmprefs.config import Config
from lmprefs.data.tasks import apply_penalty, decode, response_texts, stop_tokens, truncate_responses
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text, crash_point
from lmprefs.labels.labelers import score_texts
from lmprefs.models.ensemble import load_reward, member_name
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.pipeline.evaluation import evaluate_model
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.task import Task, check_heldout, setup_task
from lmprefs.recipes.experiment import Results, seed_key, train_arm, true_reward_fn
from lmprefs.recipes.label_efficiency import SeedPool, heldout_questions, seed_pool
from lmprefs.runtime.runlog import read_metrics
from lmprefs.training.conservative import REDUCTIONS, ensemble_reduce
from lmprefs.training.scaling_laws import bon_kl, bon_weights

R = dataclasses.replace
PROXIES = ("single", *REDUCTIONS)
METHODS = ("bon", "ppo")
CHUNKS = 10  # windows a PPO run's updates are averaged in (at most): one point each on its curve
MIN_UPDATES = 3
DEFAULT_LABELS = (64, 256)
DEFAULT_MEMBERS = 4


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `experiment overoptimization` runs."""

    labels: tuple[int, ...] = DEFAULT_LABELS
    """Label counts N of the proxies (sorted)."""
    members: int = DEFAULT_MEMBERS
    """K: members of each proxy ensemble."""
    proxies: tuple[str, ...] = PROXIES
    """Which of single, mean, min, uwo are optimized."""
    methods: tuple[str, ...] = METHODS
    """bon (best-of-n), ppo."""
    seeds: int = 1
    queries: int = 64
    """Q: held-out queries of the best-of-n pool and of the PPO arms' final evaluation."""
    samples: int = 64
    """M: samples of the initial policy per held-out query (best-of-n up to n = M)."""
    eval_samples: int = 2
    """Samples per held-out query of a PPO arm's final evaluation."""
    kl_coef: float = 0.01
    """The PPO arms' fixed KL coefficient beta."""
    uwo_lambda: float = 1.0
    """uwo's weight of the members' variance."""

    def ns(self) -> list[int]:
        """Best-of-n's n: 1, 2, 4, ... up to M."""
        return [2**i for i in range(self.samples.bit_length()) if 2**i <= self.samples]

    def arms(self) -> list[tuple[str, str]]:
        """(method, proxy) of every arm."""
        return [(m, p) for m in self.methods for p in self.proxies]


def arm_name(method: str, proxy: str, n: int) -> str:
    return f"{method}-{proxy}-{n}"


def check_grid(t: Task, plan: Plan) -> tuple[int, int]:
    """(pool questions, held-out questions) of `plan` on task t, or one line naming what cannot run."""
    cfg = t.cfg
    if "bon" in plan.methods and plan.samples < 2:
        raise UserError(f"--samples {plan.samples}: best-of-n needs at least 2 samples per query")
    if "ppo" in plan.methods and cfg.ppo.num_updates < MIN_UPDATES:
        raise UserError(f"ppo.total_episodes={cfg.ppo.total_episodes}: {cfg.ppo.num_updates} PPO update(s) of "
                        f"{cfg.ppo.batch_size}; a PPO arm's curve needs at least {MIN_UPDATES} to show a peak and a "
                        "fall (or leave ppo out of --methods)")  # fmt: skip
    if cfg.rewards.ensemble_reduce != "mean":
        raise UserError(f"rewards.ensemble_reduce={cfg.rewards.ensemble_reduce}: experiment overoptimization "
                        "optimizes each reduction itself; name them with --proxies (and uwo's lambda with "
                        "--uwo-lambda)")  # fmt: skip
    check_heldout(t, plan.queries, "--queries")
    pool, held = max(plan.labels), heldout_questions(cfg, plan.labels)
    if pool + held > len(t.train_queries):
        raise UserError(f"--labels {pool}: {pool} labeled questions and {held} held-out ones need {pool + held} "
                        f"training queries; task.query_dataset={cfg.task.query_dataset!r} has "
                        f"{len(t.train_queries)}")  # fmt: skip
    return pool, held


def run_overoptimization(cfg: Config, run_dir: Path, plan: Plan, on_start: Callable[[], None] | None = None) -> dict:
    """Every arm of `plan` over plan.seeds seeds, then the curves' summary, the figure and the report. on_start
    runs once every input has been checked, before anything is written."""
    from lmprefs.recipes.overoptimization_report import plot, summarize, write_report

    t = setup_task(cfg, plan.queries)
    pool, held = check_grid(t, plan)
    res = Results(run_dir)
    sizes = res.data.get("pool", {"candidates": pool, "heldout": held})
    if sizes["candidates"] < pool:
        raise UserError(f"--labels {pool}: the label stores of {run_dir} hold {sizes['candidates']} questions; keep "
                        "the experiment's --labels, or start another --run-dir")  # fmt: skip
    if on_start:
        on_start()
    run_dir.mkdir(parents=True, exist_ok=True)
    res.save("pool", sizes)
    if "initial" not in res.data:
        print("[initial] evaluating the initial policy", flush=True)
        e = evaluate_model(t, None, t.heldout_queries[: plan.queries], true_reward_fn(cfg.labels.labeler),
                           plan.eval_samples, cfg.run.seed + 5, "initial policy")  # fmt: skip
        every = torch.tensor(e["scores"], dtype=torch.float64).flatten()
        # the true reward's spread over the initial policy's samples: its unit beside the proxy's (normalized to 1)
        res.save("initial", {k: e[k] for k in ("mean", "stderr", "n_queries", "kl")} | {"std": every.std().item()})
    for s in range(plan.seeds):
        ts = Task(**{**t.__dict__, "cfg": R(cfg, run=R(cfg.run, seed=cfg.run.seed + s))})
        labels = seed_pool(ts, run_dir, s, sizes, res)
        for n in plan.labels:
            rm_dir = reward_models(ts, labels, run_dir, s, n, plan.members, res)
            if "bon" in plan.methods:
                best_of_n_arms(ts, rm_dir, run_dir, s, n, plan, res)
            for method, proxy in plan.arms():
                if method == "ppo":
                    ppo_arm(ts, rm_dir, run_dir, s, n, proxy=proxy, plan=plan, res=res)
    res.save("summary", summarize(res.data, plan))
    fig = plot(run_dir, res.data, plan)
    report = write_report(run_dir, res.data, plan, cfg)
    return {"results": res.data, "figure": fig, "report": report}


def reward_models(t: Task, pool: SeedPool, run_dir: Path, s: int, n: int, members: int, res: Results) -> Path:
    """Seed s's ensemble of `members` on its first n labels (in the pool's seeded order), trained once: its
    directory is published whole (atomic_dir), so a run killed while it trains trains it again, the same."""
    key = seed_key(f"rm-{n}", s)
    rm_dir = run_dir / key
    if key not in res.data:
        print(f"[{key}] an ensemble of {members} reward models on {n} labels", flush=True)
        cfg = R(t.cfg, train_reward=R(t.cfg.train_reward, ensemble=members))
        rm, summary = train_reward_model(Task(**{**t.__dict__, "cfg": cfg}), None, rm_dir,
                                         labels=pool.labels(pool.random_order[:n]))  # fmt: skip
        del rm
        res.save(key, {k: v for k, v in summary.items() if isinstance(v, int | float)})
        crash_point("overoptimization:reward-model")
    return rm_dir


@torch.no_grad()
def pool_samples(t: Task, queries: torch.Tensor, m: int, seed: int, batch_size: int = 64) -> dict:
    """M samples of the initial policy per query as a rollout makes them (truncated): {"responses": [Q * M, T]
    tokens, query-major, "true": [Q, M] their true reward}."""
    task, true_fn = t.cfg.task, true_reward_fn(t.cfg.labels.labeler)
    gen = torch.Generator(device=t.device).manual_seed(seed)
    responses, true = [], []
    for i in range(0, len(queries), max(1, batch_size // m)):
        q = queries[i : i + max(1, batch_size // m)].to(t.device)
        with t.ctx.autocast():
            r, _ = sample(t.model, t.ctx.format(q), task.response_length, task.temperature, len(t.tok), gen,
                          repeats=m, stop_tokens=stop_tokens(task, t.tok), **sampler_options(t.cfg.run))  # fmt: skip
        post = truncate_responses(r, task.truncate_token, task.truncate_after)
        articles = [x for x in decode(t.tok, q) for _ in range(m)]  # a judge may read the query
        true.append(torch.tensor(score_texts(true_fn, response_texts(t.tok, post, task), articles)).view(len(q), m))
        responses.append(post.cpu())
    return {"responses": torch.cat(responses).tolist(), "true": torch.cat(true).tolist()}


@torch.no_grad()
def member_scores(t: Task, rm, queries: torch.Tensor, responses: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """[K, Q, M] each member's normalized score of the M responses [Q * M, T] to each of queries [Q], with the task's
    penalty, as a rollout scores them."""
    m = len(responses) // len(queries)
    out = []
    for i in range(0, len(queries), max(1, batch_size // m)):
        q = queries[i : i + max(1, batch_size // m)].to(t.device)
        post = responses[i * m : (i + len(q)) * m].to(t.device)
        with t.ctx.autocast():
            k_scores = rm.member_scores(t.ctx.format(q), post, repeats=m).float()  # [K, len(q) * m]
        out.append(apply_penalty(k_scores, post, t.cfg.task).cpu().view(-1, len(q), m))
    return torch.cat(out, 1)


def proxy_scores(members: torch.Tensor, proxy: str, uwo_lambda: float) -> torch.Tensor:
    """[K, Q, M] members' scores -> [Q, M] the proxy's: member 0 alone (single) or their reduction."""
    if proxy == "single":
        return members[0]
    k, q, m = members.shape
    return ensemble_reduce(members.reshape(k, q * m), proxy, uwo_lambda).view(q, m)


def bon_curve(true: torch.Tensor, proxy: torch.Tensor, ns: list[int]) -> list[dict]:
    """Best-of-n of every n in ns from true and proxy [Q, M]: the proxy ranks each query's M samples; the expected
    true and proxy reward of the best of a uniformly random n-subset (bon_weights over that ranking), at the analytic
    KL."""
    order = proxy.double().argsort(dim=1, stable=True)  # [Q, M] ascending by proxy
    t_sorted, p_sorted = true.double().gather(1, order), proxy.double().gather(1, order)
    out = []
    for n in ns:
        w = bon_weights(true.shape[1], n)  # [M]
        out.append({"n": n, "kl": bon_kl(n), "true": (t_sorted * w).sum(1).mean().item(),
                    "proxy": (p_sorted * w).sum(1).mean().item()})  # fmt: skip
    return out


def seed_samples(t: Task, run_dir: Path, s: int, plan: Plan) -> dict:
    """Seed s's pool of the initial policy's samples on the held-out queries and their true reward, drawn once
    (samples[-seedS].json) for every label count's proxies."""
    path = run_dir / f"{seed_key('samples', s)}.json"
    if not path.is_file():
        print(f"[{seed_key('samples', s)}] sampling {plan.samples} responses of the initial policy for each of "
              f"{plan.queries} held-out queries", flush=True)  # fmt: skip
        atomic_write_text(path, json.dumps(pool_samples(t, t.heldout_queries[: plan.queries], plan.samples,
                                                        t.cfg.run.seed + 7)))  # fmt: skip
        crash_point("overoptimization:samples")
    return json.loads(path.read_text())


def best_of_n_arms(t: Task, rm_dir: Path, run_dir: Path, s: int, n: int, plan: Plan, res: Results) -> None:
    """The seed's pool scored by count n's ensemble (kept in pool-N.json), and every best-of-n arm's curve from it."""
    names = [seed_key(arm_name("bon", p, n), s) for p in plan.proxies]
    if all(k in res.data for k in names):
        return
    pool = seed_samples(t, run_dir, s, plan)
    path = run_dir / f"{seed_key(f'pool-{n}', s)}.json"  # beside the ensemble: its directory is a manifest's
    if not path.is_file():
        print(f"[{seed_key(f'bon-{n}', s)}] scoring the pool with {plan.members} members", flush=True)
        rm = load_reward(rm_dir, t.device).eval().requires_grad_(False)
        scores = member_scores(t, rm, t.heldout_queries[: plan.queries], torch.tensor(pool["responses"]))
        atomic_write_text(path, json.dumps(scores.tolist()))
        crash_point("overoptimization:pool")
    true, members = torch.tensor(pool["true"]), torch.tensor(json.loads(path.read_text()))
    for proxy, key in zip(plan.proxies, names, strict=True):
        curve = bon_curve(true, proxy_scores(members, proxy, plan.uwo_lambda), plan.ns())
        res.save(key, {"method": "bon", "proxy": proxy, "labels": n, "seed": t.cfg.run.seed, "curve": curve})


def ppo_config(cfg: Config, rm_dir: Path, proxy: str, plan: Plan) -> Config:
    """A PPO arm's config: the proxy as its reward, a fixed small beta, no andon cord on the true reward (the
    experiment wants to see it fall)."""
    rm = rm_dir / member_name(0) if proxy == "single" else rm_dir
    rewards = R(cfg.rewards, trained_model=str(rm), kl_coef=plan.kl_coef, kl_target=None,
                ensemble_reduce="mean" if proxy == "single" else proxy)  # fmt: skip
    if proxy == "uwo":
        rewards = R(rewards, uwo_lambda=plan.uwo_lambda)
    return R(cfg, rewards=rewards, ppo=R(cfg.ppo, overoptimization_stop=None))


def ppo_curve(rows: list[dict], chunks: int = CHUNKS) -> list[dict]:
    """A PPO run's rollouts per update -> `chunks` points: each the mean KL, proxy (objective/score) and true
    reward over its window of consecutive updates."""
    rows = [r for r in rows if "objective/true_reward" in r]
    chunks = min(chunks, len(rows))
    out = []
    for c in range(chunks):
        part = rows[c * len(rows) // chunks : (c + 1) * len(rows) // chunks]
        if part:
            out.append({"update": part[-1]["step"], "kl": sum(r["objective/kl"] for r in part) / len(part),
                        "true": sum(r["objective/true_reward"] for r in part) / len(part),
                        "proxy": sum(r["objective/score"] for r in part) / len(part)})  # fmt: skip
    return out


def ppo_arm(t: Task, rm_dir: Path, run_dir: Path, s: int, n: int, *, proxy: str, plan: Plan, res: Results) -> None:
    """One PPO arm against a proxy of count n's ensemble (resumed from its checkpoint), its curve and held-out
    end point."""
    key = seed_key(arm_name("ppo", proxy, n), s)
    if key in res.data:
        print(f"[{key}] done", flush=True)
        return
    cfg = ppo_config(t.cfg, rm_dir, proxy, plan)
    ev = train_arm(cfg, run_dir / key, key, f"PPO against {proxy} of {n} labels, beta {plan.kl_coef:g}",
                   plan.queries, plan.eval_samples, cfg.labels.labeler)  # fmt: skip
    curve = ppo_curve(read_metrics(run_dir / key / "metrics.jsonl", "policy"))
    res.save(key, {"method": "ppo", "proxy": proxy, "labels": n, "seed": cfg.run.seed, "curve": curve,
                   "heldout": ev})  # fmt: skip
