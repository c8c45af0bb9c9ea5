"""`lmprefs evaluate`: a trained policy's reward and KL from its reference on held-out prompts."""

from __future__ import annotations

import shlex
from pathlib import Path

from lmprefs.cli.common import command_parser, help_with_config
from lmprefs.errors import UserError
from lmprefs.io.inputs import output_dir
from lmprefs.io.run_owner import claim, recorded_argv

USAGE = ("lmprefs evaluate RUN_OR_MODEL (--reward NAME | --reward-model DIR) [--reference MODEL] [--queries FILE] "
         "[--eval-queries N] [--eval-samples K] [--out DIR] [--preset P] [--section.key V ...]")  # fmt: skip


def cmd_evaluate(argv: list[str]) -> int:
    from lmprefs.config.overrides import split_overrides

    argv, pairs = split_overrides(argv)
    p = command_parser("evaluate", USAGE)
    p.add_argument("target", metavar="RUN_OR_MODEL",
                   help="a train-policy, quickstart, train-dpo or train-sft run directory (its config is used), or a "
                   "saved model directory (an lmprefs policy or a Hugging Face causal LM; --preset's config)")
    p.add_argument("--reward", default=None,
                   help="the true reward: vader, descriptiveness, or module:function (list[str] -> list[float])")
    p.add_argument("--reward-model", default=None,
                   help="a reward-model directory: its score, the proxy (one lmprefs did not train is normalized on "
                   "the reference's samples unless --rewards.normalize false)")  # fmt: skip
    p.add_argument("--reference", default=None,
                   help="the policy KL is measured from, and evaluated beside (default: the run's initial model, "
                   "task.initial_model; for a model directory, its adapter's base or the preset's initial model)")
    p.add_argument("--queries", default=None,
                   help="prompts to evaluate on, as task.query_dataset takes them (a .txt, .jsonl, .json or .csv "
                   "file, a save_to_disk directory...; default: the task's held-out queries)")  # fmt: skip
    p.add_argument("--eval-queries", type=int, default=None, help="queries to evaluate (default: up to 256)")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per query")
    p.add_argument("--out", default=None, help="output directory (default runs/evaluate-NAME-TIME)")
    p.add_argument("--preset", default=None,
                   help="the config for a model directory (default austen-sentiment; a run has its own)")
    help_with_config(p, argv, "austen-sentiment", pairs)
    a = p.parse_args(argv)
    from lmprefs.recipes.evaluate import check_inputs, evaluate, resolve_target
    from lmprefs.runtime.runlog import default_run_dir

    check_inputs(a.target, a.reward, a.reward_model, a.queries, a.eval_queries, a.eval_samples, a.reference)
    out = output_dir(a.out or default_run_dir("evaluate", Path(a.target).resolve().name), "--out", "evaluate")
    if (out / "report.md").exists():  # written last: an evaluation stopped before it is done again in place
        raise UserError(f"--out {out}: already holds an evaluation (report.md); choose another --out")
    line = command_line(a, pairs, out)
    begun = recorded_argv(out)
    if begun is not None and begun != line:  # only its own command line finishes it: else two evaluations mix
        raise UserError(f"--out {out}: holds an evaluation begun by `lmprefs {shlex.join(begun)}`, which stopped "
                        "before report.md; rerun that command line to finish it, or choose another --out")
    target = resolve_target(a.target, a.preset, pairs, a.reference)
    if (out / "results.json").exists():
        print(f"--out {out}: its evaluation stopped before report.md; evaluating again in place", flush=True)
    s = evaluate(target, a.reward, a.reward_model, a.queries, a.eval_queries, a.eval_samples, out,
                 reference_given=a.reference is not None,
                 before_write=lambda: claim(out, "evaluate", "--out", line))  # fmt: skip
    r, q, d = s["reference_eval"], s["policy_eval"], s["difference"]
    print(f"{s['reward']} on {s['n_queries']} {s['queries']} x {s['samples_per_query']} samples:")
    print(f"  reference {r['mean']:+.4f} +/- {r['stderr']:.4f}, policy {q['mean']:+.4f} +/- {q['stderr']:.4f} "
          f"(difference {d['mean']:+.4f} +/- {d['stderr']:.4f})")  # fmt: skip
    print(f"  KL(policy || reference) {q['kl']:.3f} +/- {q['kl_stderr']:.3f} nats")
    print(f"report: {out / 'report.md'}")
    return 0


def command_line(a, pairs, out: Path) -> list[str]:
    """The evaluation `a` asks for as one command line, paths made absolute: the same evaluation, whichever
    directory it is run from and however its flags are ordered, gives the same list."""

    def path(given: str) -> str:
        return str(Path(given).absolute()) if Path(given).exists() else given  # else a name (vader, an asset)

    line = ["evaluate", path(a.target)]
    for flag, value in (("--reward", a.reward), ("--reward-model", a.reward_model), ("--reference", a.reference),
                        ("--queries", a.queries), ("--eval-queries", a.eval_queries),
                        ("--eval-samples", a.eval_samples), ("--preset", a.preset)):  # fmt: skip
        if value is not None:
            line += [flag, path(str(value)) if flag in ("--reward-model", "--reference", "--queries") else str(value)]
    line += [x for k, v in sorted(pairs) for x in (f"--{k.replace('_', '-')}", v)]
    return [*line, "--out", str(out.absolute())]
