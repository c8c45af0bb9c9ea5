"""`lmprefs quickstart`: the paper's mock-sentiment experiment (section 3.1.1) end to end on one machine, or with
`--preset summarize` the offline summarization demo (news articles, a mock faithfulness judge).

A simulated human (VADER; for summaries, the faithfulness judge) judges best-of-4 comparisons sampled from the
initial policy; a reward model learns the judgments; PPO with the adaptive KL controller optimizes the reward model;
the initial and final policies are evaluated on held-out queries with the true reward. Everything lands in a run
directory with report.md and plots.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from pathlib import Path

from lmprefs.config import Config, label_type_shape
from lmprefs.config.diff import flat_config, math_changes
from lmprefs.data.queries import QueryStream
from lmprefs.data.tasks import decode, show, stop_tokens
from lmprefs.errors import UserError
from lmprefs.io.config_file import load_config, save_config
from lmprefs.io.locks import run_lock
from lmprefs.io.run_owner import owner
from lmprefs.labels.labelers import score_fn
from lmprefs.models import parallel
from lmprefs.models.artifacts import load_reward_model
from lmprefs.pipeline.evaluation import evaluate_policy, plot_curves, true_reward_name
from lmprefs.pipeline.labeling import collect_labels, open_store
from lmprefs.pipeline.policy import policy_for
from lmprefs.pipeline.reward_model import RewardState, reward_frame
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.rewards import track_true_reward
from lmprefs.pipeline.task import Task, setup_eval_task
from lmprefs.recipes.experiment import DEFAULT_EVAL_QUERIES, Results
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.device import compiles_forwards
from lmprefs.runtime.memory import release_freed_memory
from lmprefs.runtime.runlog import open_logger, read_metrics
from lmprefs.training.policy import train_policy
from lmprefs.training.policy_checkpoint import find_checkpoint, load_checkpoint
from lmprefs.training.policy_run import build_run
from lmprefs.training.rollout import rm_score_fn


def chance(cfg: Config) -> float:
    """A reward model's held-out accuracy by chance: 1/N for best_of_N."""

    return 1 / label_type_shape(cfg.labels.type)[1]


LENGTH_KEYS = ("response_length", "response_length_stderr")


def _length_rows(cfg: Config, before: dict, after: dict) -> list[str]:
    """With task.stop_at_eos, each policy's mean response length on the held-out samples: whether PPO made its
    answers longer or shorter is half of what an instruct demo shows."""
    if "response_length" not in after:
        return []
    cap = cfg.task.response_length
    return [f"| mean response length, {name} policy (tokens, stop token included; cap {cap}) | "
            f"{e['response_length']:.1f} +/- {e['response_length_stderr']:.1f} |"
            for name, e in (("initial", before), ("final", after))]  # fmt: skip


