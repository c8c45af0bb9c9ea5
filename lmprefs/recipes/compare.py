"""`lmprefs experiment compare`: the methods lmprefs implements, side by side on the axes of the paper's Figure 3
(KL(pi, rho) against the true reward on held-out queries), from one label store and one true reward.

Arms: PPO with the shared value head, PPO with a separate value model and RLOO, each against one reward model trained
once from the store (every arm reads it through rewards.trained_model), at fixed KL coefficients; DPO with the
pairwise and the listwise loss on the same store, at several dpo.beta; best-of-n against the same reward model (no
training; its KL is the analytic log n - (n-1)/n). Every arm is evaluated on the same held-out queries with the true
reward (the labeler's), beside the sampled optimal frontier (lmprefs.training.frontier) from M samples of rho on those
queries. It resumes like the other experiments (lmprefs.recipes.experiment): the store, the frontier's samples and
the reward model are made once, a PPO or DPO arm resumes from its checkpoint, and finished arms are skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from lmprefs.config import Config
from lmprefs.data.tasks import apply_penalty, decode, response_texts, stop_tokens, truncate_responses
from lmprefs.errors import UserError
from lmprefs.labels.labelers import score_texts
from lmprefs.models.artifacts import load_policy
from lmprefs.models.ensemble import load_reward
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.pipeline.dpo import dpo_labels, run_train_dpo
from lmprefs.pipeline.labeling import collect_labels, label_source, open_store
from lmprefs.pipeline.reward_model import reward_logger
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.task import Task, check_heldout, setup_task
from lmprefs.recipes.compare_lengths import BETA0, check_begun, is_beta0, resolve_lengths
from lmprefs.recipes.experiment import (
    R,
    Results,
    evaluate_arm,
    seed_key,
    summarize_seeds,
    train_arm,
    true_reward_fn,
)
from lmprefs.recipes.kl_frontier import frontier_scores, plot_frontier, save_frontier
from lmprefs.recipes.matched import check_reach, matched_kl, matched_table, verdicts
from lmprefs.runtime.runlog import read_metrics
from lmprefs.training.conservative import reduced_scores
from lmprefs.training.frontier import DEFAULT_BETAS
from lmprefs.training.rollout import rm_score_fn
from lmprefs.training.scaling_laws import bon_kl

# the PPO-family arms: what each changes in the ppo section
PPO_FAMILY = {"ppo": {"value_model": "shared", "estimator": "ppo"},
              "ppo-separate": {"value_model": "separate", "estimator": "ppo"},
              "rloo": {"value_model": "shared", "estimator": "rloo"},
              "grpo": {"value_model": "shared", "estimator": "grpo", "kl_in": "loss"},
              "grpo-kl-reward": {"value_model": "shared", "estimator": "grpo", "kl_in": "reward"},
              "dr-grpo": {"value_model": "shared", "estimator": "dr_grpo"},
              "reinforce-pp-baseline": {"value_model": "shared", "estimator": "reinforce_pp_baseline"}}  # fmt: skip
# each PPO-family kind at beta 0 too, swept over its training length (compare_lengths)
BETA0_KINDS = {k + BETA0: k for k in PPO_FAMILY}
ARMS = (*PPO_FAMILY, *BETA0_KINDS, "dpo-pairwise", "dpo-listwise", "best-of-n")
NEEDS_RM = {*PPO_FAMILY, *BETA0_KINDS, "best-of-n"}
DEFAULT_EVAL_QUERIES = 64


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `experiment compare` runs. labels: the store's label count (None: labels.num_train); n_eval: held-out
    queries (0: 64, or all the task sets aside if fewer); db: an existing store instead of sampling and labeling
    one."""

    arms: tuple[str, ...] = (*PPO_FAMILY, "dpo-pairwise", "dpo-listwise", "best-of-n")
    kl_coefs: tuple[float, ...] = (0.03, 0.1, 0.3)
    dpo_betas: tuple[float, ...] = (0.03, 0.1, 0.3)
    best_of: tuple[int, ...] = (2, 4, 8, 16)
    seeds: int = 1
    labels: int | None = None
    n_eval: int = 0
    eval_samples: int = 2
    samples: int = 256
    betas: tuple[float, ...] = DEFAULT_BETAS
    min_ess: float = 10.0
    db: Path | None = None
    match_kl: tuple[float, ...] = ()
    lengths: tuple[int, ...] = ()
    """Updates after which each beta-0 kind's run is evaluated (resolve_lengths: its end always among them)."""


