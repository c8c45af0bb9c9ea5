"""`lmprefs experiment label-efficiency`: its flags, their checks, --plan and its printed verdict
(lmprefs.recipes.label_efficiency)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmprefs.cli.common import check_seeds_and_eval, parse_numbers
from lmprefs.config.overrides import split_items
from lmprefs.errors import UserError

DEFAULT_ACQUISITIONS = "bald"
FLAGS = ("labels", "seeds", "eval_queries", "eval_samples", "acquisitions")


def add_flags(p: argparse.ArgumentParser) -> None:
    """label-efficiency's own flag; --labels (its budgets), --seeds, --eval-queries and --plan are shared."""
    g = p.add_argument_group("label-efficiency (also --labels B1,B2,...: the label budgets, default 64,128,256,512; "
                             "--seeds, --eval-queries, --plan)")  # fmt: skip
    g.add_argument("--acquisitions", default=None, help=f"directed arms beside the random control, any of bald, "
                   f"spread (default {DEFAULT_ACQUISITIONS})")  # fmt: skip


def plan_from_args(a: argparse.Namespace):
    """The Plan of the command line, or one line naming the bad value."""
    from lmprefs.labels.acquisition import ACQUISITIONS
    from lmprefs.recipes.label_efficiency import DEFAULT_BUDGETS, Plan

    text = a.acquisitions if a.acquisitions is not None else DEFAULT_ACQUISITIONS
    acqs = split_items(text, "--acquisitions")  # an empty item or one given twice: refused, not dropped or merged
    directed = [x for x in ACQUISITIONS if x != "random"]
    bad = [x for x in acqs if x not in directed]
    if not acqs or bad:
        raise UserError(f"--acquisitions {text!r}: unknown acquisition {bad[0] if bad else ''!r}; choose from "
                        f"{', '.join(directed)} (random, the control, always runs)")  # fmt: skip
    budgets = tuple(DEFAULT_BUDGETS)
    if a.labels is not None:
        xs = parse_numbers(a.labels, "--labels", int)
        if not xs or min(xs) <= 0:
            raise UserError(f"--labels {a.labels!r}: label budgets must be positive")
        budgets = tuple(sorted(set(xs)))
    check_seeds_and_eval(a)
    return Plan(budgets=budgets, acquisitions=tuple(acqs), seeds=a.seeds, n_eval=a.eval_queries,
                eval_samples=a.eval_samples)  # fmt: skip


def check_select(cfg) -> None:
    """labels.select stays random: the experiment runs the random control and each --acquisitions arm itself."""
    if cfg.labels.select != "random":
        raise UserError(f"labels.select={cfg.labels.select}: experiment label-efficiency runs the random control and "
                        f"each directed arm itself; name them with --acquisitions {cfg.labels.select}")  # fmt: skip


def label_efficiency(a: argparse.Namespace, cfg, run_dir: Path, on_start) -> dict:
    from lmprefs.recipes.label_efficiency import run_label_efficiency

    check_select(cfg)
    out = run_label_efficiency(cfg, run_dir, plan_from_args(a), on_start)
    for name, d in out["results"]["summary"]["arms"].items():
        acc = f"{d['accuracy']:.3f}" + (f" +/- {d['accuracy_ci95']:.3f}" if d["accuracy_ci95"] is not None else "")
        print(f"  {name:14s} held-out accuracy {acc}, true reward {d['mean']:+.4f} +/- {d['ci95']:.4f} (95%), "
              f"KL {d['kl']:.2f}")  # fmt: skip
    for line in out["results"]["summary"]["verdict"].values():
        print(f"  verdict: {line}")
    print(f"report: {out['report']}")
    return out


def plan(a: argparse.Namespace, cfg, minutes: float) -> int:
    """--plan: the stages' estimated seconds from the task's shape; nothing is written."""
    from lmprefs.models.flops import ModelFacts
    from lmprefs.models.trunk import shares_queries
    from lmprefs.pipeline.task import setup_task
    from lmprefs.recipes.label_efficiency import DEFAULT_EVAL_QUERIES, check_grid, chooser_config
    from lmprefs.recipes.plan import Shape, format_plan, plan_label_efficiency

    check_select(cfg)
    p = plan_from_args(a)
    t = setup_task(cfg, p.n_eval or DEFAULT_EVAL_QUERIES)
    pool, held, n_eval = check_grid(t, p)
    try:
        facts = ModelFacts.from_config(t.model.config)
    except ValueError as e:
        raise UserError(str(e)) from None
    shape = Shape(len(t.prefix) + cfg.task.query_length + len(t.suffix), len(t.train_queries), shares_queries(t.model))
    members = chooser_config(cfg, "bald").train_reward.ensemble
    print(f"experiment label-efficiency: labels {','.join(map(str, p.budgets))}, random and "
          f"{','.join(p.acquisitions)}, {p.seeds} seed(s), a pool of {pool} candidates and {held} held-out "
          f"questions per seed, rounds of {cfg.labels.select_round} chosen by {members} members, {n_eval} held-out "
          f"queries x {p.eval_samples} samples, {cfg.ppo.num_updates} PPO updates of {cfg.ppo.batch_size}, "
          f"{cfg.task.initial_model}")  # fmt: skip
    rows = plan_label_efficiency(cfg, facts, shape, list(p.budgets), directed=len(p.acquisitions), seeds=p.seeds,
                                 n_eval=n_eval, samples=p.eval_samples, pool=pool, held=held,
                                 members=members)  # fmt: skip
    print(format_plan(rows, minutes * 60))
    return 0
