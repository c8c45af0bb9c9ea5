"""`lmprefs experiment label-efficiency`: random against uncertainty-directed queries on the mock-sentiment protocol
(the simulated labeler labels.labeler is the human, its score the true reward), at several label budgets and seeds.

Per seed, one shared candidate pool: labels.pool_factor times the largest budget best-of-N questions sampled from
the initial policy on training queries of their own, and one shared set of held-out questions on other training
queries; the simulated labeler answers all of them once, when they are made (a simulated answer costs nothing), and
an arm trains only on the answers to the questions it asked, so the arms differ only in which questions they ask.

- `random` (the control, always run): a seeded permutation of the pool; a budget of b labels asks its first b.
- directed (`bald`, `spread`): rounds of labels.select_round as `lmprefs label` asks them. Round 0 is the first
  round of the random permutation (nothing to rank with yet); before each later round an ensemble of
  train_reward.ensemble members (4 when the preset has none) is trained on the labels asked so far and the round
  asks the remaining candidates it ranks highest. Budgets are nested: one sequence of rounds up to the largest
  budget, a budget b asks its first b questions, which is what a run to b alone would ask (a partial last round is
  the top of the full round's ranking). A budget of at most one round asks the random arm's questions: its result
  is the random arm's, not trained again.

Each arm (acquisition, budget, seed) trains one reward model, as a single model (train_reward.ensemble 1) for every
arm, so that the arms differ in their labels and nothing else (an ensemble's mean would also change the reward
model the policy optimizes); its held-out best-of-N accuracy is measured on the seed's held-out questions. A PPO
policy is then trained against it with the preset's PPO budget and KL setting and evaluated on held-out queries
with the true reward, as mock-sentiment's arms are. The label-efficiency ratio k (labels.efficiency) compares the
true rewards; its interval resamples seeds.

results.json is rewritten after every round and every arm; a killed run started again with its command line skips
the finished arms, continues a directed sequence from its last saved round, and resumes a killed arm (its saved
reward model, and PPO from its checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from lmprefs.config import Config
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text, crash_point
from lmprefs.labels.types import PickBest
from lmprefs.labels.types import get as get_label_type
from lmprefs.pipeline.evaluation import evaluate_arm
from lmprefs.pipeline.labeling import collect_labels, open_store
from lmprefs.pipeline.reward_model import TrainingLabels, load_examples
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.selection import Chooser, ensemble_scores, pool_size
from lmprefs.pipeline.task import Task, eval_query_count, setup_task
from lmprefs.recipes.experiment import Results, seed_key, train_arm, true_reward_fn
from lmprefs.training.comparisons import Comparisons

R = dataclasses.replace
DEFAULT_BUDGETS = (64, 128, 256, 512)
DEFAULT_EVAL_QUERIES = 256
DEFAULT_MEMBERS = 4  # the choosing ensemble's members when the preset trains single reward models
MIN_HELDOUT = 64  # held-out questions per seed at least: an accuracy from fewer moves in steps of several points


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `experiment label-efficiency` runs: label budgets (sorted), the directed acquisitions beside random,
    seeds, held-out queries for the true reward (None: 256, or all the task sets aside) and samples per query."""

    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    acquisitions: tuple[str, ...] = ("bald",)
    seeds: int = 1
    n_eval: int | None = None
    eval_samples: int = 2

    def arms(self) -> list[str]:
        """random first (a directed budget of one round takes its result), then the directed acquisitions."""
        return ["random", *self.acquisitions]


def heldout_questions(cfg: Config, budgets) -> int:
    """Held-out questions per seed: labels.heldout_fraction of a store holding the largest budget, at least
    MIN_HELDOUT."""
    hf = cfg.labels.heldout_fraction
    return max(MIN_HELDOUT, math.ceil(max(budgets) * hf / (1 - hf)))


def check_grid(t: Task, plan: Plan) -> tuple[int, int, int]:
    """(candidates, held-out questions, held-out queries) of `plan` on task t, or one line naming what cannot run."""
    cfg = t.cfg
    rnd = cfg.labels.select_round
    if max(plan.budgets) <= rnd:
        raise UserError(f"--labels {','.join(map(str, plan.budgets))}: every budget is at most labels.select_round="
                        f"{rnd}, the first round, which directed queries ask at random; give a budget above it or "
                        "a smaller labels.select_round")  # fmt: skip
    if not isinstance(get_label_type(cfg.labels.type), PickBest):
        raise UserError(f"labels.type={cfg.labels.type}: directed queries choose among best_of_N questions")
    n_eval = eval_query_count(t, plan.n_eval, "--eval-queries", DEFAULT_EVAL_QUERIES)
    pool, held = pool_size(cfg.labels, max(plan.budgets)), heldout_questions(cfg, plan.budgets)
    if pool + held > len(t.train_queries):
        raise UserError(f"--labels {max(plan.budgets)}: a shared pool of {pool} candidates (labels.pool_factor "
                        f"{cfg.labels.pool_factor:g} x {max(plan.budgets)}) and {held} held-out questions need "
                        f"{pool + held} training queries; task.query_dataset={cfg.task.query_dataset!r} has "
                        f"{len(t.train_queries)}")  # fmt: skip
    return pool, held, n_eval


