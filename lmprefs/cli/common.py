"""What every command shares: the command list, the argument parser whose mistakes are one line and exit 2,
the run directory, `--help` with the preset's config, and the rank that prints."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.io.inputs import output_dir
from lmprefs.io.run_owner import claim

COMMANDS = {
    "experiment": "mock-sentiment: Figure 2 (reward models from N labels vs direct access, over seeds); kl-frontier: "
    "Figure 3 (KL vs true reward of PPO runs beside the optimal policy); compare: PPO, RLOO, DPO and best-of-n from "
    "one label store on Figure 3's axes; label-efficiency: random against uncertainty-directed queries at several "
    "label budgets, and how many labels the directed ones save; overoptimization: proxy and true reward over KL for "
    "best-of-n and PPO against single and ensemble reward models (mean, min, uwo), Gao et al.'s protocol; "
    "writing-prompts: SFT, a reward model from scores, PPO "
    "with a separate value model; resumable",
    "quickstart": "the paper's mock-sentiment experiment end to end: label, reward model, PPO, evaluation, report",
    "assets": "list or prepare the offline assets (SmolLM2, the GPT-2 BPE, Austen, the news articles, MiniLM, the "
    "tiny GPT-2s)",
    "sample": "print queries and sampled continuations from the initial model or a trained policy",
    "presets": "list the presets, or print one preset's full config (after --section.key overrides)",
    "config": "print the resolved config of a preset (or --config FILE) with --section.key overrides, as JSON",
    "label": "sample best-of-N comparisons from the initial policy and have a simulated labeler judge them",
    "import-labels": "import a label file (the original's JSON, TRL pairwise JSONL, text JSONL, "
    "summarize-from-feedback comparisons, per-response scores) into a label store",
    "export-labels": "export a label store to a label file",
    "rank-queue": "score a label store's pending questions with a reward-model ensemble's disagreement (BALD or "
    "spread), so the labeling app serves the most informative first",
    "train-reward": "train a reward model from the label store (or a label file) and report held-out accuracy",
    "score": "score texts (stdin or a file) with a trained reward model",
    "serve": "run the labeling web app over a label store (127.0.0.1 by default)",
    "labelers": "manage labelers of a label store: add NAME [--admin] prints a sign-in token; list; revoke NAME",
    "train-sft": "supervised fine-tuning of the initial policy on prompt/response pairs (JSONL) for train-policy "
    "to start from",
    "train-dpo": "train the policy directly on the label store's best-of-N or pairwise labels with DPO (pairwise or "
    "Plackett-Luce listwise loss; the initial policy is the reference), no reward model",
    "train-policy": "fine-tune the policy with PPO against a reward model (trained first unless given) or a reward "
    "function",
    "evaluate": "a trained policy on held-out prompts beside its reference: the true reward or a reward model's "
    "score (mean +/- s.e.) and the KL from the reference; report.md, results.json, samples.jsonl, a plot",
    "push": "upload a finished run's policy and reward model, with their model cards, to the Hugging Face hub",
}


# flags whose empty value means "none" (`experiment kl-frontier --kl-targets ""`: no target arms); every other flag
# given empty is refused, not read as its default
EMPTY_MEANS_NONE = frozenset({"--kl-targets"})


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UserErrors: one line and exit 2 like every other bad input (argparse itself
    prints the usage block first)."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")

    def _get_value(self, action, arg_string):
        """Every flag's value, refused here for every flag at once where it is empty (`--hub-dir "$UNSET"` read as no
        --hub-dir, and uploaded) or an integer past torch's int64 (an OverflowError wherever torch first read it)."""
        from lmprefs.config.validate import INT_MAX

        if action.option_strings and not arg_string.strip() and not set(action.option_strings) & EMPTY_MEANS_NONE:
            raise argparse.ArgumentError(action, f"{arg_string!r} is empty; give a value, or leave the flag out")
        v = super()._get_value(action, arg_string)
        if isinstance(v, int) and not isinstance(v, bool) and not -INT_MAX <= v <= INT_MAX:
            raise argparse.ArgumentError(action, f"{arg_string}: past the 64-bit integers torch computes with")
        return v


def command_parser(cmd: str, usage: str | None = None) -> ArgumentParser:
    return ArgumentParser(prog=f"lmprefs {cmd}", description=COMMANDS[cmd], usage=usage)


def run_dir_for(given: str | None, cfg, command: str, preset: str, owner: str | None = None) -> Path:
    """The run directory from --run-dir, run.save_dir or a fresh default; refused when it, or a folder above it,
    is a file, and when a command other than `owner` (default: `command`) made it."""
    from lmprefs.data.chat import check_chat_template
    from lmprefs.runtime.runlog import default_run_dir

    check_chat_template(cfg.task)
    return output_dir(given or cfg.run.save_dir or default_run_dir(command, preset), "--run-dir", owner or command)


