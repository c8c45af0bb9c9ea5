"""`lmprefs experiment overoptimization`: its flags, their checks, --plan and its printed verdict
(lmprefs.recipes.overoptimization)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from lmprefs.cli.common import parse_numbers, random_questions_only
from lmprefs.config.overrides import split_items
from lmprefs.errors import UserError

FLAGS = ("labels", "seeds", "eval_samples", "queries", "samples", "members", "proxies", "methods", "kl_coef",
         "uwo_lambda")  # fmt: skip


def add_flags(p: argparse.ArgumentParser) -> None:
    """overoptimization's own flags; --labels (its counts N, default 64,256), --seeds, --queries (Q, held-out
    queries), --samples (M, best-of-n's pool per query), --eval-samples and --plan are shared."""
    g = p.add_argument_group("overoptimization (also --labels N1,N2,...: the proxies' label counts, default 64,256; "
                             "--queries Q and --samples M: the best-of-n pool of M samples on Q held-out queries; "
                             "--seeds, --eval-samples, --plan)")  # fmt: skip
    g.add_argument("--members", type=int, default=None, help="K: members of each proxy ensemble (default "
                   "train_reward.ensemble, or 4 when the preset trains one model)")  # fmt: skip
    g.add_argument("--proxies", default=None, help="proxies optimized, any of single, mean, min, uwo (default all)")
    g.add_argument("--methods", default=None, help="bon (best-of-n), ppo (default both)")
    g.add_argument("--kl-coef", type=float, default=None, help="the PPO arms' fixed KL coefficient beta (default "
                   "0.01: small, so the policy moves far)")  # fmt: skip
    g.add_argument("--uwo-lambda", type=float, default=None, help="uwo's weight of the members' variance (default 1)")


def choices(text: str | None, flag: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """The items of a comma-separated flag among `known` (None: all of them), in `known`'s order."""
    if text is None:
        return known
    items = split_items(text, flag)
    bad = [x for x in items if x not in known]
    if not items or bad:
        raise UserError(f"{flag} {text!r}: unknown {bad[0] if bad else 'empty list'!r}; choose from "
                        f"{', '.join(known)}")  # fmt: skip
    return tuple(x for x in known if x in items)


def plan_from_args(a: argparse.Namespace, cfg):
    """The Plan of the command line, or one line naming the bad value."""
    from lmprefs.recipes.overoptimization import DEFAULT_LABELS, DEFAULT_MEMBERS, METHODS, PROXIES, Plan

    labels = DEFAULT_LABELS
    if a.labels is not None:
        xs = parse_numbers(a.labels, "--labels", int)
        if min(xs) <= 0:
            raise UserError(f"--labels {a.labels!r}: label counts must be positive")
        labels = tuple(sorted(xs))
    members = a.members if a.members is not None else (cfg.train_reward.ensemble if cfg.train_reward.ensemble > 1
                                                        else DEFAULT_MEMBERS)  # fmt: skip
    if members < 2:
        raise UserError(f"--members {members}: an ensemble needs at least 2 members (single is its member 0)")
    kl_coef = 0.01 if a.kl_coef is None else a.kl_coef
    if not 0 < kl_coef < math.inf:
        raise UserError(f"--kl-coef {kl_coef:g}: must be a positive number")
    lam = 1.0 if a.uwo_lambda is None else a.uwo_lambda
    if not 0 <= lam < math.inf:
        raise UserError(f"--uwo-lambda {lam:g}: must be a finite number >= 0 (uwo subtracts lambda times the "
                        "members' variance)")  # fmt: skip
    if a.seeds < 1:
        raise UserError(f"--seeds {a.seeds}: must be at least 1")
    for flag, v in (("--queries", a.queries), ("--eval-samples", a.eval_samples)):
        if v < 1 + (flag == "--queries"):
            raise UserError(f"{flag} {v}: must be at least {1 + (flag == '--queries')}")
    return Plan(labels=labels, members=members, proxies=choices(a.proxies, "--proxies", PROXIES),
                methods=choices(a.methods, "--methods", METHODS), seeds=a.seeds, queries=a.queries,
                samples=a.samples, eval_samples=a.eval_samples, kl_coef=kl_coef, uwo_lambda=lam)  # fmt: skip


def overoptimization(a: argparse.Namespace, cfg, run_dir: Path, on_start) -> dict:
    from lmprefs.recipes.overoptimization import run_overoptimization

    random_questions_only(cfg, "experiment overoptimization")
    plan = plan_from_args(a, cfg)
    out = run_overoptimization(cfg, run_dir, plan, on_start)
    for line in out["results"]["summary"]["lines"].values():
        print(f"  {line}")
    print(f"  verdict: {out['results']['summary']['verdict']}")
    print(f"report: {out['report']}")
    return out


def plan(a: argparse.Namespace, cfg, minutes: float) -> int:
    """--plan: the stages' estimated seconds from the task's shape; nothing is written."""
    from lmprefs.models.flops import ModelFacts
    from lmprefs.models.trunk import shares_queries
    from lmprefs.pipeline.task import setup_task
    from lmprefs.recipes.overoptimization import check_grid
    from lmprefs.recipes.overoptimization_plan import plan_overoptimization
    from lmprefs.recipes.plan import Shape, format_plan

    random_questions_only(cfg, "experiment overoptimization")
    p = plan_from_args(a, cfg)
    t = setup_task(cfg, p.queries)
    pool, held = check_grid(t, p)
    try:
        facts = ModelFacts.from_config(t.model.config)
    except ValueError as e:
        raise UserError(str(e)) from None
    shape = Shape(len(t.prefix) + cfg.task.query_length + len(t.suffix), len(t.train_queries), shares_queries(t.model))
    arms = [f"{m}-{x}" for m, x in p.arms()]
    print(f"experiment overoptimization: labels {','.join(map(str, p.labels))}, arms {','.join(arms)}, {p.seeds} "
          f"seed(s), {p.members}-member ensembles, best-of-n up to {p.samples} on {p.queries} held-out queries, "
          f"{cfg.ppo.num_updates} PPO updates of {cfg.ppo.batch_size} at beta {p.kl_coef:g}, "
          f"{cfg.task.initial_model}")  # fmt: skip
    print(format_plan(plan_overoptimization(cfg, facts, shape, p, pool=pool, held=held), minutes * 60))
    return 0
