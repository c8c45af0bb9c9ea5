"""What a run costs before it runs: the matmul FLOPs of each stage of a quickstart-shaped run (`stage_flops`, which
`benchmarks/roofline.py` divides by measured seconds) and, from them and the GFLOP/s each stage reached when it was
measured, the seconds of each stage of `experiment mock-sentiment` (`plan_mock_sentiment`, behind its `--plan`) and of
`experiment label-efficiency` (`plan_label_efficiency`).

The rates are those the roofline measured for the SmolLM2 quickstart on a 2-core AMD EPYC in bf16 (docs/results.md,
"The quickstart today, against its floor"); on another machine or model they are a guess, and every figure the
planner prints is an estimate, not a measurement. Only this module's stage_flops needs torch (lazily, for the
reward model's cache bound); the plan itself is arithmetic on a config and a model's shape.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from lmprefs.config import Config, label_type_shape
from lmprefs.models import flops as F


class Counts(NamedTuple):
    """What the FLOP count needs of a run beyond its config: the shapes and sizes it ran at."""

    q_len: int
    """Tokens of a formatted query: prefix + task.query_length + suffix (padded rows run like real ones)."""
    train_queries: int
    eval_queries: int
    eval_samples: int
    questions: int
    """Best-of-N questions sampled for labeling: labels.num_train / (1 - labels.heldout_fraction), rounded up."""
    labels_train: int
    labels_heldout: int
    updates: int
    shared_queries: bool = True
    """Whether the model's attention lets a question's samples share one pass of its query (SDPA:
    trunk.shares_queries); the sampler shares it whatever the attention."""
    labeling_prefixes: bool = True
    """Whether the reward model takes its labels' frozen prefixes from the labeling pass (the quickstart:
    collect_labels with keep_prefixes) rather than computing them."""


def stage_flops(cfg, facts, n: Counts) -> dict[str, dict[str, int]]:
    """{stage: {part: FLOPs}}: the matmul FLOPs of each stage of `run_quickstart` (lmprefs/recipes/quickstart.py) for
    config `cfg`, model `facts` (lmprefs.models.flops.ModelFacts) and the run's sizes `n`, as the code runs them:

    - evaluate initial / final: `evaluate_policy` samples eval_samples responses per held-out query (one prefill per
      query); the final one also runs the reference (adapters off) on them for the KL, each query once, on the
      blocks above the sampler's frozen prefix;
    - sample and label: `collect_labels` samples best-of-N questions, one prefill per question, keeping the frozen
      prefix of their rows (n.labeling_prefixes);
    - train reward model: `train_reward_model` samples train_reward.normalize_samples responses and scores them
      before and after training, evaluates the held-out labels before and after (one pass per question's query),
      runs the frozen blocks below the LoRA adapters once for all epochs (`label_prefixes`, when there are several
      epochs and it fits PREFIX_CACHE_BYTES; not at all when the labeling pass kept them, and the held-out labels
      then start from them too) and trains the adapted blocks (or the whole model) for its epochs;
    - PPO: per update, `make_rollout` samples with the policy keeping the frozen prefix (a compiled sampler keeps
      none: the rollout then runs it), reads the values from the sampler's hidden states (a separate value model
      runs its own forward), runs the reference and the reward model on the blocks above the prefix, then
      noptepochs passes of forward and backward over the batch; at the end the policy's adapters are merged for
      its export.
    """
    p = Passes(cfg, facts, n)
    m = n.eval_samples
    out: dict[str, dict[str, int]] = {"assets and model": {}}
    out["evaluate initial"] = {"sample": p.sample(n.eval_queries, m)}
    out["sample and label"] = {"sample": p.sample(n.questions, p.S, keep=n.labeling_prefixes)}
    out["train reward model"] = _reward_model_flops(p, prefix_cache_bytes())
    out["PPO"] = _ppo_flops(p)
    ref_lo, rows, segments = p.start if p.kept else 0, n.eval_queries * m, p.policy_qr(n.eval_queries, m)
    out["evaluate final"] = {"sample": p.sample(n.eval_queries, m, p.ad, keep=True),
                             "reference": F.trunk_flops(facts, segments, ref_lo, read=p.policy(rows))
                             + F.lm_head_flops(facts, rows * p.T)}  # fmt: skip
    return out


class Passes:
    """The shapes of one run and the passes stage_flops counts at them."""

    def __init__(self, cfg, facts: F.ModelFacts, n: Counts):
        self.cfg, self.facts, self.n = cfg, facts, n
        self.T, self.Q = cfg.task.response_length, n.q_len
        self.L = self.Q + self.T
        self.read_T = F.response_columns(self.T)  # the response's columns a forward reading `policy` runs
        self.static = cfg.run.kv_cache != "dynamic"
        self.S = label_type_shape(cfg.labels.type)[1]
        self.ad = F.Adapters.from_lora(facts, cfg.lora)  # the active adapter of the policy, value and reward model
        self.start = self.ad.start if self.ad else 0  # blocks below run once per batch (the frozen prefix)
        run = cfg.run
        compiled = run.compile == "on" or (run.compile == "auto" and facts.cuda and self.static)
        self.kept = self.start > 0 and not compiled  # the sampler keeps the frozen prefix it computes

    def sample(self, queries: int, repeats: int, adapter=None, *, keep: bool = False) -> int:
        """Sampling, keeping the frozen prefix (`keep`) where the sampler can."""
        return F.sample_flops(self.facts, queries, self.Q, self.T, repeats, static=self.static, adapter=adapter,
                              prefix_depth=self.start if keep and self.kept else 0)  # fmt: skip

    def policy(self, rows: int) -> F.Read:
        """A policy's or value head's reads: the T positions that predict the response, of rows run without their
        last token (`policy_rows`)."""
        return rows, self.Q + self.read_T, self.T

    def policy_rows(self, rows: int) -> list:
        """The rows of a forward that reads `policy`: query and response but its last token."""
        return F.plain_segments(rows, self.Q + self.read_T)

    def policy_qr(self, queries: int, repeats: int) -> list:
        """`qr` for a forward that reads `policy`."""
        return self.qr(queries, repeats, self.read_T)

    def reward(self, rows: int) -> F.Read:
        """A reward model's: the last token."""
        return rows, self.L, 1

    def qr(self, queries: int, repeats: int, t_len: int | None = None) -> list:
        """Queries answered by `repeats` responses each, of t_len tokens (default: the whole response)."""
        t = self.T if t_len is None else t_len
        return F.query_response_segments(queries, self.Q, t, repeats, shared=self.n.shared_queries)

    def fwd_bwd(self, segments: list, lo: int, adapter, read: F.Read) -> int:
        """A training forward from block lo reading `read` and its backward (adapter: the one that trains; None:
        every weight)."""
        return (F.trunk_flops(self.facts, segments, lo, None, adapter, read)
                + F.trunk_backward(self.facts, segments, lo, None, adapter, read))  # fmt: skip


