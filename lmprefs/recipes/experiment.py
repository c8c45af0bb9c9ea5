"""`lmprefs experiment`: the paper's controlled experiment (section 3.1.1, mock sentiment) at small scale.

mock-sentiment (Figure 2): policies trained against reward models learned from different numbers of simulated
labels, and one with direct access to the true reward, all with the same KL target, over `seeds` seeds (the reward
model's init, the label subset, the held-out label split and PPO's sampling vary with the seed), compared by the
true reward over episodes and on held-out queries, each arm with its KL from the initial policy on those queries.

What every experiment shares lives here too: results.json, the arms (a train-policy run each, evaluated on held-out
queries) and the summaries across seeds; kl-frontier (Figure 3) is lmprefs.recipes.kl_frontier.

What does not depend on the arm is done once: the label store (each seed's counts nested subsets of it), the
initial policy's evaluation, the reward models' frozen-prefix pass over every label they train on, and per seed the
untrained reward model's normalization and held-out evaluation; each gives bitwise what the arm alone would.
`--plan` (lmprefs.recipes.plan) estimates each stage's seconds before anything runs.

Every stage leaves its result in the run directory's results.json, so an interrupted experiment picks up where it
stopped: the label store and the frontier's samples are made once, each arm is a train-policy run that resumes from
its checkpoint, and finished arms are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

from lmprefs.config import Config
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.pipeline.evaluation import evaluate_arm
from lmprefs.pipeline.labeling import collect_labels, open_store
from lmprefs.pipeline.policy import run_train_policy
from lmprefs.pipeline.reward_model import shared_reward_prefixes
from lmprefs.pipeline.rewards import reward_function
from lmprefs.pipeline.task import check_heldout, setup_task
from lmprefs.recipes.plan import POOL_FACTOR, store_questions
from lmprefs.runtime.runlog import read_metrics
from lmprefs.training.prefix_share import SharedPrefixes

R = dataclasses.replace


class Results:
    """results.json of an experiment, rewritten atomically after every stage."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "results.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self, key: str, value) -> None:
        self.data[key] = value
        atomic_write_text(self.path, json.dumps(self.data, indent=1))


def true_reward_fn(name: str):
    """The true reward by name (vader, descriptiveness or module:function), or one line naming the bad value."""
    return reward_function(name, "--true-reward")[1]


def train_arm(cfg: Config, arm_dir: Path, name: str, what: str, n_eval: int, samples: int, true_name: str, *,
              reward: str | None = None, store_path: Path | None = None,
              shared: SharedPrefixes | None = None, before: dict | None = None,
              along: Mapping[int, Callable[[dict], object]] | None = None) -> dict:  # fmt: skip
    """One arm: a train-policy run in arm_dir (resumed if begun before), evaluated on the first n_eval held-out
    queries with the true reward and its KL from the initial policy. `shared`: frozen prefixes its reward model
    takes its rows from (shared_reward_prefixes), instead of computing them again; `before`: the untrained reward
    models' figures, kept across arms (reward_model.before_training); `along`: {update: put}, the policy evaluated
    the same way after that many updates of the run, before its checkpoint there, and handed to put."""

    resume = (arm_dir / "run.json").is_file()  # begun before: resume (from its checkpoint, or over)
    print(f"[{name}] {'resuming' if resume else 'training'} ({what})", flush=True)
    t = setup_task(cfg, n_eval)  # a fresh model per arm: adapters must not carry over between arms
    t.shared_prefixes, t.shared_before = shared, before

    def evaluate_along(run, _stats) -> None:
        put = (along or {}).get(run.update)
        if put is not None:
            put(evaluate_arm(t, run.policy, t.heldout_queries[:n_eval], true_reward_fn(true_name), samples,
                             cfg.run.seed + 5, f"{name} after {run.update} updates"))  # fmt: skip

    out = run_train_policy(cfg, arm_dir, reward=reward, store_path=str(store_path) if store_path else None,
                           resume=resume, t=t, true_reward=true_name,
                           on_update=evaluate_along if along else None)  # fmt: skip
    ev = evaluate_arm(t, out["run"].policy, t.heldout_queries[:n_eval], true_reward_fn(true_name), samples,
                      cfg.run.seed + 5, name)  # fmt: skip
    print(f"[{name}] true reward {ev['mean']:+.4f} +/- {ev['stderr']:.4f}, KL {ev['kl']:.2f} +/- "
          f"{ev['kl_stderr']:.2f} nats", flush=True)  # fmt: skip
    return ev