def arm_list(plan: Plan) -> list[tuple[str, str, str, float]]:
    """(name, kind, setting, value) of every arm, in plan.arms' order: one per KL coefficient of a PPO-family kind,
    one per dpo.beta of a DPO kind, one per n of best-of-n, one per length of a beta-0 kind (one run of them all)."""
    out = []
    for kind in plan.arms:
        if is_beta0(kind):
            out += [(f"{kind}-u{u}", kind, f"kl_coef 0, {u} updates", float(u)) for u in plan.lengths]
        elif kind in PPO_FAMILY:
            out += [(f"{kind}-beta{c:g}", kind, f"kl_coef {c:g}", c) for c in plan.kl_coefs]
        elif kind.startswith("dpo-"):
            out += [(f"{kind}-beta{b:g}", kind, f"dpo.beta {b:g}", b) for b in plan.dpo_betas]
        else:
            out += [(f"best-of-{n}", kind, f"n {n}", float(n)) for n in plan.best_of]
    return out


def run_compare(cfg: Config, run_dir: Path, plan: Plan, on_start: Callable[[], None] | None = None) -> dict:
    """Every arm of `plan` over plan.seeds seeds (the reward model is one, trained with the first), evaluated on the
    first plan.n_eval held-out queries. on_start runs once every input has been checked, before anything is
    written. Returns results.json's data, the figure and the report."""
    true_name = cfg.labels.labeler
    true_fn = true_reward_fn(true_name)
    cfg = R(cfg, labels=R(cfg.labels, num_train=plan.labels or cfg.labels.num_train))
    t = setup_task(cfg, plan.n_eval or DEFAULT_EVAL_QUERIES)
    plan = dataclasses.replace(plan, n_eval=plan.n_eval or min(DEFAULT_EVAL_QUERIES, len(t.heldout_queries)))
    check_heldout(t, plan.n_eval, "--eval-queries")
    res = Results(run_dir)
    store_path = _check_store(t, plan, run_dir, res)
    plan = dataclasses.replace(plan, lengths=resolve_lengths(plan.lengths, plan.arms, cfg.ppo.num_updates,
                                                             "ppo.total_episodes / ppo.batch_size"))  # fmt: skip
    begun = [seed_key(k, s) for k in plan.arms if is_beta0(k) for s in range(plan.seeds)
             if (run_dir / seed_key(k, s) / "run.json").is_file()]  # fmt: skip
    check_begun(res.data, plan.lengths, begun)
    check_reach(res.data, arm_list(plan), plan.arms, plan.seeds, plan.match_kl)
    if on_start:
        on_start()
    run_dir.mkdir(parents=True, exist_ok=True)
    if "labels" not in res.data:
        if plan.db is None:
            n = questions_to_label(t)
            print(f"[labels] sampling and labeling {n} questions with {true_name}", flush=True)
            collect_labels(t, open_store(store_path), n, source="experiment")
        res.save("labels", {"store": str(store_path), "num_train": cfg.labels.num_train})
    heldout = t.heldout_queries[: plan.n_eval]
    scores = frontier_scores(t, run_dir, heldout, true_fn, plan.samples, cfg.run.seed + 7, "--eval-queries")
    save_frontier(res, scores, list(plan.betas), plan.min_ess)
    rm_dir = run_dir / "reward_model"
    if NEEDS_RM & set(plan.arms) and "reward_model" not in res.data:
        print(f"[reward model] training on {cfg.labels.num_train} labels of {store_path}", flush=True)
        log = reward_logger(run_dir, cfg)
        try:
            summary = train_reward_model(t, label_source(str(store_path)), rm_dir, log)[1]
        finally:
            log.close()
        res.save("reward_model", {k: v for k, v in summary.items() if isinstance(v, int | float)})
    del t
    if plan.lengths:
        res.save("lengths", list(plan.lengths))
    for s in range(plan.seeds):
        for name, kind, setting, value in arm_list(plan):
            key = seed_key(name, s)
            if key in res.data:
                print(f"[{key}] done: {res.data[key]['mean']:+.4f} at KL {res.data[key]['kl']:.2f}", flush=True)
            else:
                seeded = R(cfg, run=R(cfg.run, seed=cfg.run.seed + s))
                _run_arm(seeded, run_dir, res, plan, (name, kind, setting, value), s, store_path)
    names = [a[0] for a in arm_list(plan)]
    res.save("summary", summarize_seeds(res.data, names, plan.seeds))
    res.save("matched_kl", matched_kl(res.data, arm_list(plan), plan.arms, plan.seeds, plan.match_kl))
    fig = plot_compare(run_dir, res.data, plan)
    report = write_report(run_dir, res.data, plan, cfg)
    return {"results": res.data, "figure": fig, "report": report}


