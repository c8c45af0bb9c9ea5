"""What `experiment label-efficiency` makes of its arms: the summaries across seeds, the label-efficiency ratio k
with its bootstrap interval and verdict (labels.efficiency), label_efficiency.png and report.md."""

from __future__ import annotations

from pathlib import Path

import torch

from lmprefs.config import Config, label_type_shape
from lmprefs.io.atomic import atomic_write_text
from lmprefs.labels.efficiency import bootstrap_rows, efficiency_ratio, percentile_interval
from lmprefs.recipes.experiment import ci95, mean_se, seed_key, summarize_seeds

BOOTSTRAP_DRAWS = 2000
SIDES = {-1: "<=", 0: "=", 1: ">="}


def summarize(data: dict, plan, cfg: Config) -> dict:
    """{"arms": per arm and budget the held-out true reward and KL across seeds (summarize_seeds) and the reward
    model's held-out accuracy (mean, s.e., 95% half-width), "k": per acquisition and budget above one round the
    ratio and its interval, "verdict": per acquisition its line}."""
    names = [f"{acq}-{b}" for acq in plan.arms() for b in plan.budgets]
    arms = summarize_seeds(data, names, plan.seeds)
    for name, d in arms.items():
        accs = [data[seed_key(name, s)]["accuracy"] for s in range(plan.seeds) if seed_key(name, s) in data]
        m, se = mean_se(accs)
        d |= {"accuracy": m, "accuracy_stderr": se, "accuracy_ci95": ci95(se, len(accs)) if len(accs) > 1 else None}
    out: dict = {"arms": arms, "k": {}, "verdict": {}}
    budgets = list(plan.budgets)
    directed = [j for j, b in enumerate(budgets) if b > cfg.labels.select_round]
    random = true_rewards(data, "random", budgets, plan.seeds)
    for acq in plan.acquisitions:
        mine = true_rewards(data, acq, budgets, plan.seeds)
        if random is None or mine is None:
            continue
        rows = efficiency_rows(budgets, random, mine, directed, cfg.run.seed)
        out["k"][acq] = rows
        out["verdict"][acq] = verdict(acq, rows, plan.seeds)
    return out


def true_rewards(data: dict, acq: str, budgets: list[int], seeds: int) -> torch.Tensor | None:
    """[seeds, budgets] held-out true rewards of an acquisition's arms; None until every one has finished."""
    keys = [[seed_key(f"{acq}-{b}", s) for b in budgets] for s in range(seeds)]
    if any(k not in data for row in keys for k in row):
        return None
    return torch.tensor([[data[k]["mean"] for k in row] for row in keys], dtype=torch.float64)


def efficiency_rows(budgets: list[int], random: torch.Tensor, mine: torch.Tensor, cols: list[int],
                    seed: int) -> list[dict]:  # fmt: skip
    """k at each budget of `cols` with its 95% bootstrap interval over seeds; an end on a bound is that bound."""
    b = torch.tensor(budgets, dtype=torch.float64)
    k, side = efficiency_ratio(b, random, mine)
    kb, sb = efficiency_ratio(b, random, mine, bootstrap_rows(len(random), BOOTSTRAP_DRAWS, seed))
    out = []
    for j in cols:
        lo, hi = percentile_interval(kb[:, j], sb[:, j])
        low = ((budgets[0] / budgets[j], "<=") if lo == 0 else (budgets[-1] / budgets[j], ">=") if lo == float("inf")
               else (lo, "="))  # fmt: skip
        high = ((budgets[-1] / budgets[j], ">=") if hi == float("inf") else (budgets[0] / budgets[j], "<=") if hi == 0
                else (hi, "="))  # fmt: skip
        out.append({"labels": budgets[j], "k": float(k[0, j]), "bound": SIDES[int(side[0, j])], "low": low[0],
                    "low_bound": low[1], "high": high[0], "high_bound": high[1],
                    "directed": float(mine[:, j].mean()), "random_same": float(random[:, j].mean())})  # fmt: skip
    return out


def fmt_k(value: float, bound: str) -> str:
    return f"{value:.2f}" if bound == "=" else f"{bound} {value:.2f}"


def outcome(row: dict, seeds: int) -> str:
    """helped (the interval lies above 1), worse (below 1), or did not beat random (it includes 1); with one seed
    there is no interval: decided by k alone and said so."""
    if seeds < 2:
        return "one seed, no interval"
    above = row["low_bound"] == ">=" or (row["low_bound"] == "=" and row["low"] > 1)
    below = row["high"] < 1 and row["high_bound"] != ">="
    return "helped" if above else "did worse than random" if below else "did not beat random"


def describe(row: dict, seeds: int) -> str:
    interval = (f" (95% bootstrap interval {fmt_k(row['low'], row['low_bound'])} to "
                f"{fmt_k(row['high'], row['high_bound'])} over {seeds} seeds)" if seeds > 1 else "")  # fmt: skip
    return f"k = {fmt_k(row['k'], row['bound'])} at {row['labels']} labels{interval}"


