"""What `experiment overoptimization` makes of its arms' curves: per arm the seed-mean curve of true and proxy
reward against KL, where the true reward peaks and how far it falls after (with its 95% interval across seeds), where
proxy and true reward part, Gao et al.'s form fitted; per method and label count whether the conservative proxies
held the true reward up against mean and single; the verdict; overoptimization.png and report.md."""

from __future__ import annotations

import math
from pathlib import Path

from lmprefs.config import Config
from lmprefs.io.atomic import atomic_write_text
from lmprefs.recipes.experiment import ci95, mean_se, seed_key
from lmprefs.training.scaling_laws import fit_gao

PART = 0.5  # proxy and true reward part where the true reward's gain falls below this share of the proxy's
METHOD_NAMES = {"bon": "best-of-n", "ppo": "PPO"}
CONSERVATIVE = ("min", "uwo")


def interval(xs: list[float]) -> tuple[float, float | None]:
    """(mean, 95% half-width across seeds: Student's t; None with one seed)."""
    m, se = mean_se(xs)
    return m, (ci95(se, len(xs)) if len(xs) > 1 else None)


def seed_curves(data: dict, name: str, seeds: int) -> list[list[dict]]:
    """Each finished seed's curve of arm `name`, cut to the shortest (their points correspond by index)."""
    curves = [data[seed_key(name, s)]["curve"] for s in range(seeds) if seed_key(name, s) in data]
    short = min((len(c) for c in curves), default=0)
    return [c[:short] for c in curves if short]


