"""`lmprefs experiment`: the paper's Figure 2 (mock-sentiment) and Figure 3 (kl-frontier), the methods side by side
on Figure 3's axes (compare, lmprefs.cli.compare), and the writing-prompts demo; each resumes when its command line
is run again."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmprefs.cli import compare
from lmprefs.cli import label_efficiency as label_eff
from lmprefs.cli import overoptimization as overopt
from lmprefs.cli.common import (
    ArgumentParser,
    check_seeds_and_eval,
    command_parser,
    experiment_setup,
    given_flags,
    help_with_config,
    parse_numbers,
    random_questions_only,
    run_dir_for,
    save_experiment_flags,
)
from lmprefs.errors import UserError
from lmprefs.io.inputs import input_file

DEFAULT_KL_COEFS = "0.01,0.03,0.1,0.3"  # fixed betas that spread the arms' KL on every preset

# each experiment's own flags: saved with the run, so that rerunning its command (or the bare command) resumes it
FLAGS = {"mock-sentiment": ("labels", "seeds", "eval_queries", "eval_samples"),
         "kl-frontier": ("queries", "samples", "betas", "kl_targets", "kl_coefs", "true_reward", "min_ess", "figure2",
                         "eval_samples", "fit_cut", "seeds"),
         "compare": compare.FLAGS, "label-efficiency": label_eff.FLAGS,
         "overoptimization": overopt.FLAGS}  # fmt: skip


def _others_flags(name: str) -> set[str]:
    """The flags (dests) of the other experiments that experiment `name` does not share."""
    return {d for other, dests in FLAGS.items() if other != name for d in dests} - set(FLAGS[name])


def _parser() -> ArgumentParser:
    p = command_parser("experiment", "lmprefs experiment {mock-sentiment,kl-frontier,compare,label-efficiency,"
                       "overoptimization,writing-prompts} "
                       "[PRESET] [--run-dir DIR] [...]")  # fmt: skip
    p.add_argument("name", choices=["mock-sentiment", "kl-frontier", "compare", "label-efficiency", "overoptimization",
                                    "writing-prompts"],
                   help="mock-sentiment: the paper's Figure 2 (reward models from N labels vs direct access); "
                   "kl-frontier: Figure 3 (KL vs true reward of PPO runs beside the optimal policy); compare: PPO, "
                   "PPO with a separate value model, RLOO, the GRPO family, DPO (offline and online) and best-of-n "
                   "from one label store on Figure 3's axes; "
                   "label-efficiency: random against uncertainty-directed queries at several label budgets; "
                   "overoptimization: Gao et al.'s protocol (proxy and true reward over KL for best-of-n and PPO "
                   "against reward models from N labels, single and ensembles under mean, min and uwo); "
                   "writing-prompts: "
                   "SFT, a reward model from scores and PPO with a separate value model (lmprefs experiment "
                   "writing-prompts --help)")  # fmt: skip
    p.add_argument("preset_arg", nargs="?", metavar="PRESET", help="preset every arm starts from (default quickstart)")
    p.add_argument("--preset", default=None, help="the same as PRESET")
    p.add_argument("--run-dir", default=None, help="directory (an existing one resumes)")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out query for each PPO arm")
    g = p.add_argument_group("mock-sentiment")
    g.add_argument("--labels", default=None, help="label counts of the reward-model arms (default 250,1000,4000, or "
                   "what the preset's queries can give: the most, a quarter and a sixteenth of it)")  # fmt: skip
    g.add_argument("--seeds", type=int, default=1, help="seeds of every arm (reward-model init, label subset, PPO; "
                   "kl-frontier: PPO's sampling and its value head's init)")  # fmt: skip
    g.add_argument("--eval-queries", type=int, default=None, help="held-out queries for the true-reward evaluation "
                   "(default 256, or all the preset's held-out queries if fewer)")  # fmt: skip
    g.add_argument("--plan", action="store_true", help="print each stage's estimated seconds for the preset, "
                   "overrides and flags given (FLOP counts at the rates the SmolLM2 quickstart measured on a 2-core "
                   "CPU) and the total against --plan-minutes; runs and writes nothing")  # fmt: skip
    g.add_argument("--plan-minutes", type=float, default=60.0, help="the wall-time budget --plan compares with")
    g = p.add_argument_group("kl-frontier")
    g.add_argument("--queries", type=int, default=64, help="Q: held-out queries for the frontier and the PPO arms")
    g.add_argument("--samples", type=int, default=256, help="M: samples of the initial policy per query")
    g.add_argument("--betas", default=None, help="beta grid of the optimal frontier (default 25 from 0.01 to 10)")
    g.add_argument("--kl-targets", default=None, help="PPO arms with the adaptive KL controller at these targets "
                   "(none by default: at laptop scale the controller moves beta by a few percent at most, so targets "
                   "give nearly the same arms)")  # fmt: skip
    g.add_argument("--kl-coefs", default=None, help="PPO arms with a fixed KL coefficient (beta) each (default "
                   f"{DEFAULT_KL_COEFS} when neither this nor --kl-targets is given)")  # fmt: skip
    g.add_argument("--true-reward", default=None, help="true reward: vader, descriptiveness or module:function "
                   "(default labels.labeler)")  # fmt: skip
    g.add_argument("--min-ess", type=float, default=10.0, help="frontier points with a smaller mean effective "
                   "sample size are marked as not trusted")  # fmt: skip
    g.add_argument("--figure2", default=None, help="a mock-sentiment run directory whose arms are added as points")
    g.add_argument("--fit-cut", type=float, default=None, help="Gao et al.'s forms are fitted to the points with KL "
                   "up to this many nats and predict those beyond (default: each set's median KL)")  # fmt: skip
    compare.add_flags(p)
    label_eff.add_flags(p)
    overopt.add_flags(p)
    return p


def cmd_experiment(argv: list[str]) -> int:
    from lmprefs.config.overrides import split_overrides
    from lmprefs.runtime.resolve import resolve_config

    if argv[:1] == ["writing-prompts"]:
        return _writing_prompts(argv[1:])
    argv, pairs = split_overrides(argv)
    p = _parser()
    if argv[:1] and argv[0] in FLAGS:  # `experiment NAME --help` shows NAME's own flags, not every experiment's
        other = _others_flags(argv[0])
        for act in p._actions:
            if act.dest in other:
                act.help = argparse.SUPPRESS
    help_with_config(p, argv, "quickstart", pairs)
    a = p.parse_args(argv)
    if a.preset and a.preset_arg and a.preset != a.preset_arg:
        raise UserError(f"preset given twice: {a.preset_arg} and --preset {a.preset}")
    preset_name = a.preset or a.preset_arg or "quickstart"
    if a.name == "writing-prompts":  # its own flags: parsed when it comes first
        raise UserError("writing-prompts: put it right after `experiment` (lmprefs experiment writing-prompts --help)")
    given = given_flags(p, argv)
    wrong = [act.option_strings[0] for act in p._actions if act.dest in _others_flags(a.name) & given]
    if wrong:
        raise UserError(f"{wrong[0]} is not an option of `experiment {a.name}` (see lmprefs experiment --help)")
    if a.plan or "plan_minutes" in given:
        if a.name in ("label-efficiency", "compare", "overoptimization"):
            planner = {"label-efficiency": label_eff.plan, "compare": compare.plan,
                       "overoptimization": overopt.plan}[a.name]  # fmt: skip
            return planner(a, resolve_config(preset_name, pairs), _plan_minutes(a.plan_minutes))
        if a.name != "mock-sentiment":
            raise UserError(f"--plan is an option of `experiment mock-sentiment`, `label-efficiency`, `compare` and "
                            f"`overoptimization`, not of `experiment {a.name}`")  # fmt: skip
        return _plan(a, resolve_config(preset_name, pairs))
    if a.name == "compare" and a.db:  # saved with the run: a rerun from elsewhere reads the same store
        a.db = str(Path(a.db).resolve())
    if a.name in ("mock-sentiment", "compare", "overoptimization"):  # they label: with random questions
        random_questions_only(resolve_config(preset_name, pairs), f"experiment {a.name}")
    owner = f"experiment {a.name}"
    run_dir = run_dir_for(a.run_dir, resolve_config(preset_name, []), "experiment", a.name, owner)
    cfg, flags, on_start = experiment_setup(run_dir, owner, preset_name, pairs,
                                            {k: getattr(a, k) for k in FLAGS[a.name]}, given)  # fmt: skip
    a = argparse.Namespace(**{**vars(a), **flags})
    if a.eval_samples < 1:
        raise UserError(f"--eval-samples {a.eval_samples}: must be at least 1")
    run = {"mock-sentiment": _mock_sentiment, "kl-frontier": _kl_frontier, "compare": compare.compare,
           "label-efficiency": label_eff.label_efficiency, "overoptimization": overopt.overoptimization}[a.name]
    out = run(a, cfg, run_dir, on_start)
    save_experiment_flags(run_dir, flags)
    print(f"figure: {out['figure']}")
    return 0


def _mock_sentiment_args(a: argparse.Namespace) -> list[int] | None:
    """--labels as sorted counts (None: the defaults), after refusing bad --labels, --seeds, --eval-queries and
    --eval-samples in one line each."""
    counts = sorted(set(parse_numbers(a.labels, "--labels", int))) if a.labels is not None else None
    if counts is not None and (not counts or counts[0] <= 0):
        raise UserError(f"--labels {a.labels!r}: label counts must be positive")
    check_seeds_and_eval(a)
    return counts


def _plan_minutes(minutes: float) -> float:
    if not 0 < minutes < float("inf"):
        raise UserError(f"--plan-minutes {minutes:g}: must be a positive number of minutes")
    return minutes


def _plan(a: argparse.Namespace, cfg) -> int:
    """--plan: the experiment's stages and their estimated seconds, from the task's shape; nothing is written."""
    from lmprefs.models.flops import ModelFacts
    from lmprefs.models.trunk import shares_queries
    from lmprefs.pipeline.task import setup_task
    from lmprefs.recipes.experiment import DEFAULT_EVAL_QUERIES, check_sizes
    from lmprefs.recipes.plan import Shape, format_plan, plan_mock_sentiment

    counts = _mock_sentiment_args(a)
    _plan_minutes(a.plan_minutes)
    t = setup_task(cfg, a.eval_queries or DEFAULT_EVAL_QUERIES)
    counts, n_eval = check_sizes(t, counts, a.eval_queries, a.seeds)
    try:
        facts = ModelFacts.from_config(t.model.config)
    except ValueError as e:
        raise UserError(str(e)) from None
    shape = Shape(len(t.prefix) + cfg.task.query_length + len(t.suffix), len(t.train_queries), shares_queries(t.model))
    print(f"experiment mock-sentiment: labels {','.join(map(str, counts))}, {a.seeds} seed(s), {n_eval} held-out "
          f"queries x {a.eval_samples} samples, {cfg.ppo.num_updates} PPO updates of {cfg.ppo.batch_size}, reward "
          f"models of {cfg.train_reward.epochs} epoch(s), {cfg.task.initial_model}")  # fmt: skip
    rows = plan_mock_sentiment(cfg, facts, shape, counts, a.seeds, n_eval, a.eval_samples)
    print(format_plan(rows, a.plan_minutes * 60))
    alone = sum(r["seconds"] for r in plan_mock_sentiment(cfg, facts, shape, counts, a.seeds, n_eval,
                                                          a.eval_samples, share=False))  # fmt: skip
    print(f"every reward model on its own instead (its own frozen prefixes, its own untrained model's "
          f"normalization and held-out evaluation): {alone / 60:.1f} min (estimate)")  # fmt: skip
    return 0


def _mock_sentiment(a: argparse.Namespace, cfg, run_dir: Path, on_start) -> dict:
    from lmprefs.recipes.experiment import ci95, interval_count, run_mock_sentiment

    counts = _mock_sentiment_args(a)
    out = run_mock_sentiment(cfg, run_dir, counts, a.eval_queries, a.eval_samples, a.seeds, on_start)
    for k, v in {"initial": out["results"]["initial"], **out["results"]["summary"]}.items():
        half = v.get("ci95", ci95(v["stderr"], interval_count(v)))  # the initial policy's: over its queries
        print(f"  {k:12s} true reward {v['mean']:+.4f} +/- {v['stderr']:.4f} (95% interval {v['mean'] - half:+.4f} "
              f"to {v['mean'] + half:+.4f}), KL {v['kl']:.2f} +/- {v['kl_stderr']:.2f}"
              + (f" ({v['seeds']} seeds)" if v.get("seeds", 1) > 1 else ""))  # fmt: skip
    if out["results"].get("finding"):
        print(f"  {out['results']['finding']}")
    return out


def _kl_frontier(a: argparse.Namespace, cfg, run_dir: Path, on_start) -> dict:
    from lmprefs.recipes.kl_frontier import FrontierPlan, run_kl_frontier
    from lmprefs.training.frontier import DEFAULT_BETAS

    betas = parse_numbers(a.betas, "--betas") if a.betas is not None else list(DEFAULT_BETAS)
    bad = [b for b in betas if not b > 0 or b == float("inf")]
    if not betas or bad:
        raise UserError(f"--betas {a.betas!r}: every beta must be a positive number" + (f" (not {bad[0]:g})"
                                                                                       if bad else ""))
    for flag, v in (("--queries", a.queries), ("--samples", a.samples)):
        if v < 2:
            raise UserError(f"{flag} {v}: must be at least 2 (a standard error needs two)")
    if not a.kl_targets and a.kl_coefs is None:  # --kl-targets "": no target arms, the default coefficients' only
        a.kl_coefs = DEFAULT_KL_COEFS
    targets = parse_numbers(a.kl_targets, "--kl-targets") if a.kl_targets else []
    coefs = parse_numbers(a.kl_coefs, "--kl-coefs") if a.kl_coefs is not None else []
    for flag, text, xs in (("--kl-targets", a.kl_targets, targets), ("--kl-coefs", a.kl_coefs, coefs)):
        if any(not 0 < x < float("inf") for x in xs):
            raise UserError(f"{flag} {text!r}: every value must be a positive number")
    compare.check_min_ess(a.min_ess)
    if a.seeds < 1:
        raise UserError(f"--seeds {a.seeds}: must be at least 1")
    if a.fit_cut is not None and not 0 < a.fit_cut < float("inf"):
        raise UserError(f"--fit-cut {a.fit_cut:g}: must be a positive number of nats")
    plan = FrontierPlan(a.queries, a.samples, betas, targets, coefs, a.eval_samples, a.true_reward or
                        cfg.labels.labeler, a.min_ess, Path(a.figure2) if a.figure2 else None, a.fit_cut, a.seeds)
    out = run_kl_frontier(cfg, run_dir, plan, on_start)
    res = out["results"]
    trusted = [p for p in res["frontier"]["points"] if p["trusted"]]
    if trusted:
        top = trusted[0]
        print(f"  optimal frontier: trusted up to KL {top['kl']:.2f} nats (reward {top['reward']:+.4f}, beta "
              f"{top['beta']:g}, mean ESS {top['ess_mean']:.0f} of {a.samples})")  # fmt: skip
    for k, v in [("initial", res["initial"])] + list(res["summary"].items()):
        across = f" (s.e. across {v['seeds']} seeds)" if v.get("seeds", 1) > 1 else ""
        print(f"  {k:14s} true reward {v['mean']:+.4f} +/- {v['stderr']:.4f} at KL {v['kl']:.2f} +/- "
              f"{v['kl_stderr']:.2f}{across}")  # fmt: skip
    for form, fit in res["gao_fits"].items():
        if "alpha" not in fit:
            print(f"  Gao {form} form: not fitted ({fit['error']})")
            continue
        err = f"RMSE {fit['rmse_beyond']:.4f} on the {fit['predicted']} beyond" if fit["predicted"] else "none beyond"
        shape = "d" if form == "bon" else "log d"
        print(f"  Gao {form} form R(d) = d (alpha - beta {shape}): alpha {fit['alpha']:.4f}, "
              f"beta {fit['beta']:.4f} from {fit['fitted']} points with KL <= {fit['cut']:.2f}; {err}")  # fmt: skip
    return out


def _writing_prompts_parser() -> ArgumentParser:
    p = ArgumentParser(prog="lmprefs experiment writing-prompts",
                       description="SFT baseline, a reward model from per-response scores, PPO from the SFT model "
                       "with a separate value model, evaluation; an existing --run-dir resumes",
                       usage="lmprefs experiment writing-prompts [--data SCORES.jsonl] [--run-dir DIR] "
                       "[--section.key V ...]")  # fmt: skip
    p.add_argument("--data", default=None, help="JSONL of {prompt, response, score} (default: the offline demo, "
                   "Austen prompts, SmolLM2 stories, VADER scores)")  # fmt: skip
    p.add_argument("--preset", default="writing-prompts", help="preset (default writing-prompts)")
    p.add_argument("--run-dir", default=None, help="directory (an existing one resumes)")
    p.add_argument("--true-reward", default=None,
                   help="a reward on response texts to evaluate with: vader, descriptiveness or module:function "
                   "(default: vader for the demo, none for --data)")  # fmt: skip
    p.add_argument("--eval-queries", type=int, default=64, help="held-out prompts for the final evaluation")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out prompt")
    p.add_argument("--demo-prompts", type=int, default=256, help="demo: Austen passages used as prompts")
    p.add_argument("--demo-per-prompt", type=int, default=4, help="demo: sampled stories per prompt")
    return p


def _check_scores_file(data: str) -> None:
    """A bad row of --data is refused before the run directory is made."""
    import tempfile

    from lmprefs.labels.formats import LabelFileError, import_file
    from lmprefs.pipeline.labeling import open_store

    if not Path(data).exists():
        raise UserError(f"--data {data}: no such file (a JSONL of prompt, response, score)")
    input_file(data, "--data")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            import_file(open_store(Path(tmp) / "check.sqlite"), data, format="scores")
        except LabelFileError as e:
            raise UserError(str(e)) from None


def _writing_prompts(argv: list[str]) -> int:
    from lmprefs.config.overrides import split_overrides
    from lmprefs.pipeline.rewards import reward_function
    from lmprefs.recipes.writing_prompts import run_writing_prompts
    from lmprefs.runtime.resolve import resolve_config

    argv, pairs = split_overrides(argv)
    p = _writing_prompts_parser()
    help_with_config(p, argv, "writing-prompts", pairs)
    a = p.parse_args(argv)
    if a.eval_queries < 2 or a.eval_samples < 1 or a.demo_prompts < 2 or a.demo_per_prompt < 2:
        raise UserError("--eval-queries, --demo-prompts and --demo-per-prompt must be >= 2, --eval-samples >= 1")
    if a.data is not None:
        _check_scores_file(a.data)
    if a.true_reward is not None:
        reward_function(a.true_reward, "--true-reward")  # an unknown name is refused before any work
    owner = "experiment writing-prompts"
    run_dir = run_dir_for(a.run_dir, resolve_config(a.preset, []), "experiment", "writing-prompts", owner)
    own = {"data": str(Path(a.data).resolve()) if a.data else None, "true_reward": a.true_reward,
           "eval_queries": a.eval_queries, "eval_samples": a.eval_samples, "demo_prompts": a.demo_prompts,
           "demo_per_prompt": a.demo_per_prompt}  # fmt: skip
    cfg, own, on_start = experiment_setup(run_dir, owner, a.preset, pairs, own, given_flags(p, argv), fixed=True)
    if cfg.labels.type != "scalar_rating":  # else stage 3 refused the store, after the data and SFT stages
        raise UserError(f"labels.type={cfg.labels.type}: writing-prompts stores its per-response scores as "
                        "scalar_rating labels; set --labels.type scalar_rating (the writing-prompts preset does)")
    on_start()
    out = run_writing_prompts(cfg, run_dir, data=own["data"], true_reward=own["true_reward"],
                              n_eval=own["eval_queries"], eval_samples=own["eval_samples"],
                              demo_prompts=own["demo_prompts"], demo_per_prompt=own["demo_per_prompt"])  # fmt: skip
    ev = out["results"]["evaluate"]
    if "true_ppo" in ev:
        print(f"true reward on {ev['n_queries']} held-out prompts: SFT {ev['true_sft']:+.4f} -> PPO "
              f"{ev['true_ppo']:+.4f} (gain {ev['gain']:+.4f} +/- {ev['gain_stderr']:.4f})")  # fmt: skip
    print(f"report: {out['report']}")
    return 0