def write_report(run_dir: Path, cfg: Config, figures: dict, stages: dict, before: dict, after: dict, *, queries,
                 tok) -> Path:  # fmt: skip

    gain = after["mean"] - before["mean"]
    se = math.sqrt(before["stderr"] ** 2 + after["stderr"] ** 2)
    n_best = round(1 / chance(cfg))
    lines = [
        f"# lmprefs quickstart: {true_reward_name(cfg.labels.labeler)}", "",
        f"Model `{cfg.task.initial_model}`, queries `{cfg.task.query_dataset}`, "
        f"simulated labeler `{cfg.labels.labeler}`.",
        "", "| figure | value |", "|---|---|",
        f"| reward model held-out accuracy (best of {n_best}, chance {chance(cfg):.2f}) | "
        f"{figures.get('rm_accuracy', float('nan')):.3f} "
        f"({figures.get('rm_heldout', 0)} held-out labels; {figures.get('rm_train', 0)} trained) |",
        f"| true reward, initial policy | {before['mean']:+.4f} +/- {before['stderr']:.4f} |",
        f"| true reward, final policy | {after['mean']:+.4f} +/- {after['stderr']:.4f} |",
        f"| improvement | {gain:+.4f} ({gain / se if se > 0 else float('nan'):.1f} standard errors) |",
        f"| evaluation | {after['n_queries']} held-out queries x {after['samples_per_query']} samples |",
        f"| KL of the final policy on the held-out samples (nats) / target | {after.get('kl', float('nan')):.2f} "
        f"+/- {after.get('kl_stderr', float('nan')):.2f} / {cfg.rewards.kl_target} |",
        f"| KL of the last training batch (objective/kl) | {figures.get('kl', float('nan')):.2f} |",
        f"| final beta | {figures.get('beta', float('nan')):.4f} |",
        *_length_rows(cfg, before, after), "",
        "| stage | seconds |", "|---|---|", *[f"| {k} | {v:.0f} |" for k, v in stages.items()],
        f"| total | {sum(stages.values()):.0f} |", "",
        "![learning curves](curves.png)", "", "## Samples before and after, same queries", "",
        "Each policy's first sample for the query, with its own true reward.", "",
    ]  # fmt: skip
    qs = decode(tok, queries[:8])
    for i, q in enumerate(qs):  # the sample's own score, not the query's mean over its samples
        lines += [f"**Query:** {show(q)}", "",
                  f"- before ({before['scores'][i][0]:+.3f}): {show(before['texts'][i])}",
                  f"- after ({after['scores'][i][0]:+.3f}): {show(after['texts'][i])}", ""]  # fmt: skip
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    (run_dir / "report.json").write_text(json.dumps({"figures": figures, "stages": stages,
        "true_reward_before": {k: before[k] for k in ("mean", "stderr", "n_queries")},
        "true_reward_after": {k: after[k] for k in ("mean", "stderr", "n_queries")},
        "kl_after": {k: after.get(k) for k in ("kl", "kl_stderr")},
        **{f"response_length_{name}": {k: e[k] for k in LENGTH_KEYS} for name, e in (("before", before),
           ("after", after)) if "response_length" in e}}, indent=1))  # fmt: skip
    return path


# what a run leaves in its directory: a quickstart starts only where none is, unless the quickstart made it
RUN_FILES = ("config.json", "run.json", "metrics.jsonl", "checkpoint", "policy", "reward_model", "labels.sqlite",
             "report.md")  # fmt: skip


def _check_resume(cfg: Config, run_dir: Path, eval_flags: dict) -> dict:
    """results.json of the quickstart in run_dir ({} for a new one), after refusing a finished one and a command
    line that would change what a begun one computes."""
    if owner(run_dir) != "quickstart":  # e.g. a directory of an earlier lmprefs that tells no command
        held = [name for name in RUN_FILES if (run_dir / name).exists()]
        if held:
            raise UserError(f"{run_dir} already holds a run ({held[0]}); choose another --run-dir")
        return {}
    if (run_dir / "report.md").exists():
        raise UserError(f"{run_dir} holds a finished quickstart (report.md); choose another --run-dir")
    state = Results(run_dir).data
    if (run_dir / "config.json").is_file():
        diff = math_changes(flat_config(load_config(run_dir / "config.json")), flat_config(cfg))
        if diff:
            raise UserError(f"{run_dir} holds a quickstart begun with another config: {diff[0]}; rerun it with its "
                            "own command line, or choose another --run-dir")  # fmt: skip
    for flag, key in (("--eval-queries", "queries"), ("--eval-samples", "samples")):
        if key in state.get("eval", {}) and eval_flags[key] is not None and state["eval"][key] != eval_flags[key]:
            raise UserError(f"{run_dir} holds a quickstart begun with {flag} {state['eval'][key]}, not "
                            f"{eval_flags[key]}; rerun it with its own command line, or choose another --run-dir")
    if (run_dir / "ANDON").is_file():
        why = json.loads((run_dir / "ANDON").read_text())
        raise UserError(f"{run_dir}: the quickstart's PPO stopped itself at update {why.get('update')}: "
                        f"{why.get('reason')}; continuing would repeat that: start another --run-dir with a change "
                        "(e.g. --ppo.lr)")  # fmt: skip
    return state