def _reward_model_flops(p: Passes, cache_bytes: int) -> dict[str, int]:
    """A reward model's stages, or an ensemble's (train_reward.ensemble K): K members scoring, evaluating and
    training, the normalization samples drawn once, and with LoRA one frozen prefix for all of them over the
    training and held-out rows, and the held-out evaluation of their mean."""
    cfg, facts, n, ad, S, L, start = p.cfg, p.facts, p.n, p.ad, p.S, p.L, p.start
    tr = cfg.train_reward
    K = tr.ensemble
    rm: dict[str, int] = {}
    norms = int(tr.normalize_before) + int(tr.normalize_after)
    n_norm = min(tr.normalize_samples, n.train_queries)
    if norms:  # the reward model scores them from the sampling pass's frozen prefix (normalize)
        keep = p.kept and cfg.run.parallel != "fsdp"
        rm["normalize: sample"] = norms * p.sample(n_norm, 1, keep=keep)
        rm["normalize: score"] = K * norms * (F.trunk_flops(facts, F.plain_segments(n_norm, L),
                                                            start if keep else 0, None, ad, p.reward(n_norm))
                                              + F.scalar_head_flops(facts, n_norm))  # fmt: skip
    labeled = n.labeling_prefixes and p.kept  # the labeling pass kept every labeled row's frozen prefix
    rows = n.labels_train + (n.labels_heldout if K > 1 else 0)  # an ensemble's prefix covers the held-out rows too
    fits = start > 0 and rows * S * L * facts.d * 4 <= cache_bytes
    cached = labeled or ((tr.epochs > 1 or K > 1) and fits)
    if n.labels_heldout:
        held = start if labeled or (K > 1 and cached) else 0
        rm["held-out evaluation"] = (2 * K + (K if K > 1 else 0)) * (
            F.trunk_flops(facts, p.qr(n.labels_heldout, S), held, None, ad, p.reward(n.labels_heldout * S))
            + F.scalar_head_flops(facts, n.labels_heldout * S))  # fmt: skip
    if cached and not labeled:
        rm["frozen prefix, once"] = F.trunk_flops(facts, p.qr(rows, S), 0, start)
    # under FSDP a question's samples are repeated rows (reward.train_epoch); in one process the quickstart shares
    train_segments = (p.qr(n.labels_train, S) if cfg.run.parallel != "fsdp"
                      else F.plain_segments(n.labels_train * S, L))  # fmt: skip
    head = F.scalar_head_flops(facts, n.labels_train * S)
    rm["training"] = K * tr.epochs * (p.fwd_bwd(train_segments, start if cached else 0, ad,
                                                p.reward(n.labels_train * S)) + head + F.head_backward(head, True))
    if ad and cfg.lora.merged_reward_model:
        rm["export: merge adapter"] = K * F.merge_flops(facts, ad)
    return rm