def run_label_efficiency(cfg: Config, run_dir: Path, plan: Plan,
                         on_start: Callable[[], None] | None = None) -> dict:  # fmt: skip
    """Every arm of `plan` over plan.seeds seeds, then the summaries, k, the figure and the report. on_start runs
    once every input has been checked, before anything is written."""
    from lmprefs.recipes.label_efficiency_report import plot, summarize, write_report

    t = setup_task(cfg, plan.n_eval or DEFAULT_EVAL_QUERIES)
    pool, held, n_eval = check_grid(t, plan)
    plan = R(plan, n_eval=n_eval)
    res = Results(run_dir)
    sizes = res.data.get("pool", {"candidates": pool, "heldout": held})
    if sizes["candidates"] < pool:
        raise UserError(f"--labels {max(plan.budgets)}: the pools of {run_dir} hold {sizes['candidates']} "
                        f"candidates, not the {pool} it needs; keep the experiment's --labels, or start another "
                        "--run-dir")  # fmt: skip
    if on_start:
        on_start()
    run_dir.mkdir(parents=True, exist_ok=True)
    res.save("pool", sizes)
    true_name = cfg.labels.labeler
    if "initial" not in res.data:
        print("[initial] evaluating the initial policy", flush=True)
        res.save("initial", evaluate_arm(t, None, t.heldout_queries[:n_eval], true_reward_fn(true_name),
                                         plan.eval_samples, cfg.run.seed + 5, "initial policy"))  # fmt: skip
    for s in range(plan.seeds):
        seed = cfg.run.seed + s
        ts = Task(**{**t.__dict__, "cfg": R(cfg, run=R(cfg.run, seed=seed))})
        pool_data = seed_pool(ts, run_dir, s, sizes, res)
        for acq in plan.arms():
            order = pool_data.random_order if acq == "random" else directed_order(ts, pool_data, acq, plan, res,
                                                                                    run_dir, s)  # fmt: skip
            for b in plan.budgets:
                key = seed_key(f"{acq}-{b}", s)
                if key in res.data:
                    print(f"[{key}] done: accuracy {res.data[key]['accuracy']:.3f}, true reward "
                          f"{res.data[key]['mean']:+.4f}", flush=True)  # fmt: skip
                elif acq != "random" and b <= cfg.labels.select_round:  # the same questions as random's
                    res.save(key, res.data[seed_key(f"random-{b}", s)] | {"acquisition": acq,
                                                                         "same_as": f"random-{b}"})  # fmt: skip
                else:
                    res.save(key, run_arm(ts, pool_data, order[:b], run_dir / key, key, acq, plan))
    res.save("summary", summarize(res.data, plan, cfg))
    fig = plot(run_dir, res.data, plan)
    report = write_report(run_dir, res.data, plan, cfg)
    return {"results": res.data, "figure": fig, "report": report}


@dataclasses.dataclass
class SeedPool:
    """A seed's shared questions: every labeled question of its store as tensors (`data`, one row per item), the
    row of each item id, the pool's item ids in the random arm's order, and the held-out questions' rows."""

    data: Comparisons
    row: dict[int, int]
    random_order: list[int]
    held_rows: torch.Tensor

    def labels(self, items: list[int]) -> TrainingLabels:
        """The training labels of these items (in this order) and the seed's held-out questions."""
        rows = torch.tensor([self.row[i] for i in items], dtype=torch.long)
        return TrainingLabels(self.data[rows], self.data[self.held_rows], "the seed's shared held-out questions", {})


def seed_pool(t: Task, run_dir: Path, s: int, sizes: dict, res: Results) -> SeedPool:
    """Seed s's store (made, or remade when a killed run left it unfinished): its candidate pool and held-out
    questions on disjoint training queries, each labeled once by labels.labeler."""
    seed, key = t.cfg.run.seed, seed_key("questions", s)
    store_dir = run_dir / key
    if key not in res.data:
        shutil.rmtree(store_dir, ignore_errors=True)  # a killed run's part-made store: made again, the same
        store_dir.mkdir(parents=True)
        perm = torch.randperm(len(t.train_queries), generator=torch.Generator().manual_seed(seed + 31))
        P, H = sizes["candidates"], sizes["heldout"]
        print(f"[{key}] sampling and labeling {P} candidate and {H} held-out questions with {t.cfg.labels.labeler}",
              flush=True)  # fmt: skip
        with open_store(store_dir / "labels.sqlite") as store:
            a = collect_labels(t, store, P, source="experiment", batch="pool", seed=seed,
                               queries=t.train_queries[perm[:P]])  # fmt: skip
            b = collect_labels(t, store, H, source="experiment", batch="heldout", seed=seed + 104729,
                               queries=t.train_queries[perm[P : P + H]])  # fmt: skip
        res.save(key, {"candidates": P, "heldout": H, "seconds": a["seconds"] + b["seconds"]})
    with open_store(store_dir / "labels.sqlite") as store:
        data = load_examples(t.cfg, store, t.tok)
        batch = store.item_batches("")
    row = {int(i): r for r, i in enumerate(data.items.tolist())}
    pool_items = sorted(i for i, bt in batch.items() if bt == "pool")
    held_rows = torch.tensor([row[i] for i in sorted(i for i, bt in batch.items() if bt == "heldout")])
    order = torch.randperm(len(pool_items), generator=torch.Generator().manual_seed(seed + 53)).tolist()
    return SeedPool(data, row, [pool_items[i] for i in order], held_rows)


