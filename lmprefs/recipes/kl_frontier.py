"""`lmprefs experiment kl-frontier` (the paper's Figure 3): KL(pi, rho) against true reward for PPO runs with direct
access to the true reward at several KL settings, beside the optimal frontier pi* ~ rho exp(r/beta) estimated from
samples of rho (lmprefs.training.frontier), the best-of-n curve from the same samples, and Gao et al.'s functional
forms fitted to the points below a KL cut and predicting those beyond it (lmprefs.training.scaling_laws); optionally
with the arms of a mock-sentiment experiment as further points. It resumes like the other experiments
(lmprefs.recipes.experiment): the frontier's samples are drawn once, each arm resumes from its checkpoint.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lmprefs.config import Config
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.pipeline.evaluation import evaluate_policy
from lmprefs.pipeline.task import check_heldout, setup_task
from lmprefs.recipes.experiment import (
    R,
    Results,
    seed_key,
    summarize_seeds,
    train_arm,
    true_reward_fn,
)
from lmprefs.training.frontier import frontier
from lmprefs.training.scaling_laws import best_of_n, bon_kl, fit_gao


@dataclass(frozen=True)
class FrontierPlan:
    """What `experiment kl-frontier` runs (its flags)."""

    queries: int
    """Held-out queries for the frontier and the PPO arms."""
    samples: int
    """Samples of the initial policy per query for the frontier and the best-of-n curve."""
    betas: list[float]
    """The frontier's beta grid."""
    kl_targets: list[float]
    """PPO arms with the adaptive KL controller at these targets."""
    kl_coefs: list[float]
    """PPO arms with a fixed KL coefficient each."""
    eval_samples: int
    """Samples per held-out query for each PPO arm's evaluation."""
    true_reward: str
    min_ess: float = 10.0
    """Frontier points whose mean effective sample size is smaller are marked as not trusted."""
    figure2: Path | None = None
    """A mock-sentiment run directory whose arms are added as points."""
    fit_cut: float | None = None
    """Gao et al.'s forms are fitted to the points with KL up to this and predict those beyond (None: the median)."""
    seeds: int = 1
    """Runs of every PPO arm, each with its own run.seed."""


def run_kl_frontier(cfg: Config, run_dir: Path, plan: FrontierPlan,
                    on_start: Callable[[], None] | None = None) -> dict:  # fmt: skip
    """Figure 3: the optimal frontier from plan.samples samples of the initial policy on each of plan.queries
    held-out queries, the best-of-n curve from the same samples, and PPO arms with direct access to the true reward
    (one per KL target, one per fixed KL coefficient, each over plan.seeds seeds), evaluated on the same queries; Gao
    et al.'s forms fitted to the best-of-n points and to every PPO run's point with KL up to plan.fit_cut (None: each
    set's median KL), predicting the rest."""
    queries, samples, fit_cut, true_reward = plan.queries, plan.samples, plan.fit_cut, plan.true_reward
    if fit_cut is not None and fit_cut >= bon_kl(samples):
        raise UserError(f"--fit-cut {fit_cut:g}: beyond every best-of-n point (the largest, best of {samples}, is at "
                        f"KL {bon_kl(samples):.2f} nats)")  # fmt: skip
    true_fn = true_reward_fn(true_reward)
    extra = _figure2_points(plan.figure2) if plan.figure2 is not None else {}
    t = setup_task(cfg, queries)
    check_heldout(t, queries, "--queries")
    if on_start:
        on_start()
    run_dir.mkdir(parents=True, exist_ok=True)
    res = Results(run_dir)
    heldout = t.heldout_queries[:queries]
    scores = frontier_scores(t, run_dir, heldout, true_fn, samples, cfg.run.seed + 7, "--queries")
    save_frontier(res, scores, plan.betas, plan.min_ess)
    ns = [2**i for i in range(int(math.log2(samples)) + 1)]
    res.save("best_of_n", [best_of_n(scores, n) for n in ns])
    del t
    arms = [(f"kl-target-{x:g}", R(cfg, rewards=R(cfg.rewards, kl_target=x)), f"KL target {x:g}")
            for x in plan.kl_targets]  # fmt: skip
    arms += [(f"kl-coef-{x:g}", R(cfg, rewards=R(cfg.rewards, kl_coef=x, kl_target=None)), f"fixed beta {x:g}")
             for x in plan.kl_coefs]  # fmt: skip
    for s in range(plan.seeds):
        for name, arm_cfg, what in arms:
            key = seed_key(name, s)
            if key in res.data:
                print(f"[{key}] done: {res.data[key]['mean']:+.4f} at KL {res.data[key]['kl']:.2f}", flush=True)
                continue
            seed = cfg.run.seed + s
            ev = train_arm(R(arm_cfg, run=R(arm_cfg.run, seed=seed)), run_dir / key, key, f"true reward, {what}",
                           queries, plan.eval_samples, true_reward, reward=true_reward)  # fmt: skip
            res.save(key, ev | {"reward": true_reward, "kl_target": arm_cfg.rewards.kl_target,
                                "kl_coef": arm_cfg.rewards.kl_coef, "seed": seed, "labels": None})  # fmt: skip
    names = [a[0] for a in arms]
    res.save("summary", summarize_seeds(res.data, names, plan.seeds))
    if extra:
        res.save("figure2", extra)
    runs = [seed_key(n, s) for s in range(plan.seeds) for n in names]
    res.save("gao_fits", gao_fits(res.data, runs, fit_cut))
    fig = plot_figure3(run_dir, res.data, names)
    return {"results": res.data, "figure": fig}


