"""The outer loop of policy training with PPO against a reward model or a reward function (train_policy.py
@cbfd210): rollouts (`rollout`), PPO epochs (`ppo`), logging, checkpoints that resume exactly (`policy_checkpoint`)
and an automatic stop (the "andon cord", `policy_run`) for runs that go wrong.

One update, numbered as the original's PPOTrainer.step:
 1. sample queries and fixed-length responses from the policy (with task.stop_at_eos, ending at a stop token and
    padded: PPO then counts their real tokens only)
 2. score logprobs and values of the policy, and logprobs of the frozen reference, on the full responses
 3. truncate responses, score them, give penalty_reward_value to those that did not truncate
 4. per-token rewards -beta * KL with the score on the last token
 5. noptepochs x nminibatches of clipped PPO (whitening and GAE per minibatch, in ppo_update); with
    a group estimator (ppo.estimator rloo, grpo, dr_grpo, reinforce_pp_baseline), k samples per query in 1 and the
    group's advantages in 4 instead (`rloo`, `grpo`)
 6. update the KL controller, log, checkpoint
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from lmprefs.config import Config
from lmprefs.data.tasks import TaskContext, decode, response_texts, show
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text, crash_point
from lmprefs.models import parallel
from lmprefs.models.artifacts import save_policy, whole_for_saving
from lmprefs.models.model_card import CardInfo
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.device import compiles_forwards
from lmprefs.runtime.runlog import progress, read_metrics
from lmprefs.training.policy_checkpoint import save_checkpoint
from lmprefs.training.policy_run import AndonStop, PolicyRun, ScoreFn, nonfinite_parameters
from lmprefs.training.ppo import Rollout, ppo_update
from lmprefs.training.rollout import make_rollout


def andon_check(run: PolicyRun, stats: dict, cfg: Config) -> str | None:
    """Why the run must stop now, or None. The paper's sign-flip bug ran all night unnoticed."""
    bad = [k for k, v in stats.items() if not math.isfinite(v)]
    if bad:
        return f"non-finite {', '.join(bad[:4])} at update {run.update}"
    if stats["objective/kl"] > cfg.ppo.kl_stop:
        return f"objective/kl = {stats['objective/kl']:.2f} exceeds ppo.kl_stop = {cfg.ppo.kl_stop}"
    run.score_ema, run.best_score_ema = running_mean(run.score_ema, run.best_score_ema, stats["objective/score"])
    if cfg.ppo.score_drop_stop is not None and run.best_score_ema - run.score_ema > cfg.ppo.score_drop_stop:
        return (f"score collapsed: running mean {run.score_ema:+.3f} is {run.best_score_ema - run.score_ema:.2f} "
                f"below its best {run.best_score_ema:+.3f} "
                f"(ppo.score_drop_stop = {cfg.ppo.score_drop_stop})")  # fmt: skip
    return overoptimized(run, stats, cfg.ppo.overoptimization_stop)


def running_mean(ema: float | None, best: float, x: float) -> tuple[float, float]:
    """(running mean, its best so far) after x: the andon cord's smoothing, 0.8 of the old mean and 0.2 of x."""
    ema = x if ema is None else 0.8 * ema + 0.2 * x
    return ema, max(best, ema)


# the signals of over-optimization, by metric: each is watched where a run logs it
WATCHED = {"objective/true_reward": "the true reward",
           "online/rm_agreement": "the reward model's agreement with labels it has not seen",
           "objective/score_members_std": "the reward-model ensemble's disagreement on the policy's samples"}
# the signals that warn by rising above their lowest running mean (the others warn by falling below their best): the
# members agree where their labels were and part as the policy's samples leave that distribution
RISING = {"objective/score_members_std"}


