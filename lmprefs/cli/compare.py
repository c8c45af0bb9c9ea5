"""`lmprefs experiment compare`: its flags, their checks and its printed table (lmprefs.recipes.compare)."""

from __future__ import annotations

import argparse
import dataclasses
from collections import Counter
from pathlib import Path

from lmprefs.cli.common import parse_numbers
from lmprefs.config.overrides import split_items
from lmprefs.errors import UserError

DEFAULT_ARMS = "ppo,ppo-separate,rloo,dpo-pairwise,dpo-listwise,best-of-n"
DEFAULT_BETAS = "0.03,0.1,0.3"  # KL coefficients of the PPO-family arms and DPO's betas alike
DEFAULT_BEST_OF = "2,4,8,16"
FLAGS = ("arms", "labels", "seeds", "eval_queries", "eval_samples", "samples", "betas", "min_ess", "kl_coefs",
         "dpo_betas", "best_of", "db", "match_kl", "lengths", "kl_coefs_of")  # fmt: skip


def add_flags(p: argparse.ArgumentParser) -> None:
    """compare's own flags; --labels, --seeds, --eval-queries, --samples, --betas, --min-ess and --kl-coefs are
    shared with the other experiments."""
    g = p.add_argument_group("compare (also --labels N: the store's label count, --seeds, --eval-queries, "
                             "--samples, --betas, --min-ess, --kl-coefs)")  # fmt: skip
    g.add_argument("--arms", default=None, help=f"arms to run (default {DEFAULT_ARMS}; also grpo, "
                   "grpo-kl-reward, dr-grpo, reinforce-pp-baseline, any PPO-family kind with -beta0, and dpo-online: "
                   "online DPO on its own samples judged by the reward model, ppo.num_updates steps of "
                   "ppo.batch_size samples)")  # fmt: skip
    g.add_argument("--kl-coefs-of", action="append", default=None, metavar="KIND=C1,C2,...",
                   help="the KL coefficients of one PPO-family kind in place of --kl-coefs (repeat it for others), "
                   "e.g. grpo-kl-reward=0.1,0.3,1,3 for a kind whose KL barely moves over --kl-coefs")  # fmt: skip
    g.add_argument("--dpo-betas", default=None, help=f"dpo.beta of each DPO arm, offline and online (default "
                   f"{DEFAULT_BETAS})")  # fmt: skip
    g.add_argument("--best-of", default=None, help=f"n of each best-of-n arm (default {DEFAULT_BEST_OF})")
    g.add_argument("--db", default=None, help="an existing label store (.sqlite or a label file) instead of one "
                   "sampled and labeled by labels.labeler")  # fmt: skip
    g.add_argument("--match-kl", default=None, help="KL values (nats) at which the arm kinds are compared, each "
                   "kind's true reward interpolated per seed (default: 3 inside the range every kind reached)")
    g.add_argument("--lengths", default=None, help="PPO updates after which each beta-0 kind's run (--arms "
                   "grpo-beta0, ...: rewards.kl_coef 0, its KL set by how long it trains) is evaluated, its curve's "
                   "points; its end always among them (default: after each quarter of it)")


def _positive(text: str, flag: str, what: str, kind=float) -> tuple:
    xs = parse_numbers(text, flag, kind)
    bad = [x for x in xs if not 0 < x < float("inf")]
    if not xs or bad:
        raise UserError(f"{flag} {text!r}: every {what} must be a positive number" + (f" (not {bad[0]:g})" if bad
                                                                                      else ""))  # fmt: skip
    return tuple(xs)


def _given(text: str | None, default: str) -> str:
    """A list flag's text, or its default where it was not given (an empty one given is refused, not defaulted)."""
    return default if text is None else text


def check_min_ess(value: float) -> None:
    """--min-ess of kl-frontier and compare: a finite number of at least 1 (nan passed `< 1` and trusted no frontier
    point)."""
    if not 1 <= value < float("inf"):
        raise UserError(f"--min-ess {value:g}: must be a number of at least 1")


