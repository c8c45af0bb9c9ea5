"""A policy run: the policy and its value function (with LoRA adapters when asked), the reward it optimizes, PPO
with checkpoints, and the checks that let a killed run resume (`run_train_policy`, behind `lmprefs train-policy`,
`quickstart` and the experiments)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from lmprefs.config import Config
from lmprefs.config.diff import flat_config, math_changes
from lmprefs.data.queries import QueryStream
from lmprefs.data.tasks import stop_tokens
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.io.config_file import save_config
from lmprefs.io.locks import run_lock
from lmprefs.io.run_owner import MARKER
from lmprefs.models.lora import add_adapter
from lmprefs.models.policy import Policy
from lmprefs.pipeline.evaluation import plot_curves
from lmprefs.pipeline.labeling import label_source, open_store
from lmprefs.pipeline.online import OnlineRewards, online_summary
from lmprefs.pipeline.reward_model import training_labels
from lmprefs.pipeline.rewards import (
    check_ensemble_reduce,
    check_trained_model,
    reward_for_policy,
    reward_function,
    track_true_reward,
    trains_reward_model,
)
from lmprefs.pipeline.task import Task, setup_task
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.runlog import open_logger, read_metrics
from lmprefs.training.policy import train_policy
from lmprefs.training.policy_checkpoint import find_checkpoint, load_checkpoint
from lmprefs.training.policy_run import build_run


def policy_for(t: Task):
    cfg = t.cfg
    separate = cfg.ppo.value_model == "separate"
    if cfg.lora.rank > 0:  # policy (and value) adapters on the shared base
        add_adapter(t.model, cfg.lora, "policy", seed=cfg.run.seed + 3)
        if separate:
            add_adapter(t.model, cfg.lora, "value", seed=cfg.run.seed + 4)
        return Policy(t.model, t.tok, cfg.task.temperature, adapter="policy",
                      value_adapter="value" if separate else None).to(t.device)  # fmt: skip
    value_lm = copy.deepcopy(t.model) if separate else None
    return Policy(copy.deepcopy(t.model), t.tok, cfg.task.temperature, value_lm=value_lm).to(t.device)


def run_train_policy(cfg: Config, run_dir: Path, **kw) -> dict:
    """train-policy end to end: reward, policy, PPO with checkpoints; resumes from run_dir/checkpoint. The run
    directory is locked for the duration (one process per run) and is train-policy's (an experiment's arms are
    train-policy runs). Arguments: _train_policy_locked."""
    import contextlib

    run_dir = Path(run_dir)
    # the outermost folder this start makes (runs/ itself for the default runs/train-policy-PRESET-TIME), or None
    made = next((d for d in reversed([run_dir, *run_dir.parents]) if not d.exists()), None)
    try:
        # rank 0 holds the lock for all ranks of a launch (they are one run)
        with run_lock(run_dir, "train-policy") if dist.is_main() else contextlib.nullcontext():
            return _train_policy_locked(cfg, run_dir, **kw)
    except Exception:
        if made is not None and dist.is_main() and run_dir.is_dir() and _before_any_work(run_dir):
            shutil.rmtree(made)  # a start refused (or failed) before any training leaves no directory behind
        raise


def _before_any_work(run_dir: Path) -> bool:
    """Whether run_dir holds only what a start writes before it trains anything: its lock, its owner's record,
    config.json, run.json (and their writers' temporaries)."""
    return all(p.name in (".lock", MARKER, "config.json", "run.json") or ".tmp-" in p.name for p in run_dir.iterdir())


def _train_policy_locked(cfg: Config, run_dir: Path, *, reward: str | None = None, store_path: str | None = None,
                         resume: bool = False, t: Task | None = None, true_reward: str | None = None,
                         online: bool = False, labeler: str | None = None, preset: str | None = None,
                         changes: list[str] | None = None, on_update=None) -> dict:  # fmt: skip
    """online: judgments are requested from the current policy during training and the reward model is retrained.
    resume without a checkpoint starts the run over in the same directory. changes: with resume, continue a run
    the andon cord stopped from its last good checkpoint with this changed config ('key old -> new' lines).
    on_update(run, stats): called after each update, before its checkpoint (an experiment evaluating the policy
    along the run)."""
    meta, found, andon = _start(cfg, run_dir, resume, changes, reward=reward, online=online, labeler=labeler,
                                store=store_path, preset=preset, true_reward=true_reward)  # fmt: skip
    true_reward = meta.get("true_reward") or true_reward  # a resumed run keeps the one it was started with
    # a callable (the Python API) is recorded by its name and used as given
    reward = reward if callable(reward) else meta["reward"]
    online, labeler, store_path = meta["online"], meta.get("labeler"), meta.get("store")
    dist.barrier()  # every rank has checked the run directory before rank 0 writes into it
    t = t or setup_task(cfg)
    check_ensemble_reduce(cfg, reward, found is not None)
    if reward in (None, "model"):
        check_trained_model(cfg, t.tok)
    if online and dist.world() > 1:
        raise UserError(f"--online runs in one process for now; launch it without torchrun ({dist.world()} ranks)")
    if online and reward != "model":
        raise UserError(f"--online learns a reward model from judgments; it cannot use --reward {reward}")
    store, labels = store_path, None
    if not online and trains_reward_model(cfg, reward, found is not None):
        # the labels are checked before anything is written: a store that cannot train leaves no run behind
        store = label_source(store_path or cfg.labels.source or "labels.sqlite")
        labels = training_labels(t, store)
    if dist.is_main():  # before any training, so that a run killed while its reward model trains can be resumed
        save_config(cfg, run_dir / "config.json")  # first: `--resume` reads it, and a run.json implies it
        atomic_write_text(run_dir / "run.json", json.dumps(meta))
    hooks, extras = [on_update] if on_update is not None else [], {}
    if online:
        store_path = str(Path(store_path or cfg.labels.source or run_dir / "labels.sqlite").resolve())
        onl = OnlineRewards(t, open_store(store_path), run_dir, labeler)
        onl.start(found is not None)
        score_fn, info = onl.score, {"reward": "model", "store": store_path}
        hooks.append(onl.on_update)
        extras["online"] = onl
    else:
        # checkpoints written before they kept a fully fine-tuned reward model resume from reward_model/ as before
        kept = found is not None and "reward" in found[1].get("extras", ())
        score_fn, info = reward_for_policy(t, run_dir, reward, store, found is not None, labels, kept)
        if "state" in info:
            extras["reward"] = info.pop("state")
    if true_reward:
        # a built-in judge or the user's module:function, as --reward takes them
        score_fn, track = track_true_reward(score_fn, reward_function(true_reward)[1], t.tok, t.prefix, t.suffix,
                                            stop_tokens(cfg.task, t.tok))
        hooks.append(track)
    run = build_run(cfg, policy_for(t), QueryStream(t.train_queries, cfg.run.seed, dist.rank(), dist.world()),
                    t.device)  # fmt: skip
    run.extras.update(extras)
    if found is not None:
        load_checkpoint(run, run_dir, found)
        if dist.is_main():
            print(f"resuming {run_dir} at update {run.update}/{cfg.ppo.num_updates}", flush=True)
    log = open_logger(run_dir, cfg, resume_step=run.update if resume else None)
    if dist.is_main():
        meta |= {k: v for k, v in info.items() if isinstance(v, str)}
        if changes is not None:  # continuing after an andon stop: what stopped it and what changed, for the record
            record = {**andon, "resumed_at": run.update, "changes": changes}
            meta.setdefault("continued_after_andon", []).append(record)
            (run_dir / "ANDON").unlink(missing_ok=True)
        atomic_write_text(run_dir / "run.json", json.dumps(meta))
    try:
        stats = train_policy(cfg, run, score_fn, log, run_dir, t.ctx,
                             lambda r, st: [h(r, st) for h in hooks])  # fmt: skip
    finally:
        log.close()
    if dist.is_main():  # the quickstart's learning curves, under the original's metric names
        plot_curves(read_metrics(run_dir / "metrics.jsonl", "policy"), run_dir, true_reward)
    if online:
        info["online_summary"] = online_summary(run_dir)
    return {"stats": stats, **info, "run": run, "task": t}


def _start(cfg: Config, run_dir: Path, resume: bool, changes: list[str] | None,
           **given) -> tuple[dict, tuple[Path, dict] | None, dict]:  # fmt: skip
    """(run.json's choices, the checkpoint to resume or None, the andon record) after the checks of a start or a
    resume: a new run may not overwrite one, and a resumed one keeps what it was started with."""
    store, reward = given["store"], given["reward"]
    # an unknown reward is refused here, before anything is written; a callable is recorded by its name
    given["reward"] = reward_function(reward)[0] if reward not in (None, "model") else reward
    if given["true_reward"] is not None:  # an unknown true reward is refused before anything is written too
        reward_function(given["true_reward"], "--true-reward")
    asked = {"reward": given["reward"] or "model", "online": given["online"], "labeler": given["labeler"],
             "preset": given["preset"], "store": str(Path(store).resolve()) if store else None,
             "true_reward": given["true_reward"]}  # fmt: skip
    if not resume:
        held = [n for n in ("run.json", "metrics.jsonl", "checkpoint") if (run_dir / n).exists()]
        if held:
            raise UserError(f"{run_dir} already holds a run ({held[0]}); pass --resume to continue it or choose "
                            "another --run-dir")  # fmt: skip
        return asked, None, {}
    if not (run_dir / "run.json").is_file():
        raise UserError(f"--resume: {run_dir} holds no train-policy run (no run.json: it stopped before it recorded "
                        "how it was started); start it again without --resume")  # fmt: skip
    meta = resume_meta(run_dir, **given)
    found = find_checkpoint(run_dir)
    andon = check_andon(run_dir, found, changes)
    if found is not None and changes is None:
        diff = math_changes(found[1].get("config", {}), flat_config(cfg))
        if diff:
            raise UserError(f"--resume: {run_dir}/config.json differs from the config its checkpoint was trained "
                            f"with ({'; '.join(diff[:3])}); restore it, or start a new --run-dir")  # fmt: skip
    if found is None:
        print(f"{run_dir} has no checkpoint yet: starting the run over from update 0", flush=True)
    return meta, found, andon


def resume_meta(run_dir: Path, *, reward, online, labeler, store, preset, true_reward=None) -> dict:
    """run.json of the run to resume, after refusing command-line choices that differ from what it was started
    with (they would change what it computes); says what it ignores."""
    meta = json.loads((run_dir / "run.json").read_text())
    if meta.get("reward") == "online":  # run.json of an older lmprefs
        meta["reward"], meta["online"] = "model", True
    meta["online"] = bool(meta.get("online"))
    if online and not meta["online"]:
        raise UserError(f"--resume --online: the run in {run_dir} was not started with --online; start a new "
                        "--run-dir")  # fmt: skip
    given = {"--reward": reward, "preset": preset, "--true-reward": true_reward}
    if meta["online"]:
        given |= {"--labeler": labeler, "--db": str(Path(store).resolve()) if store else None}
    elif store and str(Path(store).resolve()) != meta.get("store"):
        print(f"--resume: ignoring --db {store} (the run's reward model is reused)", flush=True)
    saved = {"--reward": meta.get("reward"), "preset": meta.get("preset"), "--labeler": meta.get("labeler"),
             "--db": meta.get("store"), "--true-reward": meta.get("true_reward")}  # fmt: skip
    for flag, value in given.items():
        if value is not None and saved[flag] is not None and value != saved[flag]:
            raise UserError(f"--resume: the run in {run_dir} was started with {flag} {saved[flag]}, not {value}; "
                            "resuming cannot change what it computes (start a new --run-dir)")  # fmt: skip
    return meta


def check_andon(run_dir: Path, found, changes: list[str] | None) -> dict:
    """The andon record of a run the cord stopped ({} if none); refuses to resume it unless told to continue
    from the last good state with a changed config."""
    path = run_dir / "ANDON"
    andon = json.loads(path.read_text()) if path.is_file() else {}
    if andon and changes is None:
        last = f"update {found[1]['update']}" if found else "none was saved"
        raise UserError(f"--resume: the run stopped itself at update {andon.get('update')}: {andon.get('reason')}; "
                        f"its last good checkpoint: {last}. Resuming as it was would repeat that; to continue from "
                        "it with a change, pass --continue-after-andon and the change (e.g. --ppo.lr 5e-5)")
    if changes is not None and not andon:
        raise UserError(f"--continue-after-andon: the run in {run_dir} was not stopped by the andon cord (no ANDON)")
    if changes is not None and not changes:
        raise UserError("--continue-after-andon needs a change to the config that made the run stop "
                        "(e.g. --ppo.lr 5e-5)")  # fmt: skip
    return andon
