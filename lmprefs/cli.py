"""`lmprefs COMMAND ...`: the command line. Each command imports its heavy modules only when it runs.

Config overrides are dotted flags (`--ppo.lr 2e-5`) applied to a preset; a command's own flags are plain
(`--n 4`). A user's mistake (UserError) prints one line and exits 2; nothing else is caught.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.overrides import resolve_config

COMMANDS = {
    "experiment": "mock-sentiment: Figure 2 (reward models from N labels vs direct access, over seeds); kl-frontier: "
    "Figure 3 (KL vs true reward of PPO runs beside the optimal policy); writing-prompts: SFT, a reward model from "
    "scores, PPO with a separate value model; resumable",
    "quickstart": "the paper's mock-sentiment experiment end to end: label, reward model, PPO, evaluation, report",
    "assets": "list or prepare the offline assets (SmolLM2, the GPT-2 BPE, Austen)",
    "sample": "print queries and sampled continuations from the initial model or a trained policy",
    "presets": "list the presets, or print one preset's full config (after --section.key overrides)",
    "config": "print the resolved config of a preset (or --config FILE) with --section.key overrides, as JSON",
    "label": "sample best-of-N comparisons from the initial policy and have a simulated labeler judge them",
    "import-labels": "import a label file (the original's JSON, TRL pairwise JSONL, text JSONL, "
    "summarize-from-feedback comparisons, per-response scores) into a label store",
    "export-labels": "export a label store to a label file",
    "train-reward": "train a reward model from the label store (or a label file) and report held-out accuracy",
    "score": "score texts (stdin or a file) with a trained reward model",
    "serve": "run the labeling web app over a label store (127.0.0.1 by default)",
    "labelers": "manage labelers of a label store: add NAME [--admin] prints a sign-in token; list",
    "train-sft": "supervised fine-tuning of the initial policy on prompt/response pairs (JSONL) for train-policy "
    "to start from",
    "train-policy": "fine-tune the policy with PPO against a reward model (trained first unless given) or a reward "
    "function",
}


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are UserErrors: one line and exit 2 like every other bad input (argparse itself
    prints the usage block first)."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")


def _parser(cmd: str, usage: str | None = None) -> argparse.ArgumentParser:
    return ArgumentParser(prog=f"lmprefs {cmd}", description=COMMANDS[cmd], usage=usage)


def _run_dir(given: str | None, cfg, command: str, preset: str) -> Path:
    """The run directory from --run-dir, run.save_dir or a fresh default; refused when it names a file."""
    from lmprefs.runlog import default_run_dir

    run_dir = Path(given or cfg.run.save_dir or default_run_dir(command, preset))
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: is a file, not a directory")
    if not run_dir.exists() and run_dir.parent.exists() and not run_dir.parent.is_dir():
        raise UserError(f"--run-dir {run_dir}: {run_dir.parent} is a file, not a directory")
    return run_dir


def _help_with_config(parser: argparse.ArgumentParser, argv: list[str], default_preset: str, pairs=()) -> None:
    """--help: the command's flags, then every config key with its value in the preset this command line names
    (`--preset NAME`, the positional preset or `--config FILE`) after its overrides."""
    if "-h" not in argv and "--help" not in argv:
        return
    rest = [x for x in argv if x not in ("-h", "--help")]
    try:
        ns = parser.parse_known_args(rest)[0]
    except UserError:  # e.g. the positional preset is missing: show the default's values
        ns = argparse.Namespace()
    name = getattr(ns, "preset", None) or default_preset
    from lmprefs.overrides import config_help

    cfg = resolve_config(name, list(pairs), getattr(ns, "config", None))
    parser.print_help()
    source = f"config file {ns.config}" if getattr(ns, "config", None) else f"preset {name}"
    print("\n" + config_help(cfg, source + (" with the overrides given" if pairs else "")))
    raise SystemExit(0)


# ---------------------------------------------------------------------------------------------------------------


def cmd_assets(argv: list[str]) -> int:
    from lmprefs import assets

    p = _parser("assets")
    p.add_argument("action", choices=["list", "prepare"], help="list the assets, or prepare (download/convert) them")
    p.add_argument("names", nargs="*", help="assets to prepare (default: all)")
    a = p.parse_args(argv)
    if a.action == "list":
        print(f"cache: {assets.cache_dir()}  (set LMPREFS_CACHE to move it)")
        for name, (desc, _) in assets.ASSETS.items():
            print(f"  {name:16s} {assets.asset_status(name):13s} {desc}")
        return 0
    for name in a.names or list(assets.ASSETS):
        if name not in assets.ASSETS:
            raise assets.AssetError(f"unknown asset {name!r}; assets: {', '.join(assets.ASSETS)}")
        print(f"preparing {name} ...", flush=True)
        print(f"  {name}: {assets.ASSETS[name][1]()}")
    return 0


def cmd_presets(argv: list[str]) -> int:
    import json

    from lmprefs.config import PRESETS
    from lmprefs.overrides import split_overrides, to_dict

    argv, pairs = split_overrides(argv)
    p = _parser("presets", "lmprefs presets [NAME [--config FILE] [--section.key VALUE ...]]")
    p.add_argument("name", nargs="?", help="print this preset's full config as JSON (after any overrides)")
    p.add_argument("--config", help="a saved config.json to start from instead of the preset")
    a = p.parse_args(argv)
    if a.name or a.config or pairs:
        print(json.dumps(to_dict(resolve_config(a.name or "", pairs, a.config)), indent=2))
    else:
        for name, (desc, _) in PRESETS.items():
            print(f"  {name:24s} {desc}")
    return 0


def cmd_config(argv: list[str]) -> int:
    """`lmprefs config PRESET [--section.key V ...]`: the resolved config, as `presets NAME` prints it."""
    from lmprefs.overrides import split_overrides

    rest, pairs = split_overrides(argv)
    if not rest and not pairs and "--config" not in argv:
        raise UserError("name a preset (lmprefs presets lists them) or pass --config FILE")
    return cmd_presets(argv)


def cmd_sample(argv: list[str]) -> int:
    from lmprefs.overrides import split_overrides

    argv, pairs = split_overrides(argv)
    p = _parser("sample", "lmprefs sample [RUN_DIR] [--preset NAME] [--n N] [--temperature T] [--section.key V ...]")
    p.add_argument("run_dir", nargs="?", help="a train-policy run directory (default: the preset's initial model)")
    p.add_argument("--preset", default="austen-sentiment", help="preset naming the task and initial model")
    p.add_argument("--n", type=int, default=4, help="number of queries to continue")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the task's; the original's sample.py used 1.0 for runs)")
    p.add_argument("--seed", type=int, default=None, help="seed (default: run.seed)")
    p.add_argument("--split", choices=["train", "heldout"], default="heldout", help="which queries to draw from")
    _help_with_config(p, argv, "austen-sentiment", pairs)
    a = p.parse_args(argv)
    from lmprefs.generate import sample_cli

    return sample_cli(a, pairs)


def _preset_parser(cmd: str, argv: list[str]):
    """(parser, own argv, overrides) for commands of the form `lmprefs CMD PRESET [flags] [--section.key V]`."""
    from lmprefs.overrides import split_overrides

    argv, pairs = split_overrides(argv)
    p = _parser(cmd)
    p.add_argument("preset", help="preset name (lmprefs presets lists them)")
    p.add_argument("--config", help="a saved config.json to start from instead of the preset")
    preset_name = next((a for a in argv if not a.startswith("-")), "tiny")
    return p, argv, pairs, preset_name


def cmd_label(argv: list[str]) -> int:
    from lmprefs.config import LABELERS

    p, argv, pairs, name = _preset_parser("label", argv)
    p.add_argument("--db", default="labels.sqlite", help="label store (SQLite file; created if missing)")
    # --questions: torchrun's own parser takes `--n` for an abbreviation of its options and stops the launch
    p.add_argument("--n", "--questions", dest="n", type=int, default=1000,
                   help="questions to sample and label (under torchrun spell it --questions)")
    p.add_argument("--labeler", default=None, choices=list(LABELERS),
                   help="simulated labeler (default labels.labeler); none only queues the questions for people")
    p.add_argument("--seed", type=int, default=None, help="seed for the queries and samples (default run.seed)")
    _help_with_config(p, argv, name, pairs)
    a = p.parse_args(argv)
    from lmprefs.labels.store import check_store_path
    from lmprefs.pipeline import collect_labels, open_store, setup_task

    if a.n <= 0:
        raise UserError(f"--n {a.n}: must be positive")
    from lmprefs import distributed as dist

    cfg = resolve_config(a.preset, pairs, a.config)
    check_store_path(a.db, must_exist=False)
    if (a.labeler or cfg.labels.labeler) != "none":
        from lmprefs.labels.labelers import score_fn

        score_fn(a.labeler or cfg.labels.labeler)  # the judge's assets are there before the store is created
    task = setup_task(cfg)
    # created only now (a bad value above leaves no file behind), and by rank 0, which writes every rank's questions
    store = open_store(a.db) if dist.is_main() else None
    out = collect_labels(task, store, a.n, labeler=a.labeler, seed=a.seed)
    if not dist.is_main():
        return 0
    print(f"{out['items']} questions sampled in {out['sample_seconds']:.0f}s; {out['labels_added']} labels by "
          f"{out['labeler']} in {a.db} (store now: {store.table_counts()})")  # fmt: skip
    return 0


def cmd_import_labels(argv: list[str]) -> int:
    p = _parser("import-labels")
    p.add_argument("file", help="label file: the original's JSON, TRL pairwise JSONL, text comparisons JSONL, "
                   "summarize-from-feedback comparisons JSONL, or per-response scores JSONL")
    p.add_argument("--db", default="labels.sqlite", help="label store to import into (SQLite; created if missing)")
    p.add_argument("--format", default="auto",
                   choices=["auto", "openai", "pairs", "comparisons", "summarize", "scores"],
                   help="file format (auto: by extension and content); summarize: summarize-from-feedback "
                   "comparisons, labeler = worker, split kept; scores: per-response scores, {prompt, response, "
                   "score} JSONL, as scalar_rating labels")  # fmt: skip
    p.add_argument("--labeler", default="import", help="labeler name recorded for the imported labels")
    p.add_argument("--json", action="store_true", help="print the import report as one JSON object")
    a = p.parse_args(argv)
    import dataclasses
    import json

    from lmprefs.labels.formats import LabelFileError, import_file
    from lmprefs.labels.store import check_store_path
    from lmprefs.pipeline import open_store

    if not Path(a.file).is_file():
        what = "is a directory, not a file" if Path(a.file).is_dir() else "does not exist"
        raise UserError(f"label file {a.file} {what}")
    created = not check_store_path(a.db, must_exist=False).exists()
    try:
        r = import_file(open_store(a.db), a.file, format=a.format, labeler=a.labeler)
    except LabelFileError as e:
        if created:  # a rejected file leaves no empty store behind
            for suffix in ("", "-wal", "-shm"):
                Path(a.db + suffix).unlink(missing_ok=True)
        raise UserError(str(e)) from None
    if a.json:
        print(json.dumps(dataclasses.asdict(r) | {"db": a.db}))
    else:
        print(f"imported {r.rows} rows ({r.format}, {', '.join(r.label_types) or 'no labels'}) from {r.path} into "
              f"{a.db}: {r.items_added} new items ({r.items_present} already there), {r.labels_added} new labels "
              f"({r.labels_present} already there)")  # fmt: skip
    return 0


def cmd_export_labels(argv: list[str]) -> int:
    p = _parser("export-labels")
    p.add_argument("file", help="label file to write (replaced atomically)")
    p.add_argument("--db", default="labels.sqlite", help="label store to read (SQLite; must exist)")
    p.add_argument("--format", default="auto", choices=["auto", "openai", "pairs", "comparisons"],
                   help="auto: .json -> openai (GPT-2 ids, best_of_4), .jsonl -> comparisons (text, every label "
                   "type); pairs: TRL's prompt/chosen/rejected JSONL")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    a = p.parse_args(argv)
    import json

    from lmprefs.labels.formats import LabelFileError, export_file
    from lmprefs.labels.store import LabelStore, check_store_path

    out = Path(a.file)
    if out.is_dir():
        raise UserError(f"export file {out} is a directory; give a file name")
    if not out.parent.is_dir():
        raise UserError(f"export file {out}: folder {out.parent} does not exist")
    fmt = a.format
    if fmt == "auto":
        fmt = {".json": "openai", ".jsonl": "comparisons"}.get(out.suffix)
        if fmt is None:
            raise UserError(f"export file {out}: cannot tell the format from {out.suffix or 'no extension'!r}; "
                            "name it .json or .jsonl, or pass --format")  # fmt: skip
    store = LabelStore(check_store_path(a.db, must_exist=True))
    try:
        n = export_file(store, out, format=fmt)
    except LabelFileError as e:
        raise UserError(str(e)) from None
    if a.json:
        print(json.dumps({"rows": n, "format": fmt, "path": str(out), "db": a.db}))
    else:
        print(f"exported {n} rows ({fmt}) from {a.db} to {out}")
    return 0


def cmd_train_reward(argv: list[str]) -> int:
    p, argv, pairs, name = _preset_parser("train-reward", argv)
    p.add_argument("--db", default=None, help="label store to train from (default labels.source, else labels.sqlite)")
    p.add_argument("--run-dir", default=None, help="output directory (default runs/train-reward-PRESET-TIME)")
    _help_with_config(p, argv, name, pairs)
    a = p.parse_args(argv)
    from lmprefs import distributed as dist
    from lmprefs.pipeline import label_source, setup_task, train_reward_model
    from lmprefs.runlog import open_logger

    cfg = resolve_config(a.preset, pairs, a.config)
    run_dir = _run_dir(a.run_dir, cfg, "train-reward", a.preset)
    store = label_source(a.db or cfg.labels.source or "labels.sqlite")
    log = open_logger(run_dir, cfg)
    _, summary = train_reward_model(setup_task(cfg), store, run_dir / "reward_model", log)
    log.close()
    if not dist.is_main():
        return 0
    print(f"reward model: {run_dir / 'reward_model'}")
    print(f"  trained on {summary['labels_train']} labels in {summary['seconds']:.0f}s; held-out "
          f"({summary['labels_heldout']} labels, {summary['heldout/split'] or 'none'}): "
          f"accuracy {summary.get('heldout/accuracy', float('nan')):.3f} "
          f"(before training {summary.get('initial_heldout/accuracy', float('nan')):.3f}), "
          f"loss {summary.get('heldout/loss', float('nan')):.3f}"
          + (f", score correlation {summary['heldout/corr']:.3f}" if "heldout/corr" in summary else ""))  # fmt: skip
    from lmprefs.labels.quality import describe_labelers

    weighted = cfg.labels.weight_by_gold
    print(f"  labels per labeler (before the held-out split): {describe_labelers(summary['labelers'], weighted)}")
    return 0


def cmd_score(argv: list[str]) -> int:
    usage = "lmprefs score --reward-model DIR [FILE]  (one text per line; '\\t' separates query and response)"
    p = _parser("score", usage)
    p.add_argument("file", nargs="?", help="texts, one per line (default: stdin)")
    p.add_argument("--reward-model", required=True, help="a reward-model directory saved by train-reward")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    p.add_argument("--truncate", action="store_true",
                   help="cut texts to the trained query/response lengths (default: score whole texts, up to the "
                   "model's context, with a warning for texts longer than the training ones)")  # fmt: skip
    a = p.parse_args(argv)
    from lmprefs.scoring import score_cli

    return score_cli(a)


def cmd_train_sft(argv: list[str]) -> int:
    p, argv, pairs, name = _preset_parser("train-sft", argv)
    p.add_argument("--run-dir", default=None, help="output directory (default runs/train-sft-PRESET-TIME)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    p.usage = "lmprefs train-sft PRESET --sft.data PAIRS.jsonl [--run-dir D] [--resume] [--section.key V ...]"
    _help_with_config(p, argv, name)
    a = p.parse_args(argv)
    from lmprefs.checkpoint import run_lock
    from lmprefs.runlog import RunLogger
    from lmprefs.training.sft import checkpoint_step, read_pairs, train_sft

    if a.resume:
        if not a.run_dir or pairs:
            raise UserError("--resume needs --run-dir and continues with the run's saved config (no overrides)")
        cfg = resolve_config(a.preset, [], str(Path(a.run_dir) / "config.json"))
    else:
        cfg = resolve_config(a.preset, pairs, a.config)
    if not cfg.sft.data:
        raise UserError("train-sft needs prompt/response pairs: --sft.data FILE.jsonl (fields prompt and response, or "
                        "TRL's prompt and completion)")  # fmt: skip
    run_dir = _run_dir(a.run_dir, cfg, "train-sft", a.preset)
    if (run_dir / "sft_model").exists():
        raise UserError(f"{run_dir} already holds an SFT model; choose another --run-dir")
    if not a.resume and (run_dir / "checkpoint").exists():
        raise UserError(f"{run_dir} already holds an SFT run; pass --resume to continue it, or another --run-dir")
    read_pairs(cfg.sft.data)  # bad data fails here, before a run directory is made
    with run_lock(run_dir):
        step = checkpoint_step(run_dir) if a.resume else None
        if a.resume and step is None:
            raise UserError(f"{run_dir} has no SFT checkpoint to resume")
        log = RunLogger(run_dir, cfg, resume_step=step, resume_phase="sft")
        try:
            s = train_sft(cfg, run_dir / "sft_model", log, run_dir=run_dir, resume=a.resume)
        finally:
            log.close()
    print(f"SFT model: {run_dir / 'sft_model'}  ({s['sft/pairs']} pairs, {s['sft/steps']} steps in "
          f"{s['sft/seconds']:.0f}s; response loss {s['sft/initial_loss']:.3f} -> {s['sft/final_loss']:.3f} "
          "nats/token)")
    print(f"  PPO from it: lmprefs train-policy {a.preset} --task.initial-model {run_dir / 'sft_model'}")
    return 0


def cmd_train_policy(argv: list[str]) -> int:
    p, argv, pairs, name = _preset_parser("train-policy", argv)
    p.add_argument("--reward", default=None,
                   help="model (default: a reward model), or a reward on response texts: vader, descriptiveness, "
                   "or module:function of your own (list[str] -> list[float]; normalized like a reward model)")
    p.add_argument("--db", default=None, help="label store for training the reward model (default labels.source)")
    p.add_argument("--run-dir", default=None, help="output directory (default runs/train-policy-PRESET-TIME)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    p.add_argument("--continue-after-andon", action="store_true",
                   help="with --resume: continue a run the andon cord stopped from its last good checkpoint, with the "
                        "config changes given (e.g. --ppo.lr 5e-5; recorded in run.json)")
    p.add_argument("--online", action="store_true",
                   help="ask for judgments on the current policy's samples while training and retrain the reward "
                   "model")  # fmt: skip
    p.add_argument("--labeler", default=None,
                   help="online: a simulated labeler (vader, descriptiveness) answers the queue; default: people via "
                   "serve")  # fmt: skip
    _help_with_config(p, argv, name, pairs)
    a = p.parse_args(argv)
    from lmprefs.pipeline import run_train_policy
    from lmprefs.training.policy import AndonStop

    changes = None
    if a.resume:
        cfg, changes = _resume_config(a, pairs)
    elif a.continue_after_andon:
        raise UserError("--continue-after-andon goes with --resume --run-dir D")
    else:
        cfg = resolve_config(a.preset, pairs, a.config)
    run_dir = _run_dir(a.run_dir, cfg, "train-policy", a.preset)
    try:
        out = run_train_policy(cfg, run_dir, reward=a.reward, store_path=a.db, resume=a.resume, online=a.online,
                               labeler=a.labeler, preset=a.preset, changes=changes)  # fmt: skip
    except AndonStop as e:
        print(f"lmprefs train-policy: {e}", file=sys.stderr)
        return 3
    s = out["stats"]
    if not _main_rank():
        return 0
    if "online_summary" in out:
        print("reward models of this run:\n" + out["online_summary"])
    print(f"policy: {run_dir / 'policy'}  (score {s.get('objective/score', float('nan')):+.3f}, "
          f"kl {s.get('objective/kl', float('nan')):.2f}, "
          f"beta {s.get('objective/kl_coef', float('nan')):.3f})")  # fmt: skip
    return 0


def _resume_config(a, pairs):
    """(config, changes) for `train-policy --resume`: the run's own config.json, refusing what would change its math
    (another --config, overrides other than how often it logs and saves) unless --continue-after-andon, where the
    changes are the point (and are returned as 'key old -> new' lines)."""
    from lmprefs.checkpoint import NOT_MATH, flat_config, math_changes
    from lmprefs.overrides import apply_overrides, load_config, to_dict

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


def cmd_serve(argv: list[str]) -> int:
    from lmprefs.server.cli import cmd_serve as run

    return run(argv)


def cmd_labelers(argv: list[str]) -> int:
    from lmprefs.server.cli import cmd_labelers as run

    return run(argv)


def cmd_quickstart(argv: list[str]) -> int:
    from lmprefs.overrides import split_overrides

    argv, pairs = split_overrides(argv)
    p = _parser("quickstart", "lmprefs quickstart [--preset NAME] [--run-dir DIR] [--section.key VALUE ...]")
    p.add_argument("--preset", default="quickstart", help="preset (default: quickstart, SmolLM2 + Austen + VADER)")
    p.add_argument("--run-dir", default=None, help="output directory (default runs/quickstart-PRESET-TIME)")
    p.add_argument("--eval-queries", type=int, default=256, help="held-out queries for the true-reward evaluation")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out query")
    _help_with_config(p, argv, "quickstart", pairs)
    a = p.parse_args(argv)
    from lmprefs.quickstart import chance, run_quickstart, true_reward_name
    from lmprefs.training.policy import AndonStop

    if a.eval_queries < 2 or a.eval_samples < 1:
        raise UserError("--eval-queries must be >= 2 and --eval-samples >= 1")
    cfg = resolve_config(a.preset, pairs)
    run_dir = _run_dir(a.run_dir, cfg, "quickstart", a.preset)
    if (run_dir / "report.md").exists() or (run_dir / "labels.sqlite").exists():
        raise UserError(f"{run_dir} already holds a quickstart run; choose another --run-dir")
    try:
        out = run_quickstart(cfg, run_dir, a.eval_queries, a.eval_samples)
    except AndonStop as e:
        print(f"lmprefs quickstart: {e}", file=sys.stderr)
        return 3
    if not _main_rank():
        return 0
    b, f, st = out["before"], out["after"], out["figures"]
    se = (b["stderr"] ** 2 + f["stderr"] ** 2) ** 0.5
    print(f"\nreward model held-out accuracy: {st['rm_accuracy']:.3f} (chance {chance(cfg):.2f})")
    print(f"true reward ({true_reward_name(cfg.labels.labeler)}) on {f['n_queries']} held-out queries: "
          f"{b['mean']:+.4f} +/- {b['stderr']:.4f} -> "
          f"{f['mean']:+.4f} +/- {f['stderr']:.4f} ({(f['mean'] - b['mean']) / se if se else float('nan'):+.1f} s.e.)")
    print(f"final KL {st['kl_heldout']:.2f} nats on the held-out samples (target {cfg.rewards.kl_target}; last "
          f"training batch {st['kl']:.2f}), beta {st['beta']:.4f}; "
          f"total {sum(out['stages'].values()):.0f}s")
    print(f"report: {out['report']}")
    return 0


def _numbers(text: str, flag: str, kind=float) -> list:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected comma-separated numbers like 1,2,4") from None


def cmd_experiment(argv: list[str]) -> int:
    from lmprefs.overrides import split_overrides

    if argv[:1] == ["writing-prompts"]:
        return _writing_prompts(argv[1:])
    argv, pairs = split_overrides(argv)
    p = _parser("experiment", "lmprefs experiment {mock-sentiment,kl-frontier,writing-prompts} [PRESET] "
                "[--run-dir DIR] [...]")  # fmt: skip
    p.add_argument("name", choices=["mock-sentiment", "kl-frontier", "writing-prompts"],
                   help="mock-sentiment: the paper's Figure 2 (reward models from N labels vs direct access); "
                   "kl-frontier: Figure 3 (KL vs true reward of PPO runs beside the optimal policy); writing-prompts: "
                   "SFT, a reward model from scores and PPO with a separate value model (lmprefs experiment "
                   "writing-prompts --help)")  # fmt: skip
    p.add_argument("preset_arg", nargs="?", metavar="PRESET", help="preset every arm starts from (default quickstart)")
    p.add_argument("--preset", default=None, help="the same as PRESET")
    p.add_argument("--run-dir", default=None, help="directory (an existing one resumes)")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out query for each PPO arm")
    g = p.add_argument_group("mock-sentiment")
    g.add_argument("--labels", default="250,1000,4000", help="label counts of the reward-model arms")
    g.add_argument("--seeds", type=int, default=1, help="seeds of every arm (reward-model init, label subset, PPO)")
    g.add_argument("--eval-queries", type=int, default=256, help="held-out queries for the true-reward evaluation")
    g = p.add_argument_group("kl-frontier")
    g.add_argument("--queries", type=int, default=64, help="Q: held-out queries for the frontier and the PPO arms")
    g.add_argument("--samples", type=int, default=256, help="M: samples of the initial policy per query")
    g.add_argument("--betas", default=None, help="beta grid of the optimal frontier (default 25 from 0.01 to 10)")
    g.add_argument("--kl-targets", default="1,2,4,6", help="PPO arms with the adaptive KL controller at these targets")
    g.add_argument("--kl-coefs", default="", help="PPO arms with a fixed KL coefficient (beta) each")
    g.add_argument("--true-reward", default=None, help="true reward: vader, descriptiveness or module:function "
                   "(default labels.labeler)")  # fmt: skip
    g.add_argument("--min-ess", type=float, default=10.0, help="frontier points with a smaller mean effective "
                   "sample size are marked as not trusted")  # fmt: skip
    g.add_argument("--figure2", default=None, help="a mock-sentiment run directory whose arms are added as points")
    _help_with_config(p, argv, "quickstart", pairs)
    a = p.parse_args(argv)
    if a.preset and a.preset_arg and a.preset != a.preset_arg:
        raise UserError(f"preset given twice: {a.preset_arg} and --preset {a.preset}")
    preset_name = a.preset or a.preset_arg or "quickstart"
    if a.name == "writing-prompts":  # its own flags: parsed when it comes first
        raise UserError("writing-prompts: put it right after `experiment` (lmprefs experiment writing-prompts --help)")
    other = {"mock-sentiment": ("--queries", "--samples", "--betas", "--kl-targets", "--kl-coefs", "--true-reward",
                                "--min-ess", "--figure2"),
             "kl-frontier": ("--labels", "--seeds", "--eval-queries")}[a.name]  # fmt: skip
    given = [f for f in other if any(x == f or x.startswith(f + "=") for x in argv)]
    if given:
        raise UserError(f"{given[0]} is not an option of `experiment {a.name}` (see lmprefs experiment --help)")
    from lmprefs import experiment

    if a.eval_samples < 1:
        raise UserError(f"--eval-samples {a.eval_samples}: must be at least 1")
    run_dir = _run_dir(a.run_dir, resolve_config(preset_name, []), "experiment", a.name)
    cfg_file = run_dir / "experiment-config.json"
    if cfg_file.exists():  # resuming: the saved config wins
        if pairs:
            raise UserError(f"{run_dir} is an existing experiment; drop the --section.key overrides to resume it")
        cfg = resolve_config(preset_name, [], str(cfg_file))
    else:
        cfg = resolve_config(preset_name, pairs)

    def on_start():  # every input checked: now the run directory may be written
        if not cfg_file.exists():
            from lmprefs.overrides import save_config

            run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, cfg_file)

    if a.name == "mock-sentiment":
        counts = sorted(set(_numbers(a.labels, "--labels", int)))
        if not counts or counts[0] <= 0:
            raise UserError(f"--labels {a.labels!r}: label counts must be positive")
        if a.seeds < 1:
            raise UserError(f"--seeds {a.seeds}: must be at least 1")
        if a.eval_queries < 2:
            raise UserError(f"--eval-queries {a.eval_queries}: must be at least 2")
        out = experiment.run_mock_sentiment(cfg, run_dir, counts, a.eval_queries, a.eval_samples, a.seeds, on_start)
        for k, v in {"initial": out["results"]["initial"], **out["results"]["summary"]}.items():
            print(f"  {k:12s} true reward {v['mean']:+.4f} +/- {v['stderr']:.4f}, KL {v['kl']:.2f} +/- "
                  f"{v['kl_stderr']:.2f}" + (f" ({v['seeds']} seeds)" if v.get("seeds", 1) > 1 else ""))
    else:
        from lmprefs.frontier import DEFAULT_BETAS

        betas = _numbers(a.betas, "--betas") if a.betas is not None else list(DEFAULT_BETAS)
        bad = [b for b in betas if not b > 0 or b == float("inf")]
        if not betas or bad:
            raise UserError(f"--betas {a.betas!r}: every beta must be a positive number" + (f" (not {bad[0]:g})"
                                                                                           if bad else ""))
        for flag, v in (("--queries", a.queries), ("--samples", a.samples)):
            if v < 2:
                raise UserError(f"{flag} {v}: must be at least 2 (a standard error needs two)")
        targets, coefs = _numbers(a.kl_targets, "--kl-targets"), _numbers(a.kl_coefs, "--kl-coefs")
        for flag, text, xs in (("--kl-targets", a.kl_targets, targets), ("--kl-coefs", a.kl_coefs, coefs)):
            if any(not 0 < x < float("inf") for x in xs):
                raise UserError(f"{flag} {text!r}: every value must be a positive number")
        if a.min_ess < 1:
            raise UserError(f"--min-ess {a.min_ess}: must be at least 1")
        out = experiment.run_kl_frontier(cfg, run_dir, queries=a.queries, samples=a.samples, betas=betas,
                                         kl_targets=targets, kl_coefs=coefs, eval_samples=a.eval_samples,
                                         true_reward=a.true_reward or cfg.labels.labeler, min_ess=a.min_ess,
                                         figure2=Path(a.figure2) if a.figure2 else None,
                                         on_start=on_start)  # fmt: skip
        res = out["results"]
        trusted = [p for p in res["frontier"]["points"] if p["trusted"]]
        if trusted:
            top = trusted[0]
            print(f"  optimal frontier: trusted up to KL {top['kl']:.2f} nats (reward {top['reward']:+.4f}, beta "
                  f"{top['beta']:g}, mean ESS {top['ess_mean']:.0f} of {a.samples})")  # fmt: skip
        for k, v in res.items():
            if k not in ("frontier", "figure2") and "mean" in v:
                print(f"  {k:14s} true reward {v['mean']:+.4f} +/- {v['stderr']:.4f} at KL {v['kl']:.2f} +/- "
                      f"{v['kl_stderr']:.2f}")  # fmt: skip
    print(f"figure: {out['figure']}")
    return 0


def _writing_prompts(argv: list[str]) -> int:
    from lmprefs.overrides import save_config, split_overrides

    argv, pairs = split_overrides(argv)
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
    _help_with_config(p, argv, "writing-prompts", pairs)
    a = p.parse_args(argv)
    from lmprefs.writing import run_writing_prompts

    if a.eval_queries < 2 or a.eval_samples < 1 or a.demo_prompts < 2 or a.demo_per_prompt < 2:
        raise UserError("--eval-queries, --demo-prompts and --demo-per-prompt must be >= 2, --eval-samples >= 1")
    if a.data is not None:
        if not Path(a.data).is_file():
            raise UserError(f"--data {a.data}: no such file (a JSONL of prompt, response, score)")
        import tempfile

        from lmprefs.labels.formats import LabelFileError, import_file
        from lmprefs.pipeline import open_store

        with tempfile.TemporaryDirectory() as tmp:  # a bad row is refused before the run directory is made
            try:
                import_file(open_store(Path(tmp) / "check.sqlite"), a.data, format="scores")
            except LabelFileError as e:
                raise UserError(str(e)) from None
    if a.true_reward is not None:
        from lmprefs.pipeline import reward_function

        reward_function(a.true_reward)  # an unknown name is refused before any work
    run_dir = _run_dir(a.run_dir, resolve_config(a.preset, []), "experiment", "writing-prompts")
    cfg_file, args_file = run_dir / "experiment-config.json", run_dir / "experiment-args.json"
    import json

    own = {"data": str(Path(a.data).resolve()) if a.data else None, "true_reward": a.true_reward,
           "eval_queries": a.eval_queries, "eval_samples": a.eval_samples, "demo_prompts": a.demo_prompts,
           "demo_per_prompt": a.demo_per_prompt}  # fmt: skip
    if cfg_file.exists():  # resuming: the same command line again, or no overrides (the saved config)
        from lmprefs.checkpoint import flat_config, math_changes

        cfg = resolve_config(a.preset, [], str(cfg_file))
        diff = math_changes(flat_config(cfg), flat_config(resolve_config(a.preset, pairs))) if pairs else []
        saved = json.loads(args_file.read_text()) if args_file.exists() else own
        diff += [f"--{k.replace('_', '-')} {saved[k]} -> {own[k]}" for k in own
                 if k in saved and own[k] != saved[k] and (k != "data" or a.data)]  # fmt: skip
        if diff:
            raise UserError(f"{run_dir} is an existing experiment started otherwise ({'; '.join(diff[:3])}); resume "
                            "it with the same command line, or choose another --run-dir")  # fmt: skip
        own = saved
        print(f"resuming {run_dir}", flush=True)
    else:
        cfg = resolve_config(a.preset, pairs)
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, cfg_file)
        from lmprefs.overrides import atomic_write_text

        atomic_write_text(args_file, json.dumps(own))
    out = run_writing_prompts(cfg, run_dir, data=own["data"], true_reward=own["true_reward"],
                              n_eval=own["eval_queries"], eval_samples=own["eval_samples"],
                              demo_prompts=own["demo_prompts"], demo_per_prompt=own["demo_per_prompt"])  # fmt: skip
    ev = out["results"]["evaluate"]
    if "true_ppo" in ev:
        print(f"true reward on {ev['n_queries']} held-out prompts: SFT {ev['true_sft']:+.4f} -> PPO "
              f"{ev['true_ppo']:+.4f} (gain {ev['gain']:+.4f} +/- {ev['gain_stderr']:.4f})")  # fmt: skip
    print(f"report: {out['report']}")
    return 0


HANDLERS = {"config": cmd_config, "experiment": cmd_experiment, "quickstart": cmd_quickstart, "serve": cmd_serve,
            "labelers": cmd_labelers, "train-policy": cmd_train_policy, "assets": cmd_assets, "sample": cmd_sample,
            "presets": cmd_presets, "label": cmd_label,
            "import-labels": cmd_import_labels, "export-labels": cmd_export_labels, "train-reward": cmd_train_reward,
            "score": cmd_score}  # fmt: skip
HANDLERS["train-sft"] = cmd_train_sft


def register(name: str, help_text: str, handler) -> None:
    COMMANDS[name] = help_text
    HANDLERS[name] = handler


# commands that run as N ranks under torchrun/accelerate; the others are single-process tools
DISTRIBUTED = {"label", "train-reward", "train-policy", "quickstart"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        from lmprefs import __version__

        print(f"lmprefs {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: lmprefs [--version] COMMAND [ARGS]   (lmprefs COMMAND --help for each)\n\ncommands:")
        for name, desc in COMMANDS.items():
            print(f"  {name:14s} {desc}")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in HANDLERS:
        import difflib

        near = difflib.get_close_matches(cmd, list(HANDLERS), n=1)
        print(f"lmprefs: error: unknown command {cmd!r}" + (f"; did you mean {near[0]!r}?" if near else ""),
              file=sys.stderr)  # fmt: skip
        return 2
    # under a launcher (torchrun sets RANK and WORLD_SIZE) join the process group; without one, torch is not even
    # imported here and nothing changes
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    where = f" (rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')})" if launched else ""
    try:
        if launched and cmd not in DISTRIBUTED and os.environ["WORLD_SIZE"] != "1":
            raise UserError(f"runs in one process; launch it without torchrun/accelerate (WORLD_SIZE="
                            f"{os.environ['WORLD_SIZE']}); these run on several: {', '.join(sorted(DISTRIBUTED))}")
        if launched and cmd in DISTRIBUTED:
            from lmprefs import distributed

            distributed.init()
        return HANDLERS[cmd](rest) or 0
    except UserError as e:
        print(f"lmprefs {cmd}: error{where}: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"lmprefs {cmd}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `lmprefs presets x | head`: the reader left; nothing to report
        sys.stderr.close()
        return 0
    except Exception as e:
        if not (launched and _is_dist_error(e)):
            raise
        # another rank died or stopped answering within LMPREFS_DIST_TIMEOUT: say which rank this is, in one line
        first = (str(e).strip().splitlines() or [""])[0][:300]
        print(f"lmprefs {cmd}: error{where}: lost contact with the other ranks ({type(e).__name__}: {first})",
              file=sys.stderr, flush=True)  # fmt: skip
        return 1
    finally:
        if launched and "lmprefs.distributed" in sys.modules:
            sys.modules["lmprefs.distributed"].teardown()


def _main_rank() -> bool:
    """Whether this process prints the summary: rank 0 of a launch, or the only process."""
    return os.environ.get("RANK", "0") == "0"


def _is_dist_error(e: BaseException) -> bool:
    import torch.distributed as td

    return isinstance(e, td.DistError) or (isinstance(e, RuntimeError) and "Connection closed by peer" in str(e))


if __name__ == "__main__":
    raise SystemExit(main())