def gao_fit(method: str, kl: list[float], gain: list[float]) -> dict:
    """Gao et al.'s form of the method (best-of-n: d (alpha - beta d); RL: d (alpha - beta log d), d = sqrt KL)
    fitted to the points up to the median KL, predicting those beyond; with the KL where the fitted form peaks (None
    where it has no positive peak)."""
    form = "bon" if method == "bon" else "rl"
    cut = sorted(kl)[(len(kl) - 1) // 2]
    try:
        fit = fit_gao(form, kl, gain, cut)
    except ValueError as e:
        return {"form": form, "error": str(e)}
    a, b = fit["alpha"], fit["beta"]
    # bon: d* = alpha / (2 beta); rl: alpha - beta (log d + 1) = 0 at d* = exp(alpha / beta - 1); neither peaks
    # with beta <= 0, and bon's gain is never positive with alpha <= 0
    d = (None if b <= 0 or (form == "bon" and a <= 0) else a / (2 * b) if form == "bon"
         else math.exp(min(a / b - 1, 50)))  # fmt: skip
    return {k: fit[k] for k in ("form", "alpha", "beta", "cut", "fitted", "predicted", "rmse_beyond")} | {
        "peak_kl": d * d if d is not None else None}


def summarize_arm(curves: list[list[dict]], method: str, base: float, true_std: float) -> dict:
    """The seed-mean curve (KL, sqrt KL, true and proxy reward, the true reward's 95% half-width), the peak of the
    true reward and its fall to the last point (per-seed differences at those two points), where proxy and true
    reward part, and the Gao fit of the true reward's gain over `base`."""
    pts = len(curves[0])
    mean: list[dict] = []
    for i in range(pts):
        kl, _ = interval([c[i]["kl"] for c in curves])
        true, half = interval([c[i]["true"] for c in curves])
        proxy, _ = interval([c[i]["proxy"] for c in curves])
        mean.append({"kl": kl, "sqrt_kl": math.sqrt(max(kl, 0.0)), "true": true, "true_ci95": half, "proxy": proxy})
    peak = max(range(pts), key=lambda i: mean[i]["true"])
    fall, fall_half = interval([c[peak]["true"] - c[-1]["true"] for c in curves])
    t0, p0 = mean[0]["true"], mean[0]["proxy"]
    part = next((m["kl"] for m in mean
                 if m["proxy"] - p0 > 0 and (m["true"] - t0) / true_std < PART * (m["proxy"] - p0)), None)  # fmt: skip
    fit = gao_fit(method, [m["kl"] for m in mean], [m["true"] - base for m in mean])
    return {"seeds": len(curves), "curve": mean, "peak_kl": mean[peak]["kl"], "peak_true": mean[peak]["true"],
            "peaked": peak < pts - 1, "last_kl": mean[-1]["kl"], "last_true": mean[-1]["true"], "fall": fall,
            "fall_ci95": fall_half, "overoptimized": overoptimized(peak < pts - 1, fall, fall_half),
            "part_kl": part, "gao": fit}  # fmt: skip


def overoptimized(peaked: bool, fall: float, half: float | None) -> bool | None:
    """Whether the true reward fell after its peak: its fall's 95% interval above 0; None: one seed, no interval."""
    if not peaked:
        return False
    return None if half is None else fall - half > 0


def summarize(data: dict, plan) -> dict:
    """{"arms": per arm summarize_arm, "holds": per method and count each conservative proxy's last true reward
    against mean's and single's (paired across seeds), "lines": per method and count its finding, "verdict"}."""
    init = data["initial"]
    arms: dict[str, dict] = {}
    holds: dict[str, dict] = {}
    lines: dict[str, str] = {}
    for n in plan.labels:
        for method in plan.methods:
            names = {p: f"{method}-{p}-{n}" for m, p in plan.arms() if m == method}
            for proxy, name in names.items():
                curves = seed_curves(data, name, plan.seeds)
                if curves:
                    base = curves[0][0]["true"] if method == "bon" else init["mean"]
                    arms[name] = summarize_arm(curves, method, base, init["std"] or 1.0) | {
                        "method": method, "proxy": proxy, "labels": n}
            holds |= compare_conservative(data, method, n, names, plan.seeds)
            if any(name in arms for name in names.values()):
                lines[f"{method}-{n}"] = finding(method, n, {p: arms[a] for p, a in names.items() if a in arms},
                                                 holds)  # fmt: skip
    return {"arms": arms, "holds": holds, "lines": lines, "verdict": verdict(arms, plan.seeds)}


def compare_conservative(data: dict, method: str, n: int, names: dict, seeds: int) -> dict:
    """Per conservative proxy and reference (mean, single): the last point's true reward of the conservative arm
    minus the reference's, mean and 95% half-width across the seeds both finished."""
    out = {}
    for cons in CONSERVATIVE:
        for ref in ("mean", "single"):
            if cons not in names or ref not in names:
                continue
            diffs = [data[seed_key(names[cons], s)]["curve"][-1]["true"] - data[seed_key(names[ref], s)]["curve"][-1][
                "true"] for s in range(seeds) if seed_key(names[cons], s) in data
                and seed_key(names[ref], s) in data]  # fmt: skip
            if diffs:
                d, half = interval(diffs)
                out[f"{method}-{cons}-vs-{ref}-{n}"] = {"diff": d, "ci95": half, "seeds": len(diffs)}
    return out


def pm(x: float, half: float | None) -> str:
    return f"{x:+.4f}" + (f" +/- {half:.4f}" if half is not None else " (one seed)")


def finding(method: str, n: int, arms: dict, holds: dict) -> str:
    """One line for a method at n labels: which proxies over-optimized (peak, fall), which conservative ones held
    the true reward up, or, where none peaked, where proxy and true reward part."""
    head = f"{METHOD_NAMES[method]}, {n} labels"
    fell = {p: a for p, a in arms.items() if a["overoptimized"] is not False}
    if not fell:
        parts = [f"{p} at KL {a['part_kl']:.2f}" for p, a in arms.items() if a["part_kl"] is not None]
        top = max(a["last_kl"] for a in arms.values())
        return (f"{head}: no over-optimization, the true reward did not fall after a peak up to KL {top:.2f} nats "
                f"under any proxy; proxy and true reward part (true gain < {PART:g} x the proxy's, in standard "
                f"deviations) " + ("; ".join(parts) if parts else "nowhere on these curves"))  # fmt: skip
    said = [f"{p} peaked at KL {a['peak_kl']:.2f} and fell {pm(a['fall'], a['fall_ci95'])} by KL {a['last_kl']:.2f}"
            for p, a in fell.items()]  # fmt: skip
    held = []
    for cons in CONSERVATIVE:
        if cons in arms and cons not in fell:
            vs = [f"{holds[k]['diff']:+.4f} vs {ref}" for ref in ("mean", "single")
                  if (k := f"{method}-{cons}-vs-{ref}-{n}") in holds]  # fmt: skip
            held.append(f"{cons} did not fall (last true reward {', '.join(vs)})")
    return f"{head}: over-optimization under " + "; ".join(said) + ("; " + "; ".join(held) if held else "")


def verdict(arms: dict, seeds: int) -> str:
    """One line: whether over-optimization appeared at this scale, and whether min/uwo removed it."""
    if not arms:
        return "no arm finished"
    sure = [n for n, a in arms.items() if a["overoptimized"]]
    maybe = [n for n, a in arms.items() if a["overoptimized"] is None]
    plain = [n for n, a in arms.items() if a["proxy"] in ("single", "mean") and a["overoptimized"] is not False]
    removed = [n for n in plain for cons in CONSERVATIVE
               if (c := n.replace(f"-{arms[n]['proxy']}-", f"-{cons}-")) in arms and arms[c]["overoptimized"] is False]
    if not sure and not maybe:
        return ("over-optimization did not appear at this scale: no arm's true reward fell after a peak (95% "
                "intervals across seeds); see each line for where proxy and true reward part")  # fmt: skip
    if not sure:
        return (f"one seed, no interval: the true reward peaked and fell in {', '.join(maybe)} (run --seeds 2 or more "
                "to tell it from noise)")  # fmt: skip
    cons = "; the conservative rewards removed it in " + (", ".join(sorted(set(removed))) if removed else "none")
    return f"over-optimization appeared at this scale in {', '.join(sure)} ({seeds} seeds, 95% intervals){cons}"


def plot(run_dir: Path, data: dict, plan) -> Path:
    """overoptimization.png: a panel per method and label count, true reward (solid, 95% band) and proxy (dashed,
    right axis) over sqrt KL per proxy, each true-reward peak starred; KL on the top axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = data["summary"]["arms"]
    rows, cols = len(plan.methods), len(plan.labels)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    colors = {"single": "tab:blue", "mean": "tab:green", "min": "tab:red", "uwo": "tab:purple"}
    for i, method in enumerate(plan.methods):
        for j, n in enumerate(plan.labels):
            ax = axes[i][j]
            px = ax.twinx()
            for proxy in plan.proxies:
                a = arms.get(f"{method}-{proxy}-{n}")
                if a is None:
                    continue
                x, c = [p["sqrt_kl"] for p in a["curve"]], colors[proxy]
                y, h = [p["true"] for p in a["curve"]], [p["true_ci95"] or 0.0 for p in a["curve"]]
                ax.plot(x, y, "-o", ms=3, color=c, label=f"{proxy}: true")
                lo, hi = [u - v for u, v in zip(y, h, strict=True)], [u + v for u, v in zip(y, h, strict=True)]
                ax.fill_between(x, lo, hi, color=c, alpha=0.15)
                ax.plot([math.sqrt(max(a["peak_kl"], 0))], [a["peak_true"]], "*", color=c, ms=11)
                px.plot(x, [p["proxy"] for p in a["curve"]], "--", color=c, lw=1, label=f"{proxy}: proxy")
            ax.set_title(f"{METHOD_NAMES[method]}, {n} labels")
            ax.set_xlabel("sqrt KL (nats^0.5)")
            ax.set_ylabel("true reward (solid)")
            px.set_ylabel("proxy reward (dashed)")
            ax.secondary_xaxis("top", functions=(lambda d: d**2, lambda k: k**0.5)).set_xlabel("KL (nats)")
            ax.grid(alpha=0.3)
            handles = ax.get_legend_handles_labels()[0] + px.get_legend_handles_labels()[0]
            ax.legend(handles=handles, fontsize=7, loc="lower right")
    fig.suptitle(f"true (gold: the simulated labeler) and proxy reward over KL ({plan.seeds} seed"
                 f"{'s' if plan.seeds > 1 else ''}; bands: 95% across seeds; stars: the true reward's peak)")
    fig.tight_layout()
    path = run_dir / "overoptimization.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(run_dir: Path, data: dict, plan, cfg: Config) -> Path:
    """report.md: the verdict, a line per method and label count, the table of arms, and the figure."""
    s = data["summary"]
    lines = ["# lmprefs experiment overoptimization", "", f"**Verdict:** {s['verdict']}", ""]
    lines += [f"- {line}" for line in s["lines"].values()]
    lines += ["", f"Gold reward: {cfg.labels.labeler} (the simulated labeler). Proxies per seed: an ensemble of "
              f"{plan.members} reward models per label count (single: its member 0; mean, min, uwo with lambda "
              f"{plan.uwo_lambda:g}: its reductions). Best-of-n: {plan.samples} samples of the initial policy on "
              f"{plan.queries} held-out queries, n = 1 to {plan.samples} (KL log n - (n-1)/n). PPO: "
              f"{cfg.ppo.num_updates} updates of {cfg.ppo.batch_size} at beta {plan.kl_coef:g}, its rollouts "
              f"averaged in windows. Gains over the initial policy; 95% intervals across seeds (Student's t).", "",
              "| arm | seeds | true-reward peak at KL | peak | last KL | fall after peak | proxy and true part at KL "
              "| Gao fit (alpha, beta; peak KL) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, a in s["arms"].items():
        g = a["gao"]
        fit = (f"{g['alpha']:.3f}, {g['beta']:.3f}; " + (f"{g['peak_kl']:.2f}" if g["peak_kl"] is not None
                                                           else "none") if "alpha" in g else g["error"])  # fmt: skip
        part = f"{a['part_kl']:.2f}" if a["part_kl"] is not None else "-"
        lines.append(f"| {name} | {a['seeds']} | {a['peak_kl']:.2f} | {a['peak_true']:+.4f} | {a['last_kl']:.2f} | "
                     f"{pm(a['fall'], a['fall_ci95'])} | {part} | {fit} |")  # fmt: skip
    lines += ["", "![true and proxy reward over KL](overoptimization.png)", ""]
    path = run_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path