def help_with_config(parser: argparse.ArgumentParser, argv: list[str], default_preset: str, pairs=()) -> None:
    """--help: the command's flags, then the config keys by section (names only); --help-config [SECTION]: every
    config key (or one section's) with its value in the preset this command line names (`--preset NAME`, the
    positional preset or `--config FILE`) after its overrides, and its docstring."""
    from lmprefs.config.overrides import config_help, config_keys
    from lmprefs.config.schema import Config
    from lmprefs.runtime.resolve import resolve_config

    full = "--help-config" in argv
    if not full and "-h" not in argv and "--help" not in argv:
        return
    rest = [x for x in argv if x not in ("-h", "--help", "--help-config")]
    sections = [f.name for f in dataclasses.fields(Config)]
    after = argv[argv.index("--help-config") + 1 :] if full else []
    section = after[0] if after and after[0] in sections else None
    if section is not None:
        rest.remove(section)
    try:
        ns = parser.parse_known_args(rest)[0]
    except UserError:  # e.g. the positional preset is missing: show the default's values
        ns = argparse.Namespace()
    name = getattr(ns, "preset", None) or default_preset
    source = f"config file {ns.config}" if getattr(ns, "config", None) else f"preset {name}"
    source += " with the overrides given" if pairs else ""
    if full:
        print(config_help(resolve_config(name, list(pairs), getattr(ns, "config", None)), source, section))
    else:
        parser.print_help()
        print("\n" + config_keys(parser.prog.removeprefix("lmprefs "), source))
    raise SystemExit(0)


def preset_parser(cmd: str, argv: list[str]):
    """(parser, own argv, overrides) for commands of the form `lmprefs CMD PRESET [flags] [--section.key V]`."""
    from lmprefs.config.overrides import split_overrides

    argv, pairs = split_overrides(argv)
    p = command_parser(cmd)
    p.add_argument("preset", help="preset name (lmprefs presets lists them)")
    p.add_argument("--config", help="a saved config.json to start from instead of the preset")
    preset_name = next((a for a in argv if not a.startswith("-")), "tiny")
    return p, argv, pairs, preset_name


def resume_config(a, pairs):
    """(config, changes) for `train-policy --resume`: the run's own config.json, refusing what would change its math
    (another --config, overrides other than how often it logs and saves) unless --continue-after-andon, where the
    changes are the point (and are returned as 'key old -> new' lines)."""
    from lmprefs.config.diff import NOT_MATH, flat_config, math_changes
    from lmprefs.config.overrides import apply_overrides, to_dict
    from lmprefs.io.config_file import load_config

    if not a.run_dir:
        raise UserError("--resume needs --run-dir (the run to continue)")
    saved_path = Path(a.run_dir) / "config.json"
    if not saved_path.is_file():
        raise UserError(f"--resume: {a.run_dir} holds no run (no config.json); start without --resume")
    saved = load_config(saved_path)
    if a.config and to_dict(load_config(Path(a.config))) != to_dict(saved):
        diff = math_changes(flat_config(saved), flat_config(load_config(Path(a.config))))
        raise UserError(f"--resume --config {a.config}: differs from the run's config.json "
                        f"({'; '.join(diff[:3]) or 'logging'}); a resumed run keeps its config (drop --config, or "
                        "start a new --run-dir)")  # fmt: skip
    cfg = apply_overrides(saved, pairs)
    diff = math_changes(flat_config(saved), flat_config(cfg))
    if a.continue_after_andon:
        return cfg, diff
    if diff:
        raise UserError(f"--resume: {diff[0]} would change what the run computes; only "
                        f"{', '.join('--' + k.replace('_', '-') for k in NOT_MATH)} may change on resume (to continue"
                        " after an andon stop with a change, add --continue-after-andon)")  # fmt: skip
    return cfg, None


def parse_numbers(text: str, flag: str, kind=float) -> list:
    """The numbers of a comma-separated flag: at least one, no empty item, none twice (split_items)."""
    from lmprefs.config.overrides import split_items

    try:
        xs = [kind(x) for x in split_items(text, flag)]
    except ValueError:
        xs = []
    if not xs:
        raise UserError(f"{flag} {text!r}: expected comma-separated numbers like 1,2,4")
    twice = next((x for i, x in enumerate(xs) if x in xs[:i]), None)
    if twice is not None:
        raise UserError(f"{flag} {text!r}: {twice:g} is given twice")
    return xs