def frontier_scores(t, run_dir: Path, heldout, true_fn, samples: int, seed: int, flag: str):
    """[Q, M] float64: the true rewards of M samples of the initial policy on each held-out query, drawn once and
    kept in run_dir/frontier_scores.json; a run directory holding another Q x M is refused."""
    import torch

    queries = len(heldout)
    scores_path = run_dir / "frontier_scores.json"  # [queries][samples] true rewards of the initial policy's samples
    if not scores_path.exists():
        print(f"[frontier] sampling {samples} responses of the initial policy for each of {queries} held-out queries",
              flush=True)  # fmt: skip
        e = evaluate_policy(t, heldout, true_fn, None, samples, seed, desc="frontier: sampling rho")
        atomic_write_text(scores_path, json.dumps(e["scores"]))
    scores = torch.tensor(json.loads(scores_path.read_text()), dtype=torch.float64)  # [Q, M]
    if tuple(scores.shape) != (queries, samples):
        raise UserError(f"{run_dir} holds the frontier of {scores.shape[0]} queries x {scores.shape[1]} samples, not "
                        f"{flag} {queries} --samples {samples}; pass those or choose another --run-dir")
    return scores


def save_frontier(res: Results, scores, betas: list[float], min_ess: float) -> None:
    """results.json's initial (the true reward of rho's samples, mean +/- s.e. over queries) and frontier."""
    queries, samples = scores.shape
    per_query = scores.mean(1)
    res.save("initial", {"mean": per_query.mean().item(), "stderr": (per_query.std() / math.sqrt(queries)).item(),
                         "kl": 0.0, "kl_stderr": 0.0, "n_queries": queries, "samples_per_query": samples})
    res.save("frontier", {"samples_per_query": samples, "queries": queries, "min_ess": min_ess,
                          "points": frontier(scores, betas, min_ess)})  # fmt: skip