def chooser_config(cfg: Config, acq: str) -> Config:
    """The config of a directed arm's choosing ensemble: labels.select acq, train_reward.ensemble members (at least
    2: DEFAULT_MEMBERS when the preset has one)."""
    members = cfg.train_reward.ensemble if cfg.train_reward.ensemble > 1 else DEFAULT_MEMBERS
    return R(cfg, labels=R(cfg.labels, select=acq), train_reward=R(cfg.train_reward, ensemble=members))


def directed_order(t: Task, pool: SeedPool, acq: str, plan: Plan, res: Results, run_dir: Path, s: int) -> list[int]:
    """The pool's item ids in the order acquisition `acq` asks them, up to the largest budget, in rounds; each round
    saved to results.json as it is chosen, so a killed run goes on from the next."""
    cfg = chooser_config(t.cfg, acq)
    ct = Task(**{**t.__dict__, "cfg": cfg})
    key, rnd, most = seed_key(f"order-{acq}", s), cfg.labels.select_round, max(plan.budgets)
    state = res.data.get(key, {"items": [], "rounds": []})
    while len(state["items"]) < most:
        r, asked = len(state["rounds"]), state["items"]
        want = min(rnd, most - len(asked))
        if r == 0:
            chosen, row = pool.random_order[:want], {"round": 0, "select": "random", "questions": want}
        else:
            print(f"[{key}] round {r}: an ensemble of {cfg.train_reward.ensemble} on {len(asked)} labels ranks "
                  f"the {len(pool.random_order) - len(asked)} candidates left", flush=True)  # fmt: skip
            ens, summary = train_reward_model(ct, None, run_dir / seed_key(f"ensemble-{acq}", s),
                                              labels=pool.labels(asked))  # fmt: skip
            chooser = Chooser(cfg.labels, ensemble_scores(ens.eval(), t.ctx), f"{acq} of the round's ensemble")
            seen = set(asked)
            left = sorted(i for i in pool.random_order if i not in seen)
            rows = torch.tensor([pool.row[i] for i in left], dtype=torch.long)
            pick, scores = chooser(pool.data.queries[rows], pool.data.samples[rows], want)
            chosen = [left[i] for i in pick.tolist()]
            row = {"round": r, "select": acq, "questions": want, "labels_before": len(asked),
                   "acquisition_asked": float(scores[pick].mean()), "acquisition_pool": float(scores.mean()),
                   "ensemble_heldout_accuracy": summary.get("heldout/accuracy")}  # fmt: skip
            del ens
        state = {"items": asked + chosen, "rounds": [*state["rounds"], row]}
        res.save(key, state)
        crash_point("label-efficiency:round")
    return state["items"]


def run_arm(t: Task, pool: SeedPool, items: list[int], arm_dir: Path, key: str, acq: str, plan: Plan) -> dict:
    """One arm: a single reward model on `items`' labels (kept in arm_dir once trained), its held-out accuracy on
    the seed's held-out questions, and a PPO run against it (train_arm: resumed from its checkpoint)."""
    # one reward model, and no selection in its PPO run: the arm's questions are asked already
    cfg = R(t.cfg, train_reward=R(t.cfg.train_reward, ensemble=1), labels=R(t.cfg.labels, select="random"))
    rm_dir, done = arm_dir / "reward_model", arm_dir / "reward_model.json"
    if done.is_file():
        summary = json.loads(done.read_text())
    else:
        print(f"[{key}] reward model on {len(items)} {acq} labels", flush=True)
        shutil.rmtree(rm_dir, ignore_errors=True)
        rm, full = train_reward_model(Task(**{**t.__dict__, "cfg": cfg}), None, rm_dir, labels=pool.labels(items))
        del rm
        summary = {k: v for k, v in full.items() if isinstance(v, int | float)}
        atomic_write_text(done, json.dumps(summary))
    crash_point("label-efficiency:reward-model")
    acc = summary["heldout/accuracy"]
    print(f"[{key}] held-out accuracy {acc:.3f} on {summary['labels_heldout']} questions", flush=True)
    ppo_cfg = R(cfg, rewards=R(cfg.rewards, trained_model=str(rm_dir)))
    assert plan.n_eval is not None  # set by run_label_efficiency
    ev = train_arm(ppo_cfg, arm_dir / "ppo", key, f"{len(items)} {acq} labels", plan.n_eval, plan.eval_samples,
                   cfg.labels.labeler)  # fmt: skip
    return ev | {"accuracy": acc, "labels": len(items), "acquisition": acq, "seed": cfg.run.seed,
                 "reward_model": summary}  # fmt: skip
