"""`experiment compare`'s DPO arms, each a train-dpo run in the arm's directory (resumed where begun before, skipped
once its policy is saved), evaluated as the PPO-family arms are: offline on the store's labels (`dpo_arm`), and
online on the policy's own samples judged by the experiment's one reward model (`online_dpo_arm`, train-dpo
--online), so that it spends the same labels as the PPO-family arms.

The online arm spends the PPO-family arms' episode budget as they spend it. An episode is one response sampled from
the current policy and scored by the reward model: each step samples ppo.batch_size of them, dpo.online_samples to
each of ppo.batch_size / dpo.online_samples fresh queries (as a group estimator samples ppo.rloo_k per query), and
the run takes ppo.num_updates steps, so ppo.total_episodes episodes in all (rounded down to whole steps, as PPO's
are). Each step is one optimizer step of the DPO loss, where PPO takes ppo.noptepochs x ppo.nminibatches on its
batch; dpo.online_steps and dpo.batch_size (the offline arms' labels per step) do not apply to it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from lmprefs.config import Config
from lmprefs.errors import UserError
from lmprefs.models.artifacts import load_policy
from lmprefs.pipeline.dpo import run_train_dpo
from lmprefs.pipeline.online_dpo import run_online_dpo
from lmprefs.pipeline.task import setup_task
from lmprefs.recipes.compare_arms import ONLINE_DPO, Plan
from lmprefs.recipes.experiment import evaluate_arm
from lmprefs.runtime.runlog import read_metrics

R = dataclasses.replace


def dpo_arm(cfg: Config, arm_dir: Path, key: str, store_path: Path, plan: Plan, true_fn) -> tuple[dict, int]:
    """A train-dpo run on the store's labels in arm_dir, evaluated. Episodes: the labels it trained on, times
    dpo.epochs."""
    if not (arm_dir / "policy").exists():
        resume = (arm_dir / "run.json").is_file()
        print(f"[{key}] {'resuming' if resume else 'training'} (DPO {cfg.dpo.loss}, beta {cfg.dpo.beta:g})",
              flush=True)  # fmt: skip
        run_train_dpo(cfg, arm_dir, store_path=str(store_path), resume=resume)
    ev = _evaluated(cfg, arm_dir, key, plan, true_fn)
    rows = [r for r in read_metrics(arm_dir / "metrics.jsonl", "dpo") if "dpo/labels_train" in r]
    return ev, int(rows[-1]["dpo/labels_train"]) * cfg.dpo.epochs if rows else 0


def online_config(cfg: Config, rm_dir: Path) -> Config:
    """The online arm's config: ppo.num_updates steps of ppo.batch_size samples (the PPO-family arms' episode
    budget), judged by the reward model in rm_dir."""
    d, ppo = cfg.dpo, cfg.ppo
    return R(cfg, dpo=R(d, batch_size=ppo.batch_size // d.online_samples, online_steps=ppo.num_updates),
             rewards=R(cfg.rewards, trained_model=str(rm_dir)))  # fmt: skip


def check_online(cfg: Config, kinds: Iterable[str]) -> None:
    """Refuse in one line, before anything is written, an online arm whose dpo.online_samples does not divide
    ppo.batch_size: its steps could not sample the PPO-family arms' batch."""
    S, B = cfg.dpo.online_samples, cfg.ppo.batch_size
    if ONLINE_DPO in kinds and B % S:
        raise UserError(f"dpo.online_samples={S}: the {ONLINE_DPO} arm samples ppo.batch_size={B} responses a step, "
                        "as the PPO-family arms do, dpo.online_samples of them to each query; choose a "
                        f"dpo.online_samples that divides {B}")  # fmt: skip


def online_dpo_arm(cfg: Config, arm_dir: Path, key: str, rm_dir: Path, plan: Plan, true_fn) -> tuple[dict, int]:
    """A train-dpo --online run in arm_dir judged by the reward model in rm_dir, on the PPO-family arms' training
    queries in their order, evaluated. Episodes: the responses it sampled and judged."""
    cfg = online_config(cfg, rm_dir)
    d = cfg.dpo
    if not (arm_dir / "policy").exists():
        resume = (arm_dir / "run.json").is_file()
        print(f"[{key}] {'resuming' if resume else 'training'} (online DPO {d.loss}, beta {d.beta:g}, "
              f"{d.online_steps} steps of {d.batch_size} queries x {d.online_samples} samples)", flush=True)
        # the task as the PPO-family arms set it up: its training queries leave the same held-out ones aside
        run_online_dpo(cfg, arm_dir, resume=resume, t=setup_task(cfg, plan.n_eval))
    return _evaluated(cfg, arm_dir, key, plan, true_fn), d.online_steps * d.batch_size * d.online_samples


def _evaluated(cfg: Config, arm_dir: Path, key: str, plan: Plan, true_fn) -> dict:
    """The saved policy of arm_dir on the held-out queries, as evaluate_arm evaluates every trained arm."""
    t = setup_task(cfg, plan.n_eval)
    policy = load_policy(arm_dir / "policy", t.device, cfg.task.temperature)
    ev = evaluate_arm(t, policy, t.heldout_queries[: plan.n_eval], true_fn, plan.eval_samples, cfg.run.seed + 5, key)
    print(f"[{key}] true reward {ev['mean']:+.4f} +/- {ev['stderr']:.4f}, KL {ev['kl']:.2f} +/- "
          f"{ev['kl_stderr']:.2f} nats", flush=True)  # fmt: skip
    return ev