def gao_fits(data: dict, arms: list[str], cut: float | None) -> dict:
    """Gao et al.'s best-of-n form fitted to the best-of-n points and their RL form to the held-out points of the
    PPO runs `arms` (every seed's own: true reward gained over the initial policy against KL), each on its points
    with KL <= cut (None: that set's median KL); a set too small to fit records why."""
    base = data["initial"]["mean"]
    sets = {"bon": [(p["kl"], p["reward"] - base) for p in data["best_of_n"]],
            "rl": [(data[a]["kl"], data[a]["mean"] - base) for a in arms if a in data]}  # fmt: skip
    out = {}
    for form, pts in sets.items():
        kls = sorted(k for k, _ in pts)
        c = cut if cut is not None else (kls[(len(kls) - 1) // 2] if kls else 0.0)
        try:
            out[form] = fit_gao(form, [k for k, _ in pts], [g for _, g in pts], c) | {"points": pts}
        except ValueError as e:
            out[form] = {"form": form, "cut": c, "error": str(e), "points": pts}
    return out


def _figure2_points(path: Path) -> dict:
    p = Path(path) / "results.json"
    if not p.is_file():
        raise UserError(f"--figure2 {path}: no results.json of an `experiment mock-sentiment` run there")
    data = json.loads(p.read_text())
    names = sorted({k.split("-seed")[0] for k in data if k.startswith(("rm-", "direct")) and "kl" in data[k]})
    if not names:
        raise UserError(f"--figure2 {path}: none of its arms has a held-out KL (finish the run, or rerun it with "
                        "this version of lmprefs)")  # fmt: skip
    seeds = 1 + max((int(k.split("-seed")[1]) for k in data if "-seed" in k), default=0)
    return summarize_seeds(data, names, seeds)


def _plot_yardsticks(ax, data: dict) -> None:
    """Best-of-n (analytic KL) and Gao et al.'s fitted forms, solid up to their fit's cut, dotted beyond it."""
    import numpy as np

    bon = data.get("best_of_n", [])
    if bon:
        ax.errorbar([p["kl"] for p in bon], [p["reward"] for p in bon], yerr=[p["stderr"] for p in bon], fmt="-x",
                    color="tab:purple", capsize=2, lw=1, label="best-of-n, n = 1, 2, 4, ... (KL: log n - (n-1)/n)")
    base = data["initial"]["mean"]
    for form, fit in data.get("gao_fits", {}).items():
        if "alpha" not in fit:
            continue
        top = max([k for k, _ in fit["points"]] + [fit["cut"]])
        color = "tab:purple" if form == "bon" else "tab:red"
        for lo, hi, ls in ((0.0, fit["cut"], "-"), (fit["cut"], top, ":")):
            kl = np.linspace(lo, hi, 50)
            d = np.sqrt(kl)
            gain = d * (fit["alpha"] - fit["beta"] * (d if form == "bon" else np.log(np.maximum(d, 1e-300))))
            ax.plot(kl, base + gain, ls=ls, color=color, alpha=0.6, lw=1,
                    label=f"Gao {form} form fit to KL <= {fit['cut']:.2f}" if ls == "-" else None)  # fmt: skip


def plot_figure3(run_dir: Path, data: dict, arms: list[str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5))
    plot_frontier(ax, data)
    for name in arms:
        if name in data["summary"]:
            d = data["summary"][name]
            how = f"{d['seeds']} seeds: s.e. across them" if d["seeds"] > 1 else "1 seed: s.e. over queries"
            ax.errorbar(d["kl"], d["mean"], xerr=d["kl_stderr"], yerr=d["stderr"], fmt="o", capsize=3,
                        label=f"PPO, true reward: {name} ({how})")  # fmt: skip
    for name, d in data.get("figure2", {}).items():
        ax.errorbar(d["kl"], d["mean"], xerr=d["kl_stderr"], yerr=d["stderr"], fmt="^", capsize=3,
                    label=f"Figure 2 arm {name} ({d['seeds']} seeds, {d['n_queries']} queries)")  # fmt: skip
    _plot_yardsticks(ax, data)
    return save_kl_figure(fig, ax, "KL vs true reward (dashed: log M, the most KL M samples can show)",
                          run_dir / "figure3.png")  # fmt: skip


def save_kl_figure(fig, ax, title: str, path: Path) -> Path:
    """A figure on Figure 3's axes (KL(pi, rho) against the held-out true reward) titled, its legend beside the plot
    so that it hides no point, saved as a PNG at `path` and closed."""
    import matplotlib.pyplot as plt

    ax.set_xlabel("KL(pi, rho), nats")
    ax.set_ylabel("true reward on held-out queries")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_frontier(ax, data: dict) -> None:
    """The sampled optimal frontier (dotted where its ESS is too small to trust it), the log M line beyond which M
    samples cannot show KL, and the initial policy."""
    fr = data["frontier"]
    pts = fr["points"]
    good = [p for p in pts if p["trusted"]]
    ax.plot([p["kl"] for p in pts], [p["reward"] for p in pts], ls=":", color="k", alpha=0.5,
            label=f"optimal pi* (ESS < {fr['min_ess']:g}: not trusted)")  # fmt: skip
    ax.plot([p["kl"] for p in good], [p["reward"] for p in good], "-", color="k",
            label=f"optimal pi* ({fr['queries']} queries x {fr['samples_per_query']} samples)")  # fmt: skip
    ax.axvline(math.log(fr["samples_per_query"]), color="grey", lw=0.8, ls="--")
    ax.errorbar([0], [data["initial"]["mean"]], yerr=[data["initial"]["stderr"]], fmt="s", color="grey",
                capsize=3, label="initial policy")  # fmt: skip