def plan_from_args(a: argparse.Namespace):
    """The Plan of the command line, or one line naming the bad value."""
    from lmprefs.recipes.compare_arms import ARMS, Plan
    from lmprefs.training.frontier import DEFAULT_BETAS as FRONTIER_BETAS

    arms = tuple(split_items(_given(a.arms, DEFAULT_ARMS), "--arms"))
    unknown = [x for x in arms if x not in ARMS]
    if not arms or unknown:
        what = f"unknown arm {unknown[0]!r}" if unknown else "names no arm"
        raise UserError(f"--arms {a.arms!r}: {what}; choose from {', '.join(ARMS)}")
    if a.seeds < 1:
        raise UserError(f"--seeds {a.seeds}: must be at least 1")
    best_of = _positive(_given(a.best_of, DEFAULT_BEST_OF), "--best-of", "n", int)
    labels = None
    if a.labels is not None:
        counts = parse_numbers(a.labels, "--labels", int)
        if len(counts) != 1 or counts[0] < 1:
            raise UserError(f"--labels {a.labels!r}: one positive label count (the store's)")
        labels = counts[0]
    for flag, v in (("--eval-queries", a.eval_queries), ("--samples", a.samples)):
        if v is not None and v < 2:
            raise UserError(f"{flag} {v}: must be at least 2 (a standard error needs two)")
    check_min_ess(a.min_ess)
    kl_coefs = _positive(_given(a.kl_coefs, DEFAULT_BETAS), "--kl-coefs", "KL coefficient")
    kind_kl_coefs = _kind_coefs(a.kl_coefs_of or [], arms)
    dpo_betas = _positive(_given(a.dpo_betas, DEFAULT_BETAS), "--dpo-betas", "beta")
    match_kl = tuple(sorted(_positive(a.match_kl, "--match-kl", "KL value"))) if a.match_kl is not None else ()
    lengths = _positive(a.lengths, "--lengths", "update count", int) if a.lengths is not None else ()
    return Plan(arms=arms, lengths=tuple(sorted(set(lengths))), seeds=a.seeds, best_of=tuple(sorted(set(best_of))),
                kl_coefs=kl_coefs, kind_kl_coefs=kind_kl_coefs, dpo_betas=dpo_betas, labels=labels, match_kl=match_kl,
                n_eval=a.eval_queries or 0, eval_samples=a.eval_samples, samples=a.samples,
                betas=_positive(a.betas, "--betas", "beta") if a.betas is not None else FRONTIER_BETAS,
                min_ess=a.min_ess, db=Path(a.db).resolve() if a.db else None)  # fmt: skip


def _kind_coefs(items: list[str], arms: tuple[str, ...]) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """--kl-coefs-of KIND=C1,C2,... (repeated): one PPO-family kind of --arms each, at most once, its own
    coefficients positive."""
    from lmprefs.recipes.compare_arms import PPO_FAMILY

    out: dict[str, tuple[float, ...]] = {}
    for item in items:
        kind, eq, values = item.partition("=")
        if not eq or kind not in PPO_FAMILY or kind not in arms or kind in out:
            why = ("is not KIND=C1,C2,..." if not eq else f"{kind!r} is not a PPO-family kind" if kind not in
                   PPO_FAMILY else f"{kind} is not in --arms" if kind not in arms else f"{kind} is given twice")
            raise UserError(f"--kl-coefs-of {item!r}: {why} (PPO-family kinds: {', '.join(PPO_FAMILY)})")
        out[kind] = _positive(values, f"--kl-coefs-of {kind}", "KL coefficient")
    return tuple(out.items())


def checked_plan(a: argparse.Namespace, cfg):
    """The Plan of the command line with its beta-0 lengths resolved against the preset's run length, after the
    checks that need the config."""
    from lmprefs.recipes.compare_dpo import check_online
    from lmprefs.recipes.compare_lengths import resolve_lengths

    plan = plan_from_args(a)
    ppo = f"ppo.total_episodes {cfg.ppo.total_episodes} / ppo.batch_size {cfg.ppo.batch_size}"
    plan = dataclasses.replace(plan, lengths=resolve_lengths(plan.lengths, plan.arms, cfg.ppo.num_updates, ppo))
    check_online(cfg, plan.arms)
    if plan.match_kl:
        _check_match_kl(a.match_kl, plan)
    return plan