def _run_arm(cfg: Config, run_dir: Path, res: Results, plan: Plan, arm: tuple[str, str, str, float], s: int,
             store_path: Path) -> None:  # fmt: skip
    """One arm of seed s (cfg: that seed's), its figures saved in results.json; a beta-0 arm runs its kind's one
    run, which saves every length's."""
    name, kind, setting, value = arm
    key, rm_dir, true_name, t0 = seed_key(name, s), run_dir / "reward_model", cfg.labels.labeler, time.time()
    true_fn = true_reward_fn(true_name)

    def put(ev: dict, episodes: int, at: str = key, u: int | None = None) -> None:
        wall = time.time() - t0
        where = {"setting": f"kl_coef 0, {u} updates", "value": float(u)} if u else {"setting": setting,
                                                                                      "value": value}  # fmt: skip
        res.save(at, ev | {"arm": kind, **where, "seed": cfg.run.seed, "labels": cfg.labels.num_train,
                           "seconds": wall, "episodes": episodes, "episodes_per_s": episodes / wall})  # fmt: skip

    if kind in PPO_FAMILY or is_beta0(kind):
        base = BETA0_KINDS.get(kind, kind)
        rewards = R(cfg.rewards, kl_coef=0.0 if is_beta0(kind) else value, kl_target=None, trained_model=str(rm_dir))
        cfg = R(cfg, ppo=R(cfg.ppo, **PPO_FAMILY[base]), rewards=rewards)
        B, last = cfg.ppo.batch_size, cfg.ppo.num_updates
        if not is_beta0(kind):
            put(train_arm(cfg, run_dir / key, key, f"{kind}, {setting}", plan.n_eval, plan.eval_samples, true_name),
                last * B)  # fmt: skip
            return
        # one run for every length: the points before its end evaluated along the way
        keys = {u: seed_key(f"{kind}-u{u}", s) for u in plan.lengths}
        along = {u: functools.partial(put, episodes=u * B, at=keys[u], u=u) for u in plan.lengths
                 if u < last and keys[u] not in res.data}  # fmt: skip
        run_key = seed_key(kind, s)
        ev = train_arm(cfg, run_dir / run_key, run_key, f"{base}, kl_coef 0, evaluated after "
                       f"{','.join(map(str, plan.lengths))} updates", plan.n_eval, plan.eval_samples, true_name,
                       along=along)  # fmt: skip
        put(ev, last * B, keys[last], last)
    elif kind.startswith("dpo-"):
        cfg = R(cfg, dpo=R(cfg.dpo, beta=value, loss=kind.removeprefix("dpo-")))
        put(*_dpo_arm(cfg, run_dir / key, key, store_path, plan, true_fn))
    else:
        put(*_best_of_n_arm(cfg, rm_dir, key, int(value), plan, true_fn))


def questions_to_label(t: Task) -> int:
    """The questions sampled and labeled for the store's labels.num_train (with the held-out fraction), refused in
    one line where the task's training queries cannot give them."""
    n = math.ceil(t.cfg.labels.num_train / (1 - t.cfg.labels.heldout_fraction))
    if n > len(t.train_queries):
        raise UserError(f"--labels {t.cfg.labels.num_train}: the task's {len(t.train_queries)} training queries "
                        f"(task.query_dataset={t.cfg.task.query_dataset!r}) give at most "
                        f"{int(len(t.train_queries) * (1 - t.cfg.labels.heldout_fraction))} labels")  # fmt: skip
    return n