# --- Figure 2 ----------------------------------------------------------------------------------------------------


def seed_key(name: str, s: int) -> str:
    """results.json key and directory of an arm's seed s (seed 0 keeps the single-seed layout)."""
    return name if s == 0 else f"{name}-seed{s}"


DEFAULT_LABEL_COUNTS = [250, 1000, 4000]
DEFAULT_EVAL_QUERIES = 256


def default_label_counts(cfg: Config, n_train_queries: int, seeds: int) -> list[int]:
    """250, 1000 and 4000 labels where the task's training queries can give them (each label is a question on its
    own query, and the held-out fraction and a seeds' pool take their share); otherwise the most they can give, a
    quarter and a sixteenth of it: the same 16-fold spread."""
    most = int(n_train_queries * (1 - cfg.labels.heldout_fraction) / (POOL_FACTOR if seeds > 1 else 1))
    if most >= DEFAULT_LABEL_COUNTS[-1]:
        return list(DEFAULT_LABEL_COUNTS)
    return sorted({max(1, most // 16), max(1, most // 4), most})


def check_sizes(t, label_counts: list[int] | None, n_eval: int | None, seeds: int) -> tuple[list[int], int]:
    """(label counts, held-out queries) of Figure 2 on task t: None for the defaults the task's queries allow (said
    when they shrink); one line naming the flag when the task cannot give them."""
    cfg, hf = t.cfg, t.cfg.labels.heldout_fraction
    if n_eval is None:
        n_eval = min(DEFAULT_EVAL_QUERIES, len(t.heldout_queries))
        if n_eval < DEFAULT_EVAL_QUERIES:
            print(f"evaluating on all {n_eval} held-out queries of task.query_dataset={cfg.task.query_dataset!r}")
    if label_counts is None:
        label_counts = default_label_counts(cfg, len(t.train_queries), seeds)
        if label_counts != DEFAULT_LABEL_COUNTS:
            print(f"label counts {','.join(map(str, label_counts))}: what the task's {len(t.train_queries)} training "
                  "queries can give")  # fmt: skip
    check_heldout(t, n_eval, "--eval-queries")
    if store_questions(cfg, label_counts, seeds) > len(t.train_queries):
        most = int(len(t.train_queries) * (1 - hf) / (POOL_FACTOR if seeds > 1 else 1))
        raise UserError(f"--labels {max(label_counts)}: the label store can provide at most {most} labels "
                        f"({len(t.train_queries)} training queries in task.query_dataset={cfg.task.query_dataset!r}, "
                        f"labels.heldout_fraction {hf}" + (f", {POOL_FACTOR}x the largest count for --seeds {seeds}"
                                                           if seeds > 1 else "") + ")")  # fmt: skip
    return label_counts, n_eval


def run_mock_sentiment(cfg: Config, run_dir: Path, label_counts: list[int] | None, n_eval: int | None,
                       samples: int, seeds: int = 1,
                       on_start: Callable[[], None] | None = None) -> dict:  # fmt: skip
    """Figure 2 over `seeds` seeds. label_counts, n_eval: None for the defaults the task's queries allow. on_start
    runs once every input has been checked, before anything is written."""

    true_name = cfg.labels.labeler
    t = setup_task(cfg, n_eval or DEFAULT_EVAL_QUERIES)
    label_counts, n_eval = check_sizes(t, label_counts, n_eval, seeds)
    n_questions = store_questions(cfg, label_counts, seeds)
    res = Results(run_dir)
    held = res.data.get("labels", {}).get("questions", n_questions)
    if held < n_questions:
        raise UserError(f"--labels {max(label_counts)}" + (f" --seeds {seeds}" if seeds > 1 else "") + f": the label "
                        f"store of {run_dir} holds {held} questions, not the {n_questions} these need; keep the "
                        "experiment's --labels and --seeds, or start another --run-dir")  # fmt: skip
    if on_start:
        on_start()
    run_dir.mkdir(parents=True, exist_ok=True)
    store_path = run_dir / "labels.sqlite"
    kept = None  # the labeling pass's frozen prefixes of every labeled row, when it runs in this process
    if "labels" not in res.data:
        print(f"[labels] sampling and labeling {n_questions} questions with {true_name}", flush=True)
        out = collect_labels(t, open_store(store_path), n_questions, source="experiment", keep_prefixes=True)
        res.save("labels", {"questions": n_questions, "seconds": out["seconds"]})
        kept = out["prefixes"]
    if "initial" not in res.data:
        print("[initial] evaluating the initial policy", flush=True)
        res.save("initial", evaluate_arm(t, None, t.heldout_queries[:n_eval], true_reward_fn(true_name), samples,
                                         cfg.run.seed + 5, "initial policy"))  # fmt: skip
    arms = [(f"rm-{n}", n) for n in label_counts] + [("direct", None)]
    todo = [arm_config(cfg, s, n) for s in range(seeds) for name, n in arms
            if n is not None and seed_key(name, s) not in res.data]  # fmt: skip
    shared = kept if todo else None
    if shared is None and len(todo) > 1:  # the frozen bottom blocks: run once over the union of the arms' labels
        shared = shared_reward_prefixes(t, open_store(store_path), todo)
    if shared is not None:
        print(f"[prefixes] the frozen blocks' outputs of {len(shared.items)} labeled questions, shared by "
              f"{len(todo)} reward models ({shared.nbytes() / 2**30:.2f} GiB)", flush=True)  # fmt: skip
    del t
    before: dict = {}  # an untrained reward model is the same for every count of a seed: normalized once per seed
    for s in range(seeds):
        for name, n in arms:
            key = seed_key(name, s)
            if key in res.data:
                print(f"[{key}] done: {res.data[key]['mean']:+.4f}", flush=True)
                continue
            arm_cfg = arm_config(cfg, s, n)
            ev = train_arm(arm_cfg, run_dir / key, key, f"{n} labels" if n else "true reward", n_eval, samples,
                           true_name, reward=None if n else true_name, store_path=store_path,
                           shared=shared if n else None, before=before if n else None)  # fmt: skip
            res.save(key, ev | {"labels": n, "reward": "model" if n else true_name, "seed": arm_cfg.run.seed})
    names = [a[0] for a in arms]
    res.save("summary", summarize_seeds(res.data, names, seeds))
    res.save("finding", finding(res.data["summary"], names))
    fig = plot_figure2(run_dir, names, seeds, res.data, cfg.ppo.batch_size)
    plot_overoptimization(run_dir, [n for n in names if n.startswith("rm-")], seeds)
    return {"results": res.data, "figure": fig}


def arm_config(cfg: Config, s: int, n: int | None) -> Config:
    """The config of seed s's arm with n labels (None: direct access): the seed moves, and a reward model trains on a
    random n of the store's labels drawn with it, so a seed's smaller counts are prefixes of its larger ones."""
    seed = cfg.run.seed + s
    arm = R(cfg, run=R(cfg.run, seed=seed))
    return arm if n is None else R(arm, labels=R(cfg.labels, num_train=n, subset_seed=seed))


def mean_se(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def t_central(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with df degrees of freedom, in closed form (Abramowitz & Stegun 26.7.3-4: a finite
    series in cos(theta)^2, theta = atan(t / sqrt(df)))."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 0:  # sin(theta) (1 + 1/2 c2 + 1.3/(2.4) c2^2 + ... up to c2^((df - 2) / 2))
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    term, total = 1.0, 1.0 if df > 1 else 0.0  # (2/pi)(theta + sin cos (1 + 2/3 c2 + ... up to c2^((df - 3) / 2)))
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + s * math.cos(theta) * total)


def t975(df: int) -> float:
    """Student's t quantile at 97.5% with df >= 1 degrees of freedom (12.706 at 1, 2.201 at 11, toward 1.960): the
    central series inverted by bisection to within 1e-12."""
    lo, hi = 0.0, 1e3  # t975(1) = 12.706
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_central(mid, df) < 0.95 else (lo, mid)
    return (lo + hi) / 2


def ci95(stderr: float, n: int) -> float:
    """Half-width of a 95% interval for a mean of n >= 2 values (seeds, or one seed's queries) with this standard
    error: t with n - 1 degrees of freedom at every n; n unknown (0): the normal's 1.96."""
    return stderr * (t975(n - 1) if n >= 2 else 1.96)


def interval_count(d: dict) -> int:
    """The n of an arm's interval: its seeds, or with one seed its queries (its s.e. is over them); 0 unknown."""
    return d["seeds"] if d.get("seeds", 1) > 1 else d.get("n_queries", 0)


def finding(summary: dict, names: list[str]) -> str | None:
    """Whether the paper's Figure 2 finding shows: the reward model from the most labels above the one from the
    fewest, and close to direct access (95% intervals: the first pair apart, the second overlapping); None without
    two reward-model arms and a direct one."""
    rms = [n for n in names if n.startswith("rm-") and n in summary]
    if len(rms) < 2 or "direct" not in summary:
        return None
    lo_arm, hi_arm, direct = (summary[rms[0]], summary[rms[-1]], summary["direct"])

    def interval(d):
        return d["mean"] - d["ci95"], d["mean"] + d["ci95"]

    (_, lo_top), (hi_low, hi_top), (d_low, d_top) = interval(lo_arm), interval(hi_arm), interval(direct)
    above, close = hi_low > lo_top, hi_top >= d_low and d_top >= hi_low
    verdict = "shows" if above and close else "does not show"
    return (f"the paper's finding {verdict}: {rms[-1]} {'above' if above else 'not above'} {rms[0]} (95% intervals "
            f"{'apart' if above else 'overlapping'}), {'close to' if close else 'apart from'} direct access "
            f"(intervals {'overlapping' if close else 'apart'})")  # fmt: skip


def summarize_seeds(data: dict, names: list[str], seeds: int) -> dict:
    """Per arm: held-out true reward and KL as mean +/- s.e. across seeds (one seed: the s.e. within the run), and
    the true reward's 95% interval half-width (`ci95`)."""
    out = {}
    for name in names:
        runs = [data[seed_key(name, s)] for s in range(seeds) if seed_key(name, s) in data]
        if not runs:
            continue
        # runs of an lmprefs before the held-out KL have none: nan
        kls = [r.get("kl", math.nan) for r in runs]
        (m, se), (k, kse) = mean_se([r["mean"] for r in runs]), mean_se(kls)
        if len(runs) == 1:
            se, kse = runs[0]["stderr"], runs[0].get("kl_stderr", math.nan)
        n = len(runs) if len(runs) > 1 else runs[0]["n_queries"]  # one seed: its s.e. is over its queries
        out[name] = {"mean": m, "stderr": se, "ci95": ci95(se, n), "kl": k, "kl_stderr": kse, "seeds": len(runs),
                     "n_queries": runs[0]["n_queries"],
                     "labels": runs[0].get("labels")}  # fmt: skip
    return out


def plot_figure2(run_dir: Path, names: list[str], seeds: int, data: dict, batch_size: int) -> Path:
    """Left: the rollouts' true reward over episodes per arm, mean +/- s.e. across seeds (the paper's axes); middle:
    the score each arm's policy optimized over episodes (the reward model's; the direct arm's: the true reward as
    normalized for it); right: the held-out true reward per arm, mean and 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax, px, bx) = plt.subplots(1, 3, figsize=(17, 4.5))
    for axis, metric in ((ax, "objective/true_reward"), (px, "objective/score")):
        for name in names:
            curves = []
            for s in range(seeds):
                path = run_dir / seed_key(name, s) / "metrics.jsonl"
                rows = read_metrics(path, "policy") if path.exists() else []
                curves.append({r.get("elapsed/episodes", r["step"] * batch_size): r.get(metric, math.nan)
                               for r in rows})  # fmt: skip
            steps = sorted(set().union(*curves))
            if not steps:
                continue
            y = np.array([[c.get(x, math.nan) for x in steps] for c in curves])  # [seeds, episodes]
            n = np.sum(~np.isnan(y), 0)
            with warnings.catch_warnings():  # episodes only some seeds reached: the mean of those, no s.e. from one
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = np.nanmean(y, 0)
                se = np.where(n > 1, np.nanstd(y, 0, ddof=1) / np.sqrt(np.maximum(n, 1)), 0.0)
            line = axis.plot(steps, mean, label=f"{name} ({int(n.max())} seed{'s' if n.max() > 1 else ''})")[0]
            axis.fill_between(steps, mean - np.nan_to_num(se), mean + np.nan_to_num(se), color=line.get_color(),
                              alpha=0.2)  # fmt: skip
        axis.set_xlabel("episodes")
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    ax.set_title("true reward of rollouts (mean +/- s.e. across seeds)")
    ax.set_ylabel("true reward")
    px.set_title("score optimized (reward model's; direct: normalized true reward)", fontsize=10)
    px.set_ylabel("objective/score")
    summary = {"initial": data["initial"], **summarize_seeds(data, names, seeds)} if "initial" in data else {}
    bars = [n for n in ["initial", *names] if n in summary]
    # the initial policy is one policy: its interval is over queries; the arms' are across seeds when there are some
    errs = [summary[n].get("ci95", ci95(summary[n]["stderr"], interval_count(summary[n]))) for n in bars]
    bx.bar(bars, [summary[n]["mean"] for n in bars], yerr=errs, capsize=4)
    bx.set_title("true reward on held-out queries, mean and 95% interval\n" + (
        "arms: across seeds (t); initial: over queries" if seeds > 1 else "over queries"), fontsize=10)  # fmt: skip
    bx.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path = run_dir / "figure2.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_overoptimization(run_dir: Path, names: list[str], seeds: int) -> Path | None:
    """overoptimization.png: per reward-model arm, over the KL of its rollouts, the score it optimized (the reward
    model's, left axis) and the true reward (right axis), one line per seed, each seed's true-reward peak marked:
    where the proxy keeps rising past that peak, the policy exploits the reward model (Gao et al. 2022)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        tx = ax.twinx()
        for s in range(seeds):
            path = run_dir / seed_key(name, s) / "metrics.jsonl"
            rows = [r for r in (read_metrics(path, "policy") if path.exists() else []) if "objective/true_reward" in r]
            if not rows:
                continue
            kl = [r["objective/kl"] for r in rows]
            true = [r["objective/true_reward"] for r in rows]
            first = s == 0
            ax.plot(kl, [r["objective/score"] for r in rows], color="tab:blue", alpha=0.7, lw=1,
                    label="reward-model score" if first else None)  # fmt: skip
            tx.plot(kl, true, color="tab:orange", alpha=0.7, lw=1, label="true reward" if first else None)
            top = max(range(len(true)), key=true.__getitem__)
            tx.plot([kl[top]], [true[top]], "*", color="tab:red", ms=9, label="true reward's peak" if first else None)
        ax.set_title(f"{name} ({seeds} seed{'s' if seeds > 1 else ''})")
        ax.set_xlabel("KL of the rollouts (objective/kl), nats")
        ax.set_ylabel("reward-model score", color="tab:blue")
        tx.set_ylabel("true reward", color="tab:orange")
        ax.grid(alpha=0.3)
        handles = ax.get_legend_handles_labels()[0] + tx.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=7, loc="lower right")
    fig.tight_layout()
    path = run_dir / "overoptimization.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