def overoptimized(run: PolicyRun, stats: dict, stop: float | None) -> str | None:
    """Why the run must stop for over-optimization, or None: the running mean of a signal that the reward model's
    score cannot fool (WATCHED: the true reward where one is known; in an online run, the scoring reward model's
    agreement with the labelers on fresh samples it was not trained on) has fallen more than `stop` below its best,
    or that of one that rises as the policy leaves the distribution its reward model was trained on (RISING: a
    reward-model ensemble's disagreement on the policy's own samples, in the members' normalized units) has risen
    more than `stop` above its lowest; the score being no guide any more (Gao et al. 2022: the true reward peaks
    and falls while the proxy keeps rising). run.watched keeps each signal's [running mean, best or lowest]."""
    reason = None
    for key, what in WATCHED.items():
        x = stats.get(key)
        if x is None or not math.isfinite(x):
            continue
        rising = key in RISING
        prev, edge = run.watched.get(key, (None, math.inf if rising else -math.inf))
        ema, best = running_mean(prev, edge, x)
        edge = min(edge, ema) if rising else best
        run.watched[key] = [ema, edge]
        moved, way = (ema - edge, "above its lowest") if rising else (edge - ema, "below its best")
        if reason is None and stop is not None and moved > stop:
            reason = (f"over-optimization: {what}'s running mean {ema:+.3f} is {moved:.3f} {way} {edge:+.3f} "
                      f"(ppo.overoptimization_stop = {stop})")  # fmt: skip
    return reason


def training_forward(model, compile: str, device: torch.device) -> Callable:
    """forward(mb) -> (logprobs, values, entropy) [b, T] for ppo_update. Compiled (compiles_forwards) it is one
    graph: every minibatch has the same shape, and inductor fuses the layer norms, activations and the log-softmax
    and entropy over the vocabulary that eager runs as separate passes over [b, T, V] tensors."""
    call = torch.compile(model, dynamic=False) if compiles_forwards(compile, device) else model
    return lambda mb: call(mb.queries, mb.responses, mb.prefix)


def queries_per_rollout(cfg: Config, episodes: int) -> int:
    """Queries a rank's rollout of `episodes` samples draws: all of them for PPO, one per ppo.rloo_k for a group
    estimator (rloo, grpo, dr_grpo, reinforce_pp_baseline)."""
    k = cfg.ppo.samples_per_query
    if episodes % k:
        raise UserError(f"ppo.rloo_k={k} must divide each rank's share of ppo.batch_size ({episodes})")
    return episodes // k


def train_policy(cfg: Config, run: PolicyRun, score_fn: ScoreFn, log, run_dir: Path, ctx: TaskContext,
                 on_update: Callable[[PolicyRun, dict], object] | None = None) -> dict:  # fmt: skip
    """The outer loop, from run.update to ppo.num_updates. Returns the last update's stats."""

    n_updates, B = cfg.ppo.num_updates, cfg.ppo.batch_size
    if n_updates <= 0:
        raise UserError(f"ppo.total_episodes={cfg.ppo.total_episodes} is less than one batch ({B})")
    if run.update >= n_updates and (Path(run_dir) / "policy").exists():
        # a finished run resumed: its policy is published already; its last update's figures are its result
        if dist.is_main():
            print(f"{run_dir} finished all {n_updates} updates already: nothing to train", flush=True)
        rows = read_metrics(Path(run_dir) / "metrics.jsonl") if (Path(run_dir) / "metrics.jsonl").exists() else []
        return {k: v for k, v in rows[-1].items() if k not in ("phase", "step")} if rows else {}
    # each rank samples and updates on its share of the global batch, in nminibatches minibatches of its own
    B_rank = dist.split_global(B, "ppo.batch_size", cfg.ppo.nminibatches)
    n_queries = queries_per_rollout(cfg, B_rank)
    model = parallel.wrap(run.policy, cfg.run.parallel)  # DDP (or FSDP, sharded in build_run) averages the gradients
    forward = training_forward(model, cfg.run.compile, ctx.device)
    bar = progress(n_updates, "PPO updates", initial=run.update)
    stats: dict = {}
    while run.update < n_updates:
        t0 = time.time()
        lr = cfg.ppo.lr * (1 - run.update / n_updates)  # linear decay to 0 over the run
        for g in run.optimizer.param_groups:
            g["lr"] = lr
        vf_lr = (cfg.ppo.vf_lr or cfg.ppo.lr) * (1 - run.update / n_updates)
        for g in run.value_optimizer.param_groups if run.value_optimizer is not None else []:
            g["lr"] = vf_lr
        rollout, stats, extra = make_rollout(run, score_fn, run.stream.next(n_queries), cfg, ctx)
        stats = dist.all_reduce_mean(stats)  # the KL controller, the andon cord and the logs see all ranks' batch
        run.policy.train()
        opt = run.optimizer if run.value_optimizer is None else run.optimizers  # a separate value model's own too
        stats |= ppo_update(forward, opt, rollout, cfg.ppo, run.gen_ppo,
                            autocast=ctx.autocast, reduce=dist.all_reduce_mean)
        run.policy.eval()
        run.kl_ctl.update(stats["objective/kl"], B)  # 6.
        run.update += 1
        run.elapsed += time.time() - t0
        if run.value_optimizer is not None:
            stats["ppo/vf_lr"] = vf_lr
        stats |= {"ppo/lr": lr, "elapsed/updates": run.update, "elapsed/episodes": run.update * B,
                  "elapsed/fps": B * cfg.task.response_length / (time.time() - t0),
                  "elapsed/time": run.elapsed}  # fmt: skip
        if on_update is not None:  # may add metrics of its own before they are written
            seen = set(stats)
            on_update(run, stats)
            stats |= dist.all_reduce_mean({k: v for k, v in stats.items() if k not in seen})
        stats |= dist.all_reduce_mean({k: stats[k] for k in ("elapsed/fps", "elapsed/time")})  # clocks differ
        log.scalars(stats, run.update)
        if (run.update % cfg.run.log_interval == 0 or run.update == 1) and dist.is_main():
            _print_samples(run, rollout, extra, ctx, log, cfg)
        crash_point("train:logged")
        reason = andon_check(run, stats, cfg) or nonfinite_parameters(run)
        if reason:  # the poisoned state is not saved: the last good checkpoint stays what --resume finds
            bar.close()
            raise andon_stop(run, run_dir, reason)
        if run.update % cfg.run.save_interval == 0 or run.update == n_updates:
            save_checkpoint(run, run_dir, cfg)
            crash_point("train:saved")
        bar.update(1)
        bar.set_postfix(score=f"{stats['objective/score']:+.3f}", kl=f"{stats['objective/kl']:.2f}",
                        beta=f"{stats['objective/kl_coef']:.3f}")  # fmt: skip
    bar.close()
    policy = whole_for_saving(run.policy)  # under FSDP a collective
    if dist.is_main():
        assert policy is not None  # rank 0 keeps its policy, plain or gathered
        save_policy(policy, Path(run_dir) / "policy", card=policy_card(cfg, stats, run.update))
    dist.barrier()
    return stats