def _check_store(t: Task, plan: Plan, run_dir: Path, res: Results) -> Path:
    """The label store the arms learn from: --db (refused, naming it, without best-of-N or pairwise labels), or one
    sampled and labeled into run_dir (refused when the task's training queries cannot give its labels)."""
    started = res.data.get("labels", {}).get("store")
    if plan.db is None:
        path = run_dir / "labels.sqlite"
        if started is None:
            questions_to_label(t)
    else:
        path = Path(plan.db).resolve()
        dpo_labels(t, label_source(str(path)), f"--db {plan.db}")  # the check train-dpo makes, before any work
    if started is not None and started != str(path):
        raise UserError(f"{run_dir} is an experiment on the label store {started}, not {path}; rerun it with its own "
                        "--db, or choose another --run-dir")  # fmt: skip
    had = res.data.get("labels", {}).get("num_train", t.cfg.labels.num_train)
    if had != t.cfg.labels.num_train:  # its reward model and finished arms learned from that many
        raise UserError(f"--labels {t.cfg.labels.num_train}: {run_dir} is an experiment on {had} labels; rerun it "
                        "with its own --labels, or choose another --run-dir")  # fmt: skip
    return path


def _dpo_arm(cfg: Config, arm_dir: Path, key: str, store_path: Path, plan: Plan, true_fn) -> tuple[dict, int]:
    """A train-dpo run in arm_dir (resumed if begun before; skipped once its policy is saved), evaluated as the PPO
    arms are. Episodes: the labels it trained on, times dpo.epochs."""
    if not (arm_dir / "policy").exists():
        resume = (arm_dir / "run.json").is_file()
        print(f"[{key}] {'resuming' if resume else 'training'} (DPO {cfg.dpo.loss}, beta {cfg.dpo.beta:g})",
              flush=True)  # fmt: skip
        run_train_dpo(cfg, arm_dir, store_path=str(store_path), resume=resume)
    t = setup_task(cfg, plan.n_eval)
    policy = load_policy(arm_dir / "policy", t.device, cfg.task.temperature)
    ev = evaluate_arm(t, policy, t.heldout_queries[: plan.n_eval], true_fn, plan.eval_samples, cfg.run.seed + 5, key)
    rows = [r for r in read_metrics(arm_dir / "metrics.jsonl", "dpo") if "dpo/labels_train" in r]
    print(f"[{key}] true reward {ev['mean']:+.4f} +/- {ev['stderr']:.4f}, KL {ev['kl']:.2f} +/- "
          f"{ev['kl_stderr']:.2f} nats", flush=True)  # fmt: skip
    return ev, int(rows[-1]["dpo/labels_train"]) * cfg.dpo.epochs if rows else 0


def _best_of_n_arm(cfg: Config, rm_dir: Path, key: str, n: int, plan: Plan, true_fn) -> tuple[dict, int]:
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


COLORS = {"ppo": "tab:blue", "ppo-separate": "tab:cyan", "rloo": "tab:green", "dpo-pairwise": "tab:red",
          "dpo-listwise": "tab:orange", "best-of-n": "tab:purple", "grpo": "tab:olive", "grpo-kl-reward": "tab:brown",
          "dr-grpo": "tab:pink", "reinforce-pp-baseline": "tab:gray"}  # fmt: skip


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
    ax.set_xlabel("KL(pi, rho), nats")
    ax.set_ylabel("true reward on held-out queries")
    ax.set_title(f"one label store, one reward model: {plan.seeds} seed{'s' if plan.seeds > 1 else ''}, "
                 f"{plan.n_eval} held-out queries")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)  # beside: no point hidden
    fig.tight_layout()
    path = run_dir / "compare.png"
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


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
             "run that finished it; episodes: rollouts (PPO, RLOO), labels x epochs (DPO), samples drawn "
             "(best-of-n).", "", *table(data, plan), "",
             *([f"**Arms that {still}.**", ""] if (still := unmoved(data, plan, cfg)) else []),
             f"Optimal frontier from {fr['queries']} queries x {fr['samples_per_query']} samples of rho (trusted up "
             f"to mean ESS {fr['min_ess']:g}).", "", "![KL vs true reward](compare.png)", ""]  # fmt: skip
    m = data.get("matched_kl", {"kls": [], "note": "not computed"})
    lines += ["## At matched KL", "",
              "Each kind's true reward interpolated on its own curve over its KL settings, per seed, at KL values "
              f"every kind reached in every seed ({m.get('ranges', '')}); mean across seeds +/- the 95% interval's "
              "half-width (Student's t), seeds in brackets; the frontier at that KL where trusted (dotted lines in "
              "the figure).", "", *matched_table(m), "", *verdicts(m, plan.seeds), ""]  # fmt: skip
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    return path
