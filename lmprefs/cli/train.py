"""`lmprefs train-reward`, `train-sft`, `train-policy`, `train-dpo`."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from lmprefs.cli.common import help_with_config, main_rank, preset_parser, resume_config, run_dir_for
from lmprefs.errors import UserError


def cmd_train_reward(argv: list[str]) -> int:
    from lmprefs.runtime.resolve import resolve_config

    p, argv, pairs, name = preset_parser("train-reward", argv)
    p.add_argument("--db", default=None, help="label store to train from (default labels.source, else labels.sqlite)")
    p.add_argument("--run-dir", default=None, help="output directory (default runs/train-reward-PRESET-TIME)")
    help_with_config(p, argv, name, pairs)
    a = p.parse_args(argv)
    from lmprefs.io.locks import run_lock
    from lmprefs.pipeline.labeling import label_source
    from lmprefs.pipeline.reward_model import reward_logger, training_labels
    from lmprefs.pipeline.reward_training import train_reward_model
    from lmprefs.pipeline.task import setup_task
    from lmprefs.runtime import distributed as dist

    cfg = resolve_config(a.preset, pairs, a.config)
    run_dir = run_dir_for(a.run_dir, cfg, "train-reward", a.preset)
    _check_reward_run_dir(run_dir)
    store = label_source(a.db or cfg.labels.source or "labels.sqlite")
    t = setup_task(cfg)  # a bad model or query dataset is refused before the run directory is made
    labels = training_labels(t, store)  # and so is a store that cannot train
    # one process per run directory, as every other command: two would log into one metrics.jsonl and publish over
    # each other; the directory is checked again once held, for a run that finished while this one got ready
    with run_lock(run_dir, "train-reward") if dist.is_main() else contextlib.nullcontext():
        _check_reward_run_dir(run_dir)
        # a run killed before its reward model was published is started again by the same command: the rows and
        # events the killed attempt logged are dropped first, or the log would hold its steps twice
        log = reward_logger(run_dir, cfg)
        try:
            _, summary = train_reward_model(t, store, run_dir / "reward_model", log, labels=labels)
        finally:
            log.close()
    if not dist.is_main():
        return 0
    K = summary.get("ensemble", 1)
    print(f"reward model: {run_dir / 'reward_model'}" + (f" (an ensemble of {K}, scored by their mean; "
          f"held-out accuracy of each: {', '.join(_acc(s) for s in summary['members'])})" if K > 1 else ""))
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


def _acc(summary: dict) -> str:
    return f"{summary.get('heldout/accuracy', float('nan')):.3f}"


def _check_reward_run_dir(run_dir: Path) -> None:
    """Refuse a --run-dir whose reward model was published, or that holds another command's run: train-reward would
    replace either without a word."""
    if (run_dir / "reward_model").exists():
        raise UserError(f"{run_dir} already holds a reward model ({run_dir / 'reward_model'}); choose another "
                        "--run-dir")  # fmt: skip
    held = [name for name in ("run.json", "checkpoint", "policy", "sft_model") if (run_dir / name).exists()]
    if held:
        raise UserError(f"{run_dir} already holds a run ({held[0]}); choose another --run-dir")


def cmd_train_sft(argv: list[str]) -> int:

    p, argv, pairs, name = preset_parser("train-sft", argv)
    p.add_argument("--run-dir", default=None, help="output directory (default runs/train-sft-PRESET-TIME)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    p.usage = "lmprefs train-sft PRESET --sft.data DATA.jsonl [--run-dir D] [--resume] [--section.key V ...]"
    help_with_config(p, argv, name)
    a = p.parse_args(argv)
    from lmprefs.data.chat import check_chat_template
    from lmprefs.data.sft_data import check_first_conversation, read_sft_data
    from lmprefs.io.locks import run_lock
    from lmprefs.runtime.runlog import RunLogger
    from lmprefs.training.sft import checkpoint_step, resume_log_step, train_sft

    cfg = _saved_or_new_config(a, pairs)
    if not cfg.sft.data:
        raise UserError("train-sft needs prompt/response pairs or conversations: --sft.data FILE.jsonl (fields "
                        "prompt and response, TRL's prompt and completion, or messages)")  # fmt: skip
    run_dir = run_dir_for(a.run_dir, cfg, "train-sft", a.preset)
    if (run_dir / "sft_model").exists():
        if a.resume:  # a finished run resumed, as train-policy's: nothing to train, and not an error
            print(f"{run_dir} finished already: nothing to train; its SFT model is {run_dir / 'sft_model'}")
            return 0
        raise UserError(f"{run_dir} already holds an SFT model; choose another --run-dir")
    if not a.resume and (run_dir / "checkpoint").exists():
        raise UserError(f"{run_dir} already holds an SFT run; pass --resume to continue it, or another --run-dir")
    examples = read_sft_data(cfg.sft.data)  # bad data fails here, before a run directory is made
    check_chat_template(cfg.task)  # chat_template=true for a model without one, too
    check_first_conversation(examples, cfg.task)
    with run_lock(run_dir, "train-sft"):
        step = checkpoint_step(run_dir) if a.resume else None
        if a.resume and step is None:  # killed before its first checkpoint: over in place, as train-policy and DPO
            print(f"{run_dir} has no checkpoint yet: starting the run over from step 0", flush=True)
        # the rows a killed attempt logged past its checkpoint (every one, without a checkpoint) are dropped first, by
        # --resume or the same command again alike, or metrics.jsonl and logs/sft would hold those steps twice
        again = resume_log_step(run_dir) if step is not None else -1 if (run_dir / "metrics.jsonl").exists() else None
        log = RunLogger(run_dir, cfg, resume_step=again, resume_phase="sft")
        try:
            s = train_sft(cfg, run_dir / "sft_model", log, run_dir=run_dir, resume=step is not None)
        finally:
            log.close()
    print(f"SFT model: {run_dir / 'sft_model'}  ({s['sft/pairs']} rows, {s['sft/steps']} steps in "
          f"{s['sft/seconds']:.0f}s; response loss {s['sft/initial_loss']:.3f} -> {s['sft/final_loss']:.3f} "
          "nats/token)")
    print(f"  PPO from it: lmprefs train-policy {a.preset} --task.initial-model {run_dir / 'sft_model'}")
    return 0


def cmd_train_policy(argv: list[str]) -> int:
    from lmprefs.runtime.resolve import resolve_config

    p, argv, pairs, name = preset_parser("train-policy", argv)
    p.add_argument("--reward", default=None,
                   help="model (default: a reward model), or a reward on response texts: vader, descriptiveness, "
                   "or module:function of your own (list[str] -> list[float]; normalized like a reward model)")
    p.add_argument("--true-reward", default=None,
                   help="a reward the run is not trained on, logged as objective/true_reward and drawn in curves.png, "
                   "for ppo.overoptimization_stop to watch: vader, descriptiveness, faithfulness or module:function")
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
    help_with_config(p, argv, name, pairs)
    a = p.parse_args(argv)
    from lmprefs.pipeline.policy import run_train_policy
    from lmprefs.training.policy_run import AndonStop

    changes = None
    if a.resume:
        cfg, changes = resume_config(a, pairs)
    elif a.continue_after_andon:
        raise UserError("--continue-after-andon goes with --resume --run-dir D")
    else:
        cfg = resolve_config(a.preset, pairs, a.config)
        _check_start_flags(a, cfg, pairs)
    run_dir = run_dir_for(a.run_dir, cfg, "train-policy", a.preset)
    try:
        out = run_train_policy(cfg, run_dir, reward=a.reward, store_path=a.db, resume=a.resume, online=a.online,
                               labeler=a.labeler, preset=a.preset, changes=changes,
                               true_reward=a.true_reward)  # fmt: skip
    except AndonStop as e:
        print(f"lmprefs train-policy: {e}", file=sys.stderr)
        return 3
    s = out["stats"]
    if not main_rank():
        return 0
    if "online_summary" in out:
        print("reward models of this run:\n" + out["online_summary"])
    print(f"policy: {run_dir / 'policy'}  (score {s.get('objective/score', float('nan')):+.3f}, "
          f"kl {s.get('objective/kl', float('nan')):.2f}, "
          f"beta {s.get('objective/kl_coef', float('nan')):.3f})")  # fmt: skip
    return 0


def _check_start_flags(a, cfg, pairs) -> None:
    """Flags a new train-policy run would ignore without a word, refused: --labeler answers only --online's
    questions, --db only trains the reward model of a run that trains one, --reward replaces
    rewards.trained_model, and overrides that act only under another setting (inert_overrides). (A resumed run
    reuses its own and says so.)"""
    from lmprefs.config.validate import inert_overrides
    from lmprefs.pipeline.rewards import trains_reward_model

    if inert := inert_overrides(cfg, pairs):
        raise UserError(inert[0])
    if a.reward not in (None, "model") and cfg.rewards.trained_model:
        raise UserError(f"--reward {a.reward} and rewards.trained_model={cfg.rewards.trained_model} both give the "
                        "reward; give one")  # fmt: skip
    if a.labeler is not None and not a.online:
        raise UserError(f"--labeler {a.labeler}: answers the questions of --online; add --online, or drop --labeler")
    if a.db is not None and not a.online and not trains_reward_model(cfg, a.reward, False):
        source = (f"--reward {a.reward}" if a.reward not in (None, "model") else
                  f"rewards.trained_model={cfg.rewards.trained_model}")  # fmt: skip
        raise UserError(f"--db {a.db}: a label store trains a reward model, and this run trains none ({source} "
                        "gives the reward); drop --db")  # fmt: skip


def cmd_train_dpo(argv: list[str]) -> int:

    p, argv, pairs, name = preset_parser("train-dpo", argv)
    p.add_argument("--db", default=None, help="label store to train on (default labels.source, else labels.sqlite)")
    p.add_argument("--run-dir", "--out", dest="run_dir", default=None,
                   help="output directory (default runs/train-dpo-PRESET-TIME)")  # fmt: skip
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its last checkpoint")
    p.add_argument("--online", action="store_true",
                   help="online DPO: judge the current policy's own samples (dpo.online_samples per query, "
                        "dpo.online_steps steps) with --reward or rewards.trained_model instead of the store's labels")
    p.add_argument("--reward", default=None,
                   help="with --online: what judges the samples, vader, descriptiveness or module:function "
                        "(default: the reward model of --rewards.trained-model)")  # fmt: skip
    p.usage = ("lmprefs train-dpo PRESET --db labels.sqlite [--run-dir D] [--resume] [--section.key V ...]\n"
               "       lmprefs train-dpo PRESET --online (--reward NAME | --rewards.trained-model DIR) [--run-dir D]")
    help_with_config(p, argv, name, pairs)
    a = p.parse_args(argv)
    if a.online and a.db is not None:
        raise UserError(f"--db {a.db}: train-dpo --online learns from its own judged samples, not a label store; "
                        "drop --db")  # fmt: skip
    if a.reward is not None and not a.online:
        raise UserError(f"--reward {a.reward}: judges the samples of --online; add --online, or drop --reward")
    cfg = _saved_or_new_config(a, pairs)
    run_dir = run_dir_for(a.run_dir, cfg, "train-dpo", a.preset)
    if a.resume and (run_dir / "policy").exists():  # a finished run resumed, as train-policy's: nothing to train
        print(f"{run_dir} finished already: nothing to train; sample from it: lmprefs sample {run_dir}")
        return 0
    if a.online:
        return _train_online_dpo(a, cfg, run_dir)
    from lmprefs.pipeline.dpo import run_train_dpo

    s = run_train_dpo(cfg, run_dir, store_path=a.db, resume=a.resume)
    nan = float("nan")
    print(f"DPO policy: {run_dir / 'policy'}  ({s['dpo/labels_train']} labels, {s['dpo/steps']} steps in "
          f"{s['elapsed/time']:.0f}s, dpo.loss={cfg.dpo.loss}, beta {cfg.dpo.beta})")
    print(f"  held-out ({s.get('heldout/n', 0)} labels, {s['heldout/split'] or 'none'}): preference accuracy "
          f"{s.get('initial_heldout/accuracy', nan):.3f} -> {s.get('heldout/accuracy', nan):.3f}, margin "
          f"{s.get('initial_heldout/margin', nan):+.3f} -> {s.get('heldout/margin', nan):+.3f}")  # fmt: skip
    print(f"  sample from it: lmprefs sample {run_dir}")
    return 0


def _train_online_dpo(a, cfg, run_dir: Path) -> int:
    from lmprefs.pipeline.online_dpo import run_online_dpo

    s = run_online_dpo(cfg, run_dir, reward=a.reward, resume=a.resume)
    print(f"online DPO policy: {run_dir / 'policy'}  ({s['dpo/steps']} steps, {s['dpo/episodes']} judged samples "
          f"by {s['judge']} in {s['elapsed/time']:.0f}s, dpo.loss={cfg.dpo.loss}, beta {cfg.dpo.beta})")
    print(f"  last step: score {s.get('final/objective/score', float('nan')):+.3f}, KL "
          f"{s.get('final/objective/kl', float('nan')):.2f} nats; sample from it: lmprefs sample {run_dir}")
    return 0


def _saved_or_new_config(a, pairs):
    """A resumed run's saved config (no overrides: the run continues as it began), or the preset's with them."""
    from lmprefs.runtime.resolve import resolve_config

    if a.resume:
        if not a.run_dir or pairs:
            raise UserError("--resume needs --run-dir and continues with the run's saved config (no overrides)")
        # killed before its config was written, the run did no work: what to do, as train-policy --resume says it
        if not (Path(a.run_dir) / "config.json").is_file():
            raise UserError(f"--resume: {a.run_dir} holds no run (no config.json); start without --resume")
        return resolve_config(a.preset, [], str(Path(a.run_dir) / "config.json"))
    return resolve_config(a.preset, pairs, a.config)
