"""What `experiment compare` costs before it runs (`plan_compare`, behind its `--plan`): the seconds of each of its
stages from their matmul FLOPs (lmprefs.recipes.plan's counts) at the GFLOP/s the SmolLM2 quickstart's stages
reached, and DPO's at the rate a SmolLM2 train-dpo run reached (DPO_GFLOPS); online DPO, which samples, scores and
trains as PPO does, at PPO's rate. An estimate, not a measurement."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from lmprefs.config import Config
from lmprefs.models import flops as F
from lmprefs.recipes.compare_arms import BETA0_KINDS, OFFLINE_DPO, ONLINE_DPO, PPO_FAMILY, Plan
from lmprefs.recipes.plan import MEASURED_GFLOPS, MODEL_LOAD_S, Counts, Passes, Shape, prefix_cache_bytes, stage_flops

R = dataclasses.replace

# GFLOP/s of `train-dpo quickstart --labels.num-train 256` on the 2-core AMD EPYC in bf16 (docs/results.md, "DPO on
# SmolLM2: the frozen blocks once"): 94.5 s in all, of them about 5 s loading the model and the store; dpo_flops
# counts 21,045 GFLOP for that run (256 labels trained, 105 held out, 4 responses each)
DPO_GFLOPS = 21_045 / 89.5


class Sizes(NamedTuple):
    """What the plan needs beyond the config and Plan: the store's questions (0: --db, nothing sampled), the labels
    trained on and held out, and the held-out queries evaluated."""

    questions: int
    labels_train: int
    labels_heldout: int
    n_eval: int


def dpo_flops(cfg: Config, facts: F.ModelFacts, shape: Shape, train: int, held: int) -> int:
    """`train_dpo` on `train` labels (held: held out) of S responses each: the frozen blocks once over every row
    (LoRA in the top blocks, within PREFIX_CACHE_BYTES; else every pass runs them), the reference's log-probabilities
    once, the held-out labels' before and after training, and dpo.epochs passes of forward and backward."""
    n = Counts(shape.q_len, shape.train_queries, 0, 1, 0, train, held, 0, shape.shared_queries, False)
    p = Passes(cfg, facts, n)
    S, T, ad = p.S, p.T, p.ad
    rows = (train + held) * S
    cached = p.start > 0 and rows * p.L * facts.d * 4 <= prefix_cache_bytes()
    lo = p.start if cached else 0

    def logprobs(labels: int, adapter) -> int:  # log pi(y|x) of every response: from the prefix up, the LM head
        return (F.trunk_flops(facts, p.policy_qr(labels, S), lo, None, adapter, p.policy(labels * S))
                + F.lm_head_flops(facts, labels * S * T))  # fmt: skip

    epochs = cfg.dpo.epochs * train
    head = F.lm_head_flops(facts, epochs * S * T)
    return ((F.trunk_flops(facts, p.qr(train + held, S), 0, p.start) if cached else 0)
            + logprobs(train + held, None) + 2 * logprobs(held, ad)
            + p.fwd_bwd(p.policy_qr(epochs, S), lo, ad, p.policy(epochs * S))
            + head + F.head_backward(head, ad is None)
            + (F.merge_flops(facts, ad) if ad else 0))  # fmt: skip