def _check_match_kl(text: str, plan) -> None:
    """--match-kl refused where no comparison can hold: fewer than two arm kinds with a curve (two or more settings,
    or a beta-0 kind's two or more lengths), or a value outside best-of-n's analytic KL range (log n - (n-1)/n over
    --best-of)."""
    from lmprefs.recipes.compare_arms import arm_list
    from lmprefs.training.scaling_laws import bon_kl

    values, best_of = plan.match_kl, plan.best_of
    settings = Counter(kind for _, kind, _, _ in arm_list(plan))
    curves = [k for k in dict.fromkeys(plan.arms) if settings[k] > 1]
    if len(curves) < 2:
        raise UserError(f"--match-kl {text}: matched KL needs two or more arm kinds with two or more KL settings "
                        "each (--kl-coefs, --dpo-betas, --best-of, --lengths)")  # fmt: skip
    if "best-of-n" in curves:
        lo, hi = bon_kl(min(best_of)), bon_kl(max(best_of))
        out = [v for v in values if not lo <= v <= hi]
        if out:
            raise UserError(f"--match-kl {text}: best-of-n reaches KL {lo:.2f}-{hi:.2f} nats only (--best-of "
                            f"{','.join(map(str, best_of))}), not {out[0]:g}")  # fmt: skip


def compare(a: argparse.Namespace, cfg, run_dir: Path, on_start) -> dict:
    from lmprefs.recipes.compare import run_compare
    from lmprefs.recipes.compare_report import table, unmoved
    from lmprefs.recipes.matched import verdicts

    plan = checked_plan(a, cfg)
    out = run_compare(cfg, run_dir, plan, on_start)
    print("\n".join(table(out["results"], plan)))
    print("\n".join(verdicts(out["results"]["matched_kl"], plan.seeds)))
    still = unmoved(out["results"], plan, cfg)
    if still:
        print(f"arms that {still}")
    print(f"report: {out['report']}")
    return out


def plan(a: argparse.Namespace, cfg, minutes: float) -> int:
    """--plan: the stages' estimated seconds from the task's shape; nothing is written."""
    from lmprefs.models.flops import ModelFacts
    from lmprefs.models.trunk import shares_queries
    from lmprefs.pipeline.dpo import dpo_labels
    from lmprefs.pipeline.labeling import label_source
    from lmprefs.pipeline.task import setup_eval_task
    from lmprefs.recipes.compare import questions_to_label
    from lmprefs.recipes.compare_arms import DEFAULT_EVAL_QUERIES
    from lmprefs.recipes.plan import Shape, format_plan
    from lmprefs.recipes.plan_compare import Sizes, plan_compare

    p = plan_from_args(a)
    cfg = dataclasses.replace(cfg, labels=dataclasses.replace(cfg.labels, num_train=p.labels or cfg.labels.num_train))
    p = checked_plan(a, cfg)
    t, n_eval = setup_eval_task(cfg, p.n_eval, DEFAULT_EVAL_QUERIES)
    questions = questions_to_label(t) if p.db is None else 0
    if p.db is not None:
        dpo_labels(t, label_source(str(p.db)), f"--db {a.db}")  # the store is refused as the run would refuse it
    try:
        facts = ModelFacts.from_config(t.model.config)
    except ValueError as e:
        raise UserError(str(e)) from None
    shape = Shape(len(t.prefix) + cfg.task.query_length + len(t.suffix), len(t.train_queries), shares_queries(t.model))
    n = cfg.labels.num_train
    held = round(n * cfg.labels.heldout_fraction / (1 - cfg.labels.heldout_fraction))
    beta0 = f" (beta-0 kinds: evaluated after {','.join(map(str, p.lengths))} updates)" if p.lengths else ""
    own = "".join(f" ({kind}: {','.join(f'{x:g}' for x in c)})" for kind, c in p.kind_kl_coefs)
    print(f"experiment compare: {','.join(p.arms)}; {p.seeds} seed(s); kl_coef {','.join(map(format, p.kl_coefs))}"
          f"{own}"
          f"{beta0}; dpo.beta {','.join(map(format, p.dpo_betas))}; best-of {','.join(map(str, p.best_of))}; "
          f"{n} labels{f' of {a.db}' if p.db else ''}; frontier and evaluations on {n_eval} held-out queries "
          f"({p.samples} samples of rho, {p.eval_samples} per arm); {cfg.ppo.num_updates} PPO updates of "
          f"{cfg.ppo.batch_size}; {cfg.task.initial_model}")  # fmt: skip
    rows = plan_compare(cfg, facts, shape, p, Sizes(questions, n, held, n_eval))
    print(format_plan(rows, minutes * 60))
    return 0
