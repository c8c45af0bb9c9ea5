"""`experiment overoptimization --plan`: each stage's seconds estimated from FLOP counts (lmprefs.recipes.plan's
stage_flops at the quickstart's measured GFLOP/s), as lmprefs/recipes/overoptimization.py runs them."""

from __future__ import annotations

import dataclasses

from lmprefs.config import Config
from lmprefs.models import flops as F
from lmprefs.recipes.plan import MEASURED_GFLOPS, MODEL_LOAD_S, Counts, Shape, stage_flops


def plan_overoptimization(cfg: Config, facts: F.ModelFacts, shape: Shape, plan, *, pool: int, held: int,
                          rates: dict[str, float] | None = None,
                          load_s: float = MODEL_LOAD_S) -> list[dict]:  # fmt: skip
    """[{stage, runs, gflop, seconds}] of `plan` (an overoptimization.Plan): per seed one store of pool + held
    questions labeled and (with bon) the initial policy's plan.samples samples on each of plan.queries held-out
    queries drawn; per seed and label count an ensemble of plan.members reward models, which scores those samples;
    per PPO arm a model load, a PPO run (an ensemble proxy scores each rollout with every member) and its final
    evaluation."""
    rates = rates or MEASURED_GFLOPS
    K, T = plan.members, cfg.task.response_length
    ad = F.Adapters.from_lora(facts, cfg.lora)
    start = ad.start if ad else 0

    def stages(n_labels: int, members: int = 1) -> dict[str, dict[str, int]]:
        n = Counts(shape.q_len, shape.train_queries, plan.queries, plan.eval_samples, pool + held, n_labels, held,
                   cfg.ppo.num_updates, shape.shared_queries, labeling_prefixes=False)  # fmt: skip
        tr = dataclasses.replace(cfg.train_reward, ensemble=members)
        return stage_flops(dataclasses.replace(cfg, train_reward=tr), facts, n)

    def row(stage: str, runs: int, flops: float, rate: str | None) -> dict:
        return {"stage": stage, "runs": runs, "gflop": flops / 1e9,
                "seconds": flops / 1e9 / rates[rate] if rate else runs * load_s}  # fmt: skip

    seeds, counts = plan.seeds, list(plan.labels)
    top = stages(max(counts))
    ppo_arms = [p for m, p in plan.arms() if m == "ppo"]
    rows = [row("model loads", 1 + seeds * len(counts) * len(ppo_arms), 0, None),
            row(f"label {pool} + {held} questions per seed", seeds, seeds * sum(top["sample and label"].values()),
                "sample and label"),
            row("evaluate the initial policy", 1, sum(top["evaluate initial"].values()), "evaluate initial"),
            row(f"reward models: {K}-member ensembles", seeds * len(counts),
                seeds * sum(sum(stages(n, K)["train reward model"].values()) for n in counts),
                "train reward model")]  # fmt: skip
    if "bon" in plan.methods:
        q, m = plan.queries, plan.samples
        segs = F.query_response_segments(q, shape.q_len, T, m, shared=shape.shared_queries)
        read = (q * m, shape.q_len + T, 1)
        score = (F.trunk_flops(facts, segs, 0, start) + K * (F.trunk_flops(facts, segs, start, None, ad, read)
                                                             + F.scalar_head_flops(facts, q * m)))  # fmt: skip
        sample = F.sample_flops(facts, q, shape.q_len, T, m, static=cfg.run.kv_cache != "dynamic")
        runs = seeds * len(counts)
        rows.append(row(f"best-of-n pool: sample {q} x {m}", seeds, seeds * sample, "evaluate initial"))
        rows.append(row(f"best-of-n pool: score by {K} members", runs, runs * score, "train reward model"))
    if ppo_arms:
        ppo = top["PPO"]
        rm = ppo.get("rollout: reward model", 0)
        per = sum(ppo.values()) - rm
        runs = seeds * len(counts)
        flops = runs * sum(per + rm * (1 if p == "single" else K) for p in ppo_arms)
        rows.append(row(f"PPO, {cfg.ppo.num_updates} updates of {cfg.ppo.batch_size}", runs * len(ppo_arms), flops,
                        "PPO"))  # fmt: skip
        rows.append(row(f"final evaluation, {plan.queries} x {plan.eval_samples}", runs * len(ppo_arms),
                        runs * len(ppo_arms) * sum(top["evaluate final"].values()), "evaluate final"))  # fmt: skip
    return rows