def verdict(acq: str, rows: list[dict], seeds: int) -> str:
    """One line: whether `acq` queries helped at the largest budget (where the most questions were chosen), k with
    its interval there, and k at the other budgets."""
    if not rows:
        return f"{acq}: no budget above one round, no k"
    last = rows[-1]
    what = outcome(last, seeds)
    heads = {"helped": f"{acq} queries helped: random queries need {fmt_k(last['k'], last['bound'])}x the labels "
             "for the same true reward", "did not beat random": f"{acq} queries did not beat random",
             "did worse than random": f"{acq} queries did worse than random"}  # fmt: skip
    head = heads.get(what, f"{acq} queries: one seed, no interval (run --seeds 2 or more for a verdict)")
    others = "; ".join(f"{describe(r, seeds)}: {outcome(r, seeds)}" for r in rows[:-1])
    return f"{head}; {describe(last, seeds)}" + (f"; {others}" if others else "")


def plot(run_dir: Path, data: dict, plan) -> Path:
    """label_efficiency.png: left the reward models' held-out best-of-N accuracy, right the PPO policies' held-out
    true reward, each against the labels (log scale), mean and 95% interval across seeds per acquisition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = data.get("summary", {}).get("arms", {})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, acq in enumerate(plan.arms()):
        pts = [arms[f"{acq}-{b}"] for b in plan.budgets if f"{acq}-{b}" in arms]
        xs = [d["labels"] * 1.03**i for d in pts]  # side by side: the intervals of equal budgets apart
        for ax, key, half in ((axes[0], "accuracy", "accuracy_ci95"), (axes[1], "mean", "ci95")):
            err = [d[half] if d.get(half) is not None else 0.0 for d in pts]
            ax.errorbar(xs, [d[key] for d in pts], yerr=err, fmt="-o", capsize=3, label=acq)
    if "initial" in data:
        axes[1].axhline(data["initial"]["mean"], color="gray", ls="--", lw=0.8, label="initial policy")
    axes[0].set_ylim(0, 1)
    axes[0].set_ylabel("reward model: held-out best-of-N accuracy")
    axes[1].set_ylabel("PPO policy: held-out true reward")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xticks(list(plan.budgets), [str(b) for b in plan.budgets])
        ax.minorticks_off()
        ax.set_xlabel("labels")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"random vs directed queries from one candidate pool per seed ({plan.seeds} seed"
                 f"{'s' if plan.seeds > 1 else ''}; 95% intervals across seeds)")  # fmt: skip
    fig.tight_layout()
    path = run_dir / "label_efficiency.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(run_dir: Path, data: dict, plan, cfg: Config) -> Path:
    """report.md: the verdict lines, the table of arms, k per budget, and the figure."""
    summary = data["summary"]
    n = label_type_shape(cfg.labels.type)[1]
    pool = data["pool"]
    lines = ["# lmprefs experiment label-efficiency", ""]
    lines += [f"**Verdict:** {line}" for line in summary["verdict"].values()] or ["No verdict: arms unfinished."]
    lines += ["", f"Per seed one pool of {pool['candidates']} candidate best-of-{n} questions and {pool['heldout']} "
              f"held-out questions, answered by {cfg.labels.labeler}; directed rounds of {cfg.labels.select_round}. "
              f"Reward models: one per arm (single model), accuracy on the seed's held-out questions (chance "
              f"{1 / n:.2f}). Policies: {cfg.ppo.num_updates} PPO updates of {cfg.ppo.batch_size}, evaluated "
              f"on {plan.n_eval} held-out queries x {plan.eval_samples} samples. Mean and 95% interval across "
              "seeds.",
              "", "| queries | labels | seeds | held-out accuracy | true reward | KL (nats) |",
              "|---|---|---|---|---|---|"]
    for name, d in summary["arms"].items():
        acc = f"{d['accuracy']:.3f}" + (f" +/- {d['accuracy_ci95']:.3f}" if d["accuracy_ci95"] is not None else "")
        lines.append(f"| {name.rsplit('-', 1)[0]} | {d['labels']} | {d['seeds']} | {acc} | {d['mean']:+.4f} +/- "
                     f"{d['ci95']:.4f} | {d['kl']:.2f} |")  # fmt: skip
    if "initial" in data:
        lines.append(f"| initial policy | 0 | - | - | {data['initial']['mean']:+.4f} | 0 |")
    for acq, rows in summary["k"].items():
        lines += ["", f"k of {acq} (labels random queries need for its true reward, over its labels; log-linear "
                  "on random's mean curve; a bound where its reward lies outside random's range):", ""]
        lines += [f"- {describe(r, plan.seeds)}: {outcome(r, plan.seeds)}" for r in rows]
    lines += ["", "![accuracy and true reward against labels](label_efficiency.png)", ""]
    path = run_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path
