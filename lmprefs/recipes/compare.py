"""`lmprefs experiment compare`: the methods lmprefs implements, side by side on the axes of the paper's Figure 3
(KL(pi, rho) against the true reward on held-out queries), from one label store and one true reward.

Arms (compare_arms): PPO with the shared value head, PPO with a separate value model, RLOO and the GRPO family, each
against one reward model trained once from the store (every arm reads it through rewards.trained_model), at fixed KL
coefficients or at beta 0 over their training length (compare_lengths); DPO with the pairwise and the listwise loss on
the same store, and online DPO on its own samples judged by the same reward model, at several dpo.beta
(compare_dpo); best-of-n against the same reward model (best_of_n: no training; its KL is the analytic log n -
(n-1)/n). Every arm is evaluated on the same held-out queries with the true reward (the labeler's), beside the
sampled optimal frontier (lmprefs.training.frontier) from M samples of rho on those queries; compare_report draws and
writes the outcome. It resumes like the other experiments (lmprefs.recipes.experiment): the store, the frontier's
samples and the reward model are made once, a PPO or DPO arm resumes from its checkpoint, and finished arms are
skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path

from lmprefs.config import Config
from lmprefs.errors import UserError
from lmprefs.pipeline.dpo import dpo_labels
from lmprefs.pipeline.labeling import collect_labels, label_source, open_store
from lmprefs.pipeline.reward_model import reward_logger
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.task import Task, setup_eval_task
from lmprefs.recipes.best_of_n import best_of_n_arm
from lmprefs.recipes.compare_arms import (
    BETA0_KINDS,
    DEFAULT_EVAL_QUERIES,
    NEEDS_RM,
    OFFLINE_DPO,
    ONLINE_DPO,
    PPO_FAMILY,
    Plan,
    arm_list,
)
from lmprefs.recipes.compare_dpo import check_online, dpo_arm, online_dpo_arm
from lmprefs.recipes.compare_lengths import check_begun, is_beta0, resolve_lengths
from lmprefs.recipes.compare_report import plot_compare, write_report
from lmprefs.recipes.experiment import R, Results, seed_key, summarize_seeds, train_arm, true_reward_fn
from lmprefs.recipes.kl_frontier import frontier_scores, save_frontier
from lmprefs.recipes.matched import check_reach, matched_kl


def run_compare(cfg: Config, run_dir: Path, plan: Plan, on_start: Callable[[], None] | None = None) -> dict:
    """Every arm of `plan` over plan.seeds seeds (the reward model is one, trained with the first), evaluated on the
    first plan.n_eval held-out queries. on_start runs once every input has been checked, before anything is
    written. Returns results.json's data, the figure and the report."""
    true_name = cfg.labels.labeler
    true_fn = true_reward_fn(true_name)
    cfg = R(cfg, labels=R(cfg.labels, num_train=plan.labels or cfg.labels.num_train))
    t, n_eval = setup_eval_task(cfg, plan.n_eval, DEFAULT_EVAL_QUERIES)
    plan = dataclasses.replace(plan, n_eval=n_eval)
    res = Results(run_dir)
    store_path = _check_store(t, plan, run_dir, res)
    plan = dataclasses.replace(plan, lengths=resolve_lengths(plan.lengths, plan.arms, cfg.ppo.num_updates,
                                                             "ppo.total_episodes / ppo.batch_size"))  # fmt: skip
    begun = [seed_key(k, s) for k in plan.arms if is_beta0(k) for s in range(plan.seeds)
             if (run_dir / seed_key(k, s) / "run.json").is_file()]  # fmt: skip
    check_begun(res.data, plan.lengths, begun)
    check_reach(res.data, arm_list(plan), plan.arms, plan.seeds, plan.match_kl)
    check_online(cfg, plan.arms)
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
    elif kind in OFFLINE_DPO:
        cfg = R(cfg, dpo=R(cfg.dpo, beta=value, loss=kind.removeprefix("dpo-")))
        put(*dpo_arm(cfg, run_dir / key, key, store_path, plan, true_fn))
    elif kind == ONLINE_DPO:
        put(*online_dpo_arm(R(cfg, dpo=R(cfg.dpo, beta=value)), run_dir / key, key, rm_dir, plan, true_fn))
    else:
        put(*best_of_n_arm(cfg, rm_dir, key, int(value), plan, true_fn))


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