def online_dpo_flops(cfg: Config, facts: F.ModelFacts, shape: Shape) -> int:
    """One online-DPO arm as compare runs it (compare_dpo.online_config): ppo.num_updates steps, each sampling
    ppo.batch_size responses from the policy, S = dpo.online_samples to each of B / S queries (keeping no frozen
    prefix), the reward model scoring every one whole, then the reference's log-probabilities and the policy's
    forward and backward over them, each query once for its S samples; with LoRA the adapter merged at the end."""
    n = Counts(shape.q_len, shape.train_queries, 0, 1, 0, 0, 0, cfg.ppo.num_updates, shape.shared_queries, False)
    p = Passes(cfg, facts, n)
    B, S, ad = cfg.ppo.batch_size, cfg.dpo.online_samples, p.ad
    segments, head = p.policy_qr(B // S, S), F.lm_head_flops(facts, B * p.T)
    step = (p.sample(B // S, S, ad)
            + F.trunk_flops(facts, F.plain_segments(B, p.L), 0, None, ad, p.reward(B)) + F.scalar_head_flops(facts, B)
            + F.trunk_flops(facts, segments, 0, read=p.policy(B)) + head
            + p.fwd_bwd(segments, 0, ad, p.policy(B)) + head + F.head_backward(head, ad is None))  # fmt: skip
    return cfg.ppo.num_updates * step + (F.merge_flops(facts, ad) if ad else 0)


def plan_compare(cfg: Config, facts: F.ModelFacts, shape: Shape, plan: Plan, n: Sizes, *,
                 rates: dict[str, float] | None = None, dpo_rate: float = DPO_GFLOPS,
                 load_s: float = MODEL_LOAD_S) -> list[dict]:  # fmt: skip
    """[{stage, runs, gflop, seconds}] of `experiment compare` with `plan` (its lengths resolved): the store's
    questions sampled and labeled once, the frontier's samples of rho once, one reward model; per seed each
    PPO-family kind's run per KL coefficient (a beta-0 kind's one run), each DPO kind's per dpo.beta (offline
    and online), each best-of-n n's samples and their scores; and every trained arm's evaluation (a beta-0 run's at
    each of plan.lengths)."""
    rates = rates or MEASURED_GFLOPS
    T = cfg.task.response_length
    counts = Counts(shape.q_len, shape.train_queries, n.n_eval, plan.eval_samples, n.questions, n.labels_train,
                    n.labels_heldout, cfg.ppo.num_updates, shape.shared_queries, labeling_prefixes=False)  # fmt: skip
    base = stage_flops(cfg, facts, counts)
    rows: list[dict] = []

    def row(stage: str, runs: int, flops: float, rate: float) -> None:
        rows.append({"stage": stage, "runs": runs, "gflop": flops / 1e9, "seconds": flops / 1e9 / rate})

    ppo_kinds = [k for k in plan.arms if k in PPO_FAMILY or k in BETA0_KINDS]
    dpo_kinds = [k for k in plan.arms if k in OFFLINE_DPO]
    online = plan.seeds * len(plan.dpo_betas) if ONLINE_DPO in plan.arms else 0
    bon = plan.best_of if "best-of-n" in plan.arms else ()
    runs = {k: plan.seeds * (1 if k in BETA0_KINDS else len(plan.coefs(k))) for k in ppo_kinds}
    # an online arm loads its task, the reward model and the task it is evaluated in
    loads = 1 + sum(runs.values()) + plan.seeds * (2 * len(dpo_kinds) * len(plan.dpo_betas) + len(bon)) + 3 * online
    rows.append({"stage": "model loads", "runs": loads, "gflop": 0.0, "seconds": loads * load_s})
    if n.questions:
        row(f"label {n.questions} questions", 1, sum(base["sample and label"].values()), rates["sample and label"])
    frontier = F.sample_flops(facts, n.n_eval, shape.q_len, T, plan.samples, static=cfg.run.kv_cache != "dynamic")
    row(f"frontier: {n.n_eval} queries x {plan.samples} samples of rho", 1, frontier, rates["evaluate initial"])
    if ppo_kinds or bon or online:
        row(f"reward model, {n.labels_train} labels", 1, sum(base["train reward model"].values()),
            rates["train reward model"])  # fmt: skip
    for kind in ppo_kinds:
        ppo = R(cfg.ppo, **PPO_FAMILY[BETA0_KINDS.get(kind, kind)])
        flops = sum(stage_flops(R(cfg, ppo=ppo), facts, counts)["PPO"].values())
        knob = "kl_coef 0" if kind in BETA0_KINDS else f"{len(plan.coefs(kind))} kl_coef"
        row(f"{kind}, {knob}, {cfg.ppo.num_updates} updates of {cfg.ppo.batch_size}", runs[kind],
            runs[kind] * flops, rates["PPO"])  # fmt: skip
    dpo_runs = plan.seeds * len(dpo_kinds) * len(plan.dpo_betas)
    if dpo_runs:
        row(f"DPO: {','.join(dpo_kinds)}, {len(plan.dpo_betas)} beta, {cfg.dpo.epochs} epoch(s)", dpo_runs,
            dpo_runs * dpo_flops(cfg, facts, shape, n.labels_train, n.labels_heldout), dpo_rate)  # fmt: skip
    if online:
        row(f"{ONLINE_DPO}, {len(plan.dpo_betas)} beta, {cfg.ppo.num_updates} steps of {cfg.ppo.batch_size}", online,
            online * online_dpo_flops(cfg, facts, shape), rates["PPO"])  # fmt: skip
    if bon:
        row(f"best-of-n, n {','.join(map(str, bon))}", plan.seeds * len(bon),
            plan.seeds * sum(_best_of_n_flops(cfg, facts, shape, n.n_eval, m * plan.eval_samples) for m in bon),
            rates["evaluate final"])  # fmt: skip
    evals = dpo_runs + online + sum(runs[k] * (len(plan.lengths) if k in BETA0_KINDS else 1) for k in ppo_kinds)
    if evals:
        row(f"evaluations, {n.n_eval} x {plan.eval_samples}", evals, evals * sum(base["evaluate final"].values()),
            rates["evaluate final"])  # fmt: skip
    return rows


def _best_of_n_flops(cfg: Config, facts: F.ModelFacts, shape: Shape, queries: int, k: int) -> int:
    """`best_of_n_policy`: k samples of rho per query, every one scored whole by the reward model (last token)."""
    L, ad = shape.q_len + cfg.task.response_length, F.Adapters.from_lora(facts, cfg.lora)
    rows = queries * k
    return (F.sample_flops(facts, queries, shape.q_len, cfg.task.response_length, k,
                           static=cfg.run.kv_cache != "dynamic")
            + F.trunk_flops(facts, F.plain_segments(rows, L), 0, None, ad, (rows, L, 1))
            + F.scalar_head_flops(facts, rows))  # fmt: skip
