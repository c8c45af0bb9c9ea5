"""`experiment compare`'s outputs: the figure (`plot_compare`, compare.png), the table of every arm and seed
(`table`), the line naming arms that did not move the policy (`unmoved`) and report.md (`write_report`)."""

from __future__ import annotations

from pathlib import Path

from lmprefs.config import Config
from lmprefs.io.atomic import atomic_write_text
from lmprefs.recipes.compare_arms import BETA0_KINDS, Plan, arm_list
from lmprefs.recipes.compare_lengths import is_beta0
from lmprefs.recipes.experiment import seed_key
from lmprefs.recipes.kl_frontier import plot_frontier, save_kl_figure
from lmprefs.recipes.matched import matched_table, verdicts

COLORS = {"ppo": "tab:blue", "ppo-separate": "tab:cyan", "rloo": "tab:green", "dpo-pairwise": "tab:red",
          "dpo-listwise": "tab:orange", "best-of-n": "tab:purple", "grpo": "tab:olive", "grpo-kl-reward": "tab:brown",
          "dr-grpo": "tab:pink", "reinforce-pp-baseline": "tab:gray", "dpo-online": "darkred"}  # fmt: skip


def plot_compare(run_dir: Path, data: dict, plan: Plan) -> Path:
    """compare.png: every arm's held-out true reward against its KL (mean +/- s.e.; across seeds with several),
    one colour per kind, beside the sampled optimal frontier and the initial policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5))
    plot_frontier(ax, data)
    summary = data.get("summary", {})
    for kind in plan.arms:
        pts = sorted((summary[a[0]] for a in arm_list(plan) if a[1] == kind and a[0] in summary),
                     key=lambda d: d["kl"])  # fmt: skip
        if not pts:
            continue
        what = "analytic KL" if kind == "best-of-n" else "measured KL, along one run" if is_beta0(kind) else \
            "measured KL"
        # best-of-n's points and a beta-0 run's are joined: one curve each; the other kinds' settings are points
        fmt = "-o" if kind == "best-of-n" else "--s" if is_beta0(kind) else "o"
        ax.errorbar([d["kl"] for d in pts], [d["mean"] for d in pts], xerr=[d["kl_stderr"] for d in pts],
                    yerr=[d["stderr"] for d in pts], fmt=fmt, capsize=3, lw=0.8,
                    color=COLORS[BETA0_KINDS.get(kind, kind)], label=f"{kind} ({what})")  # fmt: skip
    for kl in data.get("matched_kl", {}).get("kls", []):  # where the kinds are compared
        ax.axvline(kl, color="0.6", ls=":", lw=0.8)
    return save_kl_figure(fig, ax, f"one label store, one reward model: {plan.seeds} seed"
                          f"{'s' if plan.seeds > 1 else ''}, {plan.n_eval} held-out queries", run_dir / "compare.png")


def table(data: dict, plan: Plan) -> list[str]:
    """The markdown table of every finished arm and seed (and the initial policy)."""
    init = data["initial"]
    lines = ["| arm | setting | seed | true reward | KL (nats) | wall time (s) | episodes/s |",
             "|---|---|---|---|---|---|---|",
             f"| initial | - | - | {init['mean']:+.4f} +/- {init['stderr']:.4f} | 0 | - | - |"]  # fmt: skip
    for s in range(plan.seeds):
        for name, kind, setting, _ in arm_list(plan):
            d = data.get(seed_key(name, s))
            if d is None:
                continue
            kl = f"{d['kl']:.2f} (analytic)" if d.get("kl_analytic") else f"{d['kl']:.2f} +/- {d['kl_stderr']:.2f}"
            lines.append(f"| {kind} | {setting} | {d['seed']} | {d['mean']:+.4f} +/- {d['stderr']:.4f} | {kl} | "
                         f"{d['seconds']:.1f} | {d['episodes_per_s']:.1f} |")  # fmt: skip
    return lines


# an arm whose held-out KL from the initial policy stays under this many nats did not move it: its figures are the
# initial policy's, whatever its setting promised (DPO at the paper's lr 1e-6 on a small model moves ~1e-5 nats)
STILL_KL = 0.01


def unmoved(data: dict, plan: Plan, cfg: Config | None = None) -> str | None:
    """One line naming the finished arms that did not move the policy (KL under STILL_KL nats) and what moves one,
    or None when every arm moved."""
    still = [seed_key(name, s) for s in range(plan.seeds) for name, kind, _, _ in arm_list(plan)
             if kind != "best-of-n" and seed_key(name, s) in data and data[seed_key(name, s)]["kl"] < STILL_KL]
    if not still:
        return None
    dpo = f" (now {cfg.dpo.lr:g})" if cfg is not None else ""
    return (f"did not move the policy (KL from it under {STILL_KL:g} nats, so their figures are the initial "
            f"policy's): {', '.join(still)}; a larger --dpo.lr{dpo} or --dpo.epochs moves DPO, a larger --ppo.lr or "
            "--ppo.total-episodes PPO and RLOO")


def write_report(run_dir: Path, data: dict, plan: Plan, cfg: Config | None = None) -> Path:
    fr = data["frontier"]
    rm = data.get("reward_model", {})
    acc = f", held-out accuracy {rm['heldout/accuracy']:.3f}" if "heldout/accuracy" in rm else ""
    lines = ["# lmprefs experiment compare", "",
             f"Label store `{data['labels']['store']}` ({data['labels']['num_train']} training labels); reward model "
             f"trained once from it{acc}. Every arm evaluated on the same {plan.n_eval} held-out queries x "
             f"{plan.eval_samples} samples: true reward mean +/- s.e. over queries, KL(pi, rho) +/- s.e. over its own "
             "samples (best-of-n: the analytic log n - (n-1)/n). Wall time: the arm's training and evaluation in the "
             "run that finished it; episodes: rollouts (the PPO family), responses sampled and judged (online "
             "DPO), labels x epochs (DPO), samples drawn (best-of-n).", "", *table(data, plan), "",
             *([f"**Arms that {still}.**", ""] if (still := unmoved(data, plan, cfg)) else []),
             f"Optimal frontier from {fr['queries']} queries x {fr['samples_per_query']} samples of rho (trusted up "
             f"to mean ESS {fr['min_ess']:g}).", "", "![KL vs true reward](compare.png)", ""]  # fmt: skip
    m = data.get("matched_kl", {"kls": [], "note": "not computed"})
    where = "where the ranges of two or more kinds meet, each compared among the kinds that reached it in every seed" \
        if m.get("partial") else "every kind reached in every seed"
    lines += ["## At matched KL", "",
              "Each kind's true reward interpolated on its own curve over its KL settings, per seed, at KL values "
              f"{where} ({m.get('ranges', '')}); mean across seeds +/- the 95% interval's "
              "half-width (Student's t), seeds in brackets; the frontier at that KL where trusted (dotted lines in "
              "the figure).", "", *matched_table(m), "", *verdicts(m, plan.seeds), ""]  # fmt: skip
    path = run_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path
