"""`lmprefs train-dpo --online` end to end: the task's queries, a judge (a reward function such as the simulated
labeler, or a saved reward model), the policy and its frozen reference as train-dpo makes them, online DPO with
checkpoints (`training.online_dpo`), and the policy saved as train-dpo saves its own."""

from __future__ import annotations

import json
from pathlib import Path

from lmprefs.config import Config
from lmprefs.data.queries import QueryStream
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.io.config_file import save_config
from lmprefs.io.locks import run_lock
from lmprefs.models.artifacts import save_policy
from lmprefs.models.model_card import CardInfo
from lmprefs.pipeline.dpo import RUN_FILE, dpo_policy
from lmprefs.pipeline.rewards import check_ensemble_reduce, check_trained_model, reward_for_policy, reward_function
from lmprefs.pipeline.task import Task, setup_task
from lmprefs.runtime.runlog import RunLogger, check_trackers
from lmprefs.training.dpo_train import checkpoint_step
from lmprefs.training.online_dpo import train_online_dpo


def online_judge(cfg: Config, reward) -> str:
    """The name of what judges an online run's samples: `--reward NAME` (a built-in or module:function), or "model"
    for rewards.trained_model; one line when neither is given (online DPO trains no reward model itself)."""
    if reward not in (None, "model"):
        return reward_function(reward)[0]
    if not cfg.rewards.trained_model:
        raise UserError("train-dpo --online judges its samples with --reward NAME (e.g. vader) or a saved reward "
                        "model, --rewards.trained-model DIR (a train-reward run's reward_model/)")  # fmt: skip
    return "model"


def run_online_dpo(cfg: Config, run_dir: Path, *, reward=None, resume: bool = False, t: Task | None = None) -> dict:
    """Online DPO into run_dir/policy; resume: continue run_dir from its checkpoint, judged as it started (from step
    0 when it was stopped before its first checkpoint); t: the task set up already (its training queries; None:
    setup_task's). Every input is checked before anything is written."""
    run_dir = Path(run_dir)
    if (run_dir / "policy").exists():
        raise UserError(f"{run_dir} already holds a trained policy; choose another --run-dir")
    if resume:
        reward = _resumed_judge(run_dir, reward)
    elif (run_dir / "checkpoint").exists() or (run_dir / RUN_FILE).exists():
        raise UserError(f"{run_dir} already holds a train-dpo run; pass --resume to continue it, or another --run-dir")
    judge = online_judge(cfg, reward)
    check_ensemble_reduce(cfg, None if judge == "model" else reward)
    t = setup_task(cfg) if t is None else t
    check_trained_model(cfg, t.tok)
    check_trackers(cfg.run.report_to)
    with run_lock(run_dir, "train-dpo"):
        done = checkpoint_step(run_dir) if resume else None
        if not resume:  # config.json first: --resume reads it, and run.json implies it
            save_config(cfg, run_dir / "config.json")
            atomic_write_text(run_dir / RUN_FILE, json.dumps({"online": True, "reward": judge}))
        elif done is None:
            print(f"{run_dir} has no checkpoint yet: starting the run over from step 0", flush=True)
        # the judge before the policy: a reward function is normalized on the initial model's samples
        score_fn, _ = reward_for_policy(t, run_dir, None if judge == "model" else reward, None, False)
        policy, ref_lm = dpo_policy(t)
        again = None if not resume else -1 if done is None else done - 1
        log = RunLogger(run_dir, cfg, resume_step=again, resume_phase="dpo")
        try:
            summary = train_online_dpo(cfg, policy, score_fn, QueryStream(t.train_queries, cfg.run.seed), t.ctx,
                                       ref_lm=ref_lm, log=log, run_dir=run_dir, resume=done is not None)  # fmt: skip
        finally:
            log.close()
        counts = {"judged online": summary["dpo/episodes"]}
        save_policy(policy, run_dir / "policy", card=CardInfo("dpo", cfg, {}, counts))
    return summary | {"judge": judge}


def _resumed_judge(run_dir: Path, given):
    """The judge the run started with (its run.json); another --reward is refused, and so is an offline run."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise UserError(f"--resume: {run_dir} holds no train-dpo run (no {RUN_FILE}); start it without --resume")
    meta = json.loads(path.read_text())
    if not meta.get("online"):
        raise UserError(f"--resume --online: the run in {run_dir} is an offline train-dpo run; resume it without "
                        "--online")  # fmt: skip
    if given is not None and given != meta["reward"]:
        raise UserError(f"--resume: the run in {run_dir} was judged with --reward {meta['reward']}, not {given}; "
                        "resuming cannot change what it computes (start a new --run-dir)")  # fmt: skip
    return meta["reward"]