def _ppo_flops(p: Passes) -> dict[str, int]:
    """PPO's stage; under a group estimator (ppo.rloo_k samples of each of B / k queries) the sampler and the
    reference run each query once for its k samples and no value is read."""
    cfg, facts, ad, T, L, start = p.cfg, p.facts, p.ad, p.T, p.L, p.start
    B, P = cfg.ppo.batch_size, cfg.ppo.noptepochs * cfg.ppo.batch_size  # rollout rows; rows trained per update
    k = cfg.ppo.samples_per_query
    rows, read_rows = F.plain_segments(B, L), p.policy_rows(B)
    grouped = p.policy_qr(B // k, k) if k > 1 else read_rows
    separate = cfg.ppo.value_model == "separate" and k == 1
    # a separate value model: an adapter above the prefix, or with full fine-tuning a whole trunk of its own
    value_lo = start if ad else 0
    ppo = {
        "rollout: sample": p.sample(B // k, k, ad, keep=True),
        "rollout: frozen prefix": F.trunk_flops(facts, rows, 0, start) if start and not p.kept else 0,
        "rollout: values": (F.scalar_head_flops(facts, B * T) if k == 1 else 0)
        + (F.trunk_flops(facts, read_rows, value_lo, None, ad, p.policy(B)) if separate else 0),
        "rollout: reference": F.trunk_flops(facts, grouped, start, read=p.policy(B)) + F.lm_head_flops(facts, B * T),
        "rollout: reward model": F.trunk_flops(facts, rows, start, None, ad, p.reward(B))
        + F.scalar_head_flops(facts, B),
    }
    train = p.policy_rows(P)
    lm_head, v_head = F.lm_head_flops(facts, P * T), F.scalar_head_flops(facts, P * T)
    ppo["PPO epochs"] = (p.fwd_bwd(train, start, ad, p.policy(P)) + lm_head + F.head_backward(lm_head, ad is None)
                         + v_head + F.head_backward(v_head, True)
                         + (p.fwd_bwd(train, value_lo, ad, p.policy(P)) if separate else 0))  # fmt: skip
    ppo = {k: v * p.n.updates for k, v in ppo.items() if v}
    if ad:
        ppo["export: merge adapters"] = F.merge_flops(facts, ad)
    return ppo


# GFLOP/s each quickstart stage reached (docs/results.md, the SmolLM2 quickstart against its floor: AMD EPYC with
# AVX512-BF16, 2 cores, bf16 autocast); model loads are seconds, not FLOPs
MEASURED_GFLOPS = {"evaluate initial": 260.2, "sample and label": 255.6, "train reward model": 245.5, "PPO": 211.9,
                   "evaluate final": 265.5}  # fmt: skip
MODEL_LOAD_S = 5.0


class Shape(NamedTuple):
    """What the plan needs of the task beyond its config: a formatted query's tokens (prefix + query + suffix), the
    training queries it has, and whether a question's samples share one pass of its query (SDPA attention)."""

    q_len: int
    train_queries: int
    shared_queries: bool = True


POOL_FACTOR = 1.5  # with several seeds the store holds 1.5x the largest label count, so its arms' subsets differ


def store_questions(cfg: Config, label_counts: list[int], seeds: int) -> int:
    """Questions the label store of `experiment mock-sentiment` holds: the largest count (POOL_FACTOR times it with
    several seeds), plus the held-out fraction."""
    pool = POOL_FACTOR if seeds > 1 else 1
    return math.ceil(max(label_counts) * pool / (1 - cfg.labels.heldout_fraction))


def plan_mock_sentiment(cfg: Config, facts: F.ModelFacts, shape: Shape, label_counts: list[int], seeds: int,
                        n_eval: int, samples: int, *, rates: dict[str, float] | None = None,
                        load_s: float = MODEL_LOAD_S, share: bool = True) -> list[dict]:  # fmt: skip
    """[{stage, runs, gflop, seconds}] (gflop and seconds of all runs together) of `experiment mock-sentiment` with
    these arms, as the code shares work between them: one labeling pass and one initial evaluation for all, the
    reward models' frozen prefixes kept by the labeling pass (else, over PREFIX_CACHE_BYTES, once over the union of
    their labels: at most the store, at most seeds x the largest count), the untrained reward model's normalization
    and held-out evaluation once per seed, and per arm
    and seed a model load, its reward model (or the direct arm's normalization samples), its PPO run and its final
    evaluation. `rates`: GFLOP/s by quickstart stage (MEASURED_GFLOPS);
    `share` False: every reward model runs its own frozen prefixes (what sharing them saves)."""
    rates = rates or MEASURED_GFLOPS
    if not label_counts or min(label_counts) < 1 or seeds < 1 or n_eval < 1 or samples < 1:
        raise ValueError("label counts, seeds, evaluation queries and samples must be positive")
    questions = store_questions(cfg, label_counts, seeds)
    held = round(questions * cfg.labels.heldout_fraction)
    ad = F.Adapters.from_lora(facts, cfg.lora)
    S, L = label_type_shape(cfg.labels.type)[1], shape.q_len + cfg.task.response_length
    # the labeling pass keeps every labeled row's frozen prefix where they fit (collect_labels' bound)
    kept = share and ad is not None and questions * S * L * facts.d * 4 <= prefix_cache_bytes()

    def stages(n_labels: int) -> dict[str, dict[str, int]]:
        n = Counts(shape.q_len, shape.train_queries, n_eval, samples, questions, n_labels, held,
                   cfg.ppo.num_updates, shape.shared_queries, labeling_prefixes=kept)  # fmt: skip
        return stage_flops(cfg, facts, n)

    def row(stage: str, runs: int, flops: float, rate: str | None) -> dict:
        gflop = flops / 1e9
        seconds = gflop / rates[rate] if rate else runs * load_s
        return {"stage": stage, "runs": runs, "gflop": gflop, "seconds": seconds}

    first = stages(max(label_counts))
    rows = [row("model loads", 1 + seeds * (len(label_counts) + 1), 0, None),
            row(f"label {questions} questions", 1, sum(first["sample and label"].values()), "sample and label"),
            row("evaluate the initial policy", 1, sum(first["evaluate initial"].values()), "evaluate initial")]
    union = min(questions, seeds * max(label_counts))  # each arm's subset lies in the store
    # not kept: shared as run_mock_sentiment shares them, for several reward models that cache them, within the bound
    shared = (share and ad is not None and seeds * len(label_counts) > 1
              and "frozen prefix, once" in first["train reward model"]
              and union * S * L * facts.d * 4 <= prefix_cache_bytes())  # fmt: skip
    if shared and ad is not None:
        segs = F.query_response_segments(union, shape.q_len, cfg.task.response_length, S, shared=shape.shared_queries)
        held_gib = union * S * L * facts.d * 4 / 2**30  # fp32, kept for the whole experiment
        rows.append(row(f"frozen prefixes of {union} questions, once ({held_gib:.2f} GiB)", 1,
                        F.trunk_flops(facts, segs, 0, ad.start), "train reward model"))  # fmt: skip
    tr = cfg.train_reward
    norms = int(tr.normalize_before) + int(tr.normalize_after)
    for i, n in enumerate(label_counts):
        rm = stages(n)["train reward model"]
        own = sum(v for k, v in rm.items() if not (shared and k == "frozen prefix, once"))
        if share and i > 0 and label_type_shape(cfg.labels.type)[0] != "score":
            # the untrained model's normalization and held-out evaluation: once per seed (before_training)
            once = rm.get("normalize: sample", 0) + rm.get("normalize: score", 0)
            own -= once // max(norms, 1) * int(tr.normalize_before) + rm.get("held-out evaluation", 0) // 2
        rows.append(row(f"reward model, {n} labels", seeds, seeds * own, "train reward model"))
    ppo = stages(max(label_counts))
    per_ppo = sum(ppo["PPO"].values())
    direct = per_ppo - ppo["PPO"].get("rollout: reward model", 0)
    # the direct arm's normalization samples keep no prefix: its reward is a function of the texts
    norm = F.sample_flops(facts, min(tr.normalize_samples, shape.train_queries), shape.q_len, cfg.task.response_length,
                          1, static=cfg.run.kv_cache != "dynamic") if norms else 0  # fmt: skip
    rows.append(row("direct arm: normalization samples", seeds, seeds * norm, "evaluate initial"))
    rows.append(row(f"PPO, {cfg.ppo.num_updates} updates of {cfg.ppo.batch_size}", seeds * (len(label_counts) + 1),
                    seeds * (len(label_counts) * per_ppo + direct), "PPO"))  # fmt: skip
    rows.append(row(f"final evaluation, {n_eval} x {samples}", seeds * (len(label_counts) + 1),
                    seeds * (len(label_counts) + 1) * sum(ppo["evaluate final"].values()), "evaluate final"))
    return rows


def plan_label_efficiency(cfg: Config, facts: F.ModelFacts, shape: Shape, budgets: list[int], *, directed: int,
                          seeds: int, n_eval: int, samples: int, pool: int, held: int, members: int,
                          rates: dict[str, float] | None = None,
                          load_s: float = MODEL_LOAD_S) -> list[dict]:  # fmt: skip
    """[{stage, runs, gflop, seconds}] of `experiment label-efficiency` (lmprefs/recipes/label_efficiency.py) with
    `directed` acquisitions beside random: per seed one pool of `pool` candidates and `held` held-out questions
    sampled and labeled; per seed and acquisition the rounds' ensembles (`members` reward models each, trained on
    the labels so far, sharing the normalization samples and frozen prefix) and their scoring of the candidates
    left (the frozen prefix once, the adapted blocks per member); per arm a reward model, a PPO run and its final
    evaluation (a directed budget of one round takes random's)."""
    rates = rates or MEASURED_GFLOPS
    rnd = cfg.labels.select_round

    def stages(n_labels: int, members: int = 1) -> dict[str, dict[str, int]]:
        n = Counts(shape.q_len, shape.train_queries, n_eval, samples, pool + held, n_labels, held,
                   cfg.ppo.num_updates, shape.shared_queries, labeling_prefixes=False)  # fmt: skip
        return stage_flops(dataclasses.replace(cfg, train_reward=dataclasses.replace(cfg.train_reward,
                                                                                     ensemble=members)), facts, n)

    def row(stage: str, runs: int, flops: float, rate: str | None) -> dict:
        return {"stage": stage, "runs": runs, "gflop": flops / 1e9,
                "seconds": flops / 1e9 / rates[rate] if rate else runs * load_s}  # fmt: skip

    arms = list(budgets) + [b for b in budgets if b > rnd] * directed
    top = stages(max(budgets))
    rm = {b: sum(stages(b)["train reward model"].values()) for b in budgets}
    ad = F.Adapters.from_lora(facts, cfg.lora)
    start, S, T = ad.start if ad else 0, label_type_shape(cfg.labels.type)[1], cfg.task.response_length

    def score(q: int) -> float:  # every member scores q candidates, the frozen prefix run once for all
        segs = F.query_response_segments(q, shape.q_len, T, S, shared=shape.shared_queries)
        return (F.trunk_flops(facts, segs, 0, start) + members * (F.scalar_head_flops(facts, q * S) + F.trunk_flops(
            facts, segs, start, None, ad, (q * S, shape.q_len + T, 1))))  # fmt: skip

    asked = list(range(rnd, max(budgets), rnd))  # labels before each directed round after the first
    ens = sum(sum(stages(n, members)["train reward model"].values()) for n in asked)
    scored = sum(score(pool - n) for n in asked)
    return [row("model loads", 1 + seeds * len(arms), 0, None),
            row(f"label {pool} + {held} questions per seed", seeds, seeds * sum(top["sample and label"].values()),
                "sample and label"),
            row("evaluate the initial policy", 1, sum(top["evaluate initial"].values()), "evaluate initial"),
            row(f"directed rounds: {members}-member ensembles", seeds * directed * len(asked),
                seeds * directed * ens, "train reward model"),
            row("directed rounds: score the candidates left", seeds * directed * len(asked),
                seeds * directed * scored, "train reward model"),
            row("reward model per arm", seeds * len(arms), seeds * sum(rm[b] for b in arms), "train reward model"),
            row(f"PPO, {cfg.ppo.num_updates} updates of {cfg.ppo.batch_size}", seeds * len(arms),
                seeds * len(arms) * sum(top["PPO"].values()), "PPO"),
            row(f"final evaluation, {n_eval} x {samples}", seeds * len(arms),
                seeds * len(arms) * sum(top["evaluate final"].values()), "evaluate final")]  # fmt: skip


def prefix_cache_bytes() -> int:
    from lmprefs.training.question_prefixes import PREFIX_CACHE_BYTES  # torch: only when a plan is made

    return PREFIX_CACHE_BYTES


def format_plan(rows: list[dict], limit_s: float | None = None, basis: str | None = None) -> str:
    """The plan as a table, its total, and against `limit_s` its margin; labelled as the estimate it is, with
    `basis` saying what its rates are (default: the SmolLM2 quickstart's stages on a 2-core AMD EPYC in bf16)."""
    lines = [f"{'stage':48s} {'runs':>5s} {'GFLOP':>10s} {'seconds':>9s}"]
    lines += [f"{r['stage']:48s} {r['runs']:5d} {r['gflop']:10,.0f} {r['seconds']:9.0f}" for r in rows]
    total = sum(r["seconds"] for r in rows)
    lines.append(f"{'total (estimate)':48s} {'':5s} {sum(r['gflop'] for r in rows):10,.0f} {total:9.0f}  "
                 f"= {total / 60:.1f} min")  # fmt: skip
    if limit_s:
        lines.append(f"against {limit_s / 60:.0f} min: {'fits' if total <= limit_s else 'does not fit'}, margin "
                     f"{(limit_s - total) / limit_s:+.0%}")  # fmt: skip
    lines.append(basis or "estimated from FLOP counts at the GFLOP/s the SmolLM2 quickstart's stages reached on a "
                 "2-core AMD EPYC in bf16 (docs/results.md); not a measurement")  # fmt: skip
    return "\n".join(lines)