def seed_arg(text: str) -> int:
    """argparse type of a --seed flag: an integer in run.seed's range (torch takes no seed past 64 bits, and reads a
    negative one as another seed without a word)."""
    from lmprefs.config.validate import SEED_MAX

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 to {SEED_MAX}")
    return v


def check_seeds_and_eval(a: argparse.Namespace) -> None:
    """An experiment's --seeds, --eval-queries and --eval-samples, each refused in one line when out of range."""
    if a.seeds < 1:
        raise UserError(f"--seeds {a.seeds}: must be at least 1")
    if a.eval_queries is not None and a.eval_queries < 2:
        raise UserError(f"--eval-queries {a.eval_queries}: must be at least 2")
    if a.eval_samples < 1:
        raise UserError(f"--eval-samples {a.eval_samples}: must be at least 1")


def main_rank() -> bool:
    """Whether this process prints the summary: rank 0 of a launch, or the only process."""
    return os.environ.get("RANK", "0") == "0"


def given_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests of the options that argv gives (`--flag V` or `--flag=V`), as opposed to their defaults."""
    return {act.dest for act in parser._actions for opt in act.option_strings
            if any(x == opt or x.startswith(opt + "=") for x in argv)}  # fmt: skip


def experiment_setup(run_dir: Path, owner: str, preset_name: str, pairs, flags: dict, given: set[str],
                     fixed: bool = False):  # fmt: skip
    """(config, flags, on_start) of an experiment in run_dir (`owner`: "experiment NAME", recorded as the command
    that made it). A new one runs with the preset, the overrides and its flags as given; on_start writes them
    (experiment-config.json, experiment-args.json) once every input has been checked. An existing one resumes: its
    command line may be given again (overrides that leave its math as it is, as `train-policy --resume` allows),
    flags not given keep their saved values, and flags given anew replace them unless `fixed` (then a flag given
    with another value is refused), saved as the run's own once it finishes (save_experiment_flags)."""
    import json

    from lmprefs.config.diff import flat_config, math_changes
    from lmprefs.config.overrides import apply_overrides
    from lmprefs.io.config_file import load_config, save_config
    from lmprefs.runtime.resolve import check_runnable, resolve_config

    cfg_file, args_file = run_dir / "experiment-config.json", run_dir / "experiment-args.json"
    if not cfg_file.exists():
        cfg = resolve_config(preset_name, pairs)

        def on_start() -> None:
            claim(run_dir, owner)
            save_config(cfg, cfg_file)
            save_experiment_flags(run_dir, flags)

        return cfg, flags, on_start
    saved_cfg = load_config(cfg_file)
    cfg = apply_overrides(saved_cfg, list(pairs))
    diff = math_changes(flat_config(saved_cfg), flat_config(cfg))
    if diff:
        raise UserError(f"{run_dir} is an existing experiment: {diff[0]} would change what it computes; rerun it "
                        "with its own command line, or choose another --run-dir")  # fmt: skip
    check_runnable(cfg)
    saved = json.loads(args_file.read_text()) if args_file.exists() else {}
    if not args_file.exists():  # stopped between its two files: the flags of this command line are its own
        save_experiment_flags(run_dir, flags)
    changed = [k for k in flags if k in given and k in saved and flags[k] != saved[k]]
    if fixed and changed:
        k = changed[0]
        raise UserError(f"{run_dir} is an existing experiment started with --{k.replace('_', '-')} {saved[k]}, not "
                        f"{flags[k]}; rerun it with its own command line, or choose another --run-dir")  # fmt: skip
    flags = {k: flags[k] if k in given or k not in saved else saved[k] for k in flags}
    print(f"resuming {run_dir}", flush=True)
    return cfg, flags, lambda: claim(run_dir, owner)


def save_experiment_flags(run_dir: Path, flags: dict) -> None:
    """experiment-args.json: an experiment's flags, written when it starts and again once it has finished, when the
    flags it ran with (its saved ones and those given anew) become its own, so that a bare rerun reports every arm
    this one did. Not in between: a run refused or killed keeps the flags of the last one that finished."""
    import json

    from lmprefs.io.atomic import atomic_write_text

    atomic_write_text(run_dir / "experiment-args.json", json.dumps(flags))


def random_questions_only(cfg, command: str) -> None:
    """Refuse labels.select other than random in a command that labels with random questions only, rather than
    ask random ones under a setting that says otherwise."""
    if cfg.labels.select != "random":
        raise UserError(f"labels.select={cfg.labels.select}: {command} asks random questions; directed selection "
                        "runs in `lmprefs label`, `train-policy --online` and `lmprefs rank-queue`")  # fmt: skip