def run_quickstart(cfg: Config, run_dir: Path, n_eval: int | None, eval_samples: int) -> dict:
    """The six stages in run_dir; each finished stage's result is kept (results.json, the label store, the reward
    model, PPO's checkpoints), so that the same command line run again after a kill continues the run. n_eval None:
    up to DEFAULT_EVAL_QUERIES held-out queries, the experiments' default (a begun run: as many as it began with)."""
    state = _check_resume(cfg, run_dir, {"queries": n_eval, "samples": eval_samples})
    begun = bool(state)  # before this run's first write to the state below
    if n_eval is None:
        n_eval = state.get("eval", {}).get("queries")
    say = print if dist.is_main() else (lambda *_, **__: None)
    true_fn = score_fn(cfg.labels.labeler)  # a missing judge asset stops the run before it writes anything
    t0 = time.time()
    say("[1/6] preparing assets and queries", flush=True)
    # a bad model or query dataset is refused before run_dir is made
    asked = n_eval
    t, n_eval = setup_eval_task(cfg, n_eval, DEFAULT_EVAL_QUERIES)
    if asked is None and n_eval < DEFAULT_EVAL_QUERIES:
        say(f"evaluating on all {n_eval} held-out queries of task.query_dataset={cfg.task.query_dataset!r}",
            flush=True)  # fmt: skip
    eval_flags = {"queries": n_eval, "samples": eval_samples}
    setup_seconds = time.time() - t0
    # under several ranks: labels are sampled in shares and written by rank 0, the reward model and PPO train on
    # shares of each global batch, the held-out queries are evaluated in shares and gathered; rank 0 writes
    with run_lock(run_dir, "quickstart") if dist.is_main() else contextlib.nullcontext():
        res = _State(run_dir)
        res.data = state
        if dist.is_main():
            save_config(cfg, run_dir / "config.json")
        res.save("eval", eval_flags)  # every rank's copy; rank 0 writes it
        if begun:
            say(f"resuming {run_dir}", flush=True)
        res.data.setdefault("stages", {})["assets and model"] = setup_seconds
        return _stages(cfg, run_dir, t, res, true_fn, say)


class _State(Results):
    """results.json of a quickstart, as an experiment's, written by rank 0 alone."""

    def save(self, key: str, value) -> None:
        if dist.is_main():
            super().save(key, value)
        else:
            self.data[key] = value

    def timed(self, stage: str, start: float) -> None:
        self.save("stages", {**self.data.get("stages", {}), stage: time.time() - start})


def _stages(cfg: Config, run_dir: Path, t: Task, res: _State, true_fn, say) -> dict:
    n_eval, eval_samples = res.data["eval"]["queries"], res.data["eval"]["samples"]
    heldout = t.heldout_queries[:n_eval]
    s = time.time()
    if "initial" not in res.data:
        say("[2/6] evaluating the initial policy on held-out queries (true reward)", flush=True)
        res.save("initial", evaluate_policy(t, heldout, true_fn, None, eval_samples, cfg.run.seed + 5,
                                            desc="initial policy"))  # fmt: skip
        release_freed_memory()  # the next stage starts from what the run holds, not this one's high-water mark
        res.timed("evaluate initial", s)
    before = res.data["initial"]

    s = time.time()
    labeled: dict = {}
    if "labels" not in res.data:  # a store a killed labeling pass left is completed: its questions are keyed
        say(f"[3/6] sampling {cfg.labels.num_train} comparisons and labeling them with {cfg.labels.labeler}",
            flush=True)  # fmt: skip
        store = open_store(run_dir / "labels.sqlite") if dist.is_main() else None
        n_questions = math.ceil(cfg.labels.num_train / (1 - cfg.labels.heldout_fraction))
        # the sampling pass keeps the frozen blocks' outputs of the labeled rows: the reward model then runs only its
        # adapted blocks on them
        labeled = collect_labels(t, store, n_questions, source="quickstart", keep_prefixes=True)
        release_freed_memory()
        res.save("labels", {"questions": n_questions})
        res.timed("sample and label", s)
    store = open_store(run_dir / "labels.sqlite")  # the other ranks read it once rank 0 has written it

    rm, run, log = _reward_and_run(cfg, run_dir, t, res, store, labeled.get("prefixes"), say)
    s = time.time()
    say(f"[5/6] PPO against the reward model: {cfg.ppo.num_updates} updates of {cfg.ppo.batch_size}", flush=True)
    rm_score = rm_score_fn(rm, compiles_forwards(cfg.run.compile, t.device))
    score, on_update = track_true_reward(rm_score, true_fn, t.tok, t.prefix, t.suffix, stop_tokens(cfg.task, t.tok))
    try:
        stats = train_policy(cfg, run, score, log, run_dir, t.ctx, on_update)
    finally:
        log.close()
    release_freed_memory()
    res.timed("PPO", s)

    s = time.time()
    say("[6/6] evaluating the final policy on the same held-out queries", flush=True)
    policy = run.policy
    # with LoRA the trained policy is an adapter on t.model; with full fine-tuning it is its own copy
    final = t if policy.adapter else Task(**{**t.__dict__, "model": policy.lm})
    # under FSDP with the trained policy's shards gathered on every rank for the duration
    after = parallel.gathered(policy, lambda: evaluate_policy(final, heldout, true_fn, policy.adapter, eval_samples,
                                                          cfg.run.seed + 5, desc="final policy", ref_model=t.model))
    res.timed("evaluate final", s)

    # a quickstart of an earlier lmprefs, resumed, kept no figures of its reward model
    unknown = {"rm_accuracy": float("nan"), "rm_heldout": 0, "rm_train": 0}
    figures = {**unknown, **res.data.get("reward_model", {}), "kl": stats["objective/kl"],
               "kl_heldout": after.get("kl"), "beta": stats["objective/kl_coef"],
               "score": stats["objective/score"]}  # fmt: skip
    stages = res.data["stages"]
    report = run_dir / "report.md"
    if dist.is_main():
        plot_curves(read_metrics(run_dir / "metrics.jsonl", "policy"), run_dir, cfg.labels.labeler)
        report = write_report(run_dir, cfg, figures, stages, before, after, queries=heldout, tok=t.tok)
    return {"report": report, "figures": figures, "before": before, "after": after, "stages": stages}