def policy_card(cfg: Config, stats: dict, updates: int) -> CardInfo:
    """The final policy's model card: the last training batch's figures (the run's own held-out evaluation, where
    it has one, is added by `lmprefs push` from report.json)."""
    names = {"objective/score": "reward-model score, last batch", "objective/true_reward": "true reward, last batch",
             "objective/kl": "KL from the base, last batch (nats)", "objective/kl_coef": "final KL coefficient"}
    results: dict = {"PPO updates": updates}
    results |= {label: float(stats[k]) for k, label in names.items() if k in stats}
    return CardInfo(cfg.ppo.estimator, cfg, results)


def andon_stop(run: PolicyRun, run_dir: Path, reason: str) -> AndonStop:
    """Record why the run stopped in RUN_DIR/ANDON (which `--resume` reads) and build the exception to raise."""
    import json

    last = run.saved_update
    if dist.is_main():
        row = {"update": run.update, "reason": reason, "last_good_update": last}
        atomic_write_text(Path(run_dir) / "ANDON", json.dumps(row) + "\n")
    kept = (f"the last good checkpoint (update {last}) is kept in {run_dir}/checkpoint" if last is not None
            else "no checkpoint had been saved yet")  # fmt: skip
    return AndonStop(f"andon cord pulled at update {run.update}: {reason}; {kept}")


def _print_samples(run: PolicyRun, rollout: Rollout, extra: dict, ctx: TaskContext, log, cfg: Config,
                   n: int = 3) -> None:
    """Three samples in the original's format (train_policy.py#L423-L430), also appended to samples.jsonl."""
    from tqdm import tqdm

    tok = run.policy.tokenizer
    beta = run.kl_ctl.value
    rows = []
    for i in range(min(n, len(rollout))):
        q = decode(tok, ctx.shown(rollout.queries[i : i + 1]))[0]
        r = response_texts(tok, extra["responses"][i : i + 1], cfg.task)[0]
        score, kl = rollout.scores[i].item(), extra["kl"][i].item()
        tqdm.write(f"{show(q)}\n{show(r)}\n  score = {score:+.3f}\n  kl = {kl:+.3f}\n"
                   f"  total = {score - beta * kl:+.3f}")
        rows.append({"query": q, "response": r, "score": score, "kl": kl, "total": score - beta * kl})
    log.samples(rows, run.update)