def _reward_and_run(cfg: Config, run_dir: Path, t: Task, res: _State, store, prefixes, say):
    """(the reward model, the PPO run, its logger): a run with a checkpoint continues from it with the reward model
    it kept; otherwise the reward model is trained (again, after a kill: the rows an earlier attempt logged are
    dropped first) and PPO starts at update 0."""
    found = find_checkpoint(run_dir)
    kept = found is not None and "reward" in found[1].get("extras", ())  # the checkpoint holds the reward model
    s = time.time()
    if found is None:
        if dist.is_main():  # what a killed attempt logged from its reward model on: this one logs it again
            for name in ("metrics.jsonl", "samples.jsonl"):
                (run_dir / name).unlink(missing_ok=True)
            shutil.rmtree(run_dir / "logs", ignore_errors=True)
        say("[4/6] training the reward model", flush=True)
        log = open_logger(run_dir, cfg)
        t.shared_prefixes = prefixes
        rm, summary = train_reward_model(t, store, run_dir / "reward_model", log)
        t.shared_prefixes = None  # their memory, for PPO
        res.save("reward_model", {"rm_accuracy": summary.get("heldout/accuracy", float("nan")),
                                  "rm_heldout": summary["labels_heldout"], "rm_train": summary["labels_train"]})
        res.timed("train reward model", s)
        say(f"      held-out accuracy {res.data['reward_model']['rm_accuracy']:.3f} "
            f"({summary['labels_heldout']} labels; chance {chance(cfg):.2f})", flush=True)  # fmt: skip
    elif kept:
        rm = reward_frame(t)  # filled from the checkpoint: the very model the killed run scored with
    else:  # sharded under FSDP (or an earlier lmprefs') the reward model is not in the checkpoint: its export scores
        # the same up to rounding
        rm = load_reward_model(run_dir / "reward_model", t.device)
        if cfg.run.parallel == "fsdp":
            parallel.wrap(rm, "fsdp", t.dtype)  # sharded in place
    rm.freeze()
    release_freed_memory()
    policy = policy_for(t)
    run = build_run(cfg, policy, QueryStream(t.train_queries, cfg.run.seed, dist.rank(), dist.world()), t.device)
    # kept in the checkpoint as train-policy keeps a reward model trained in its run
    if (found is None or kept) and (rm.adapter is not None or not parallel.is_sharded(rm)):
        run.extras["reward"] = RewardState(rm)
    if found is None:
        return rm, run, log
    load_checkpoint(run, run_dir, found)
    say(f"resuming PPO at update {run.update}/{cfg.ppo.num_updates}", flush=True)
    return rm, run, open_logger(run_dir, cfg, resume_step=run.update)
