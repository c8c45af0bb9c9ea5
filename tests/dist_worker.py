"""Run by tests/test_distributed.py, as one plain process or under `torchrun --nproc-per-node 2`: one reward-model
epoch and one PPO update on fixed data, each rank on its share; rank 0 saves the final parameters and the reduced
metrics to argv[1]. The data are built identically on every rank from fixed seeds."""

from __future__ import annotations

import copy
import dataclasses
import sys

import torch

from lmprefs import distributed as dist
from lmprefs.config import preset
from lmprefs.labels.types import get as get_label_type
from lmprefs.models.lm import Policy, RewardModel, load_lm
from lmprefs.tasks import format_queries
from lmprefs.training.optim import TFAdam
from lmprefs.training.ppo import Rollout, kl_penalized_rewards, ppo_update
from lmprefs.training.reward import Comparisons, train_epoch

R = dataclasses.replace
N, S, B = 12, 4, 8  # labeled questions, samples per question, PPO episodes (global)


def reward_epoch(cfg, model, tok):
    g = torch.Generator().manual_seed(0)
    T, Q = cfg.task.response_length, cfg.task.query_length
    data = Comparisons(torch.randint(0, 1000, (N, Q), generator=g), torch.randint(0, 1000, (N, S, T), generator=g),
                       torch.randint(0, S, (N,), generator=g), torch.arange(N))  # fmt: skip
    # a global batch of 8 in microbatches of 2 (DDP's no_sync path), then a last batch of 4
    cfg = R(cfg, train_reward=R(cfg.train_reward, batch_size=8, microbatch=2, epochs=2))
    rm = RewardModel(copy.deepcopy(model), tok, seed=1)
    rm.lm.requires_grad_(True)
    before = {k: v.detach().clone() for k, v in rm.state_dict().items()}
    stats = train_epoch(rm, data, get_label_type("best_of_4"), cfg, [], [], torch.device("cpu"), torch.float32)
    after = {k: v.detach().clone() for k, v in rm.state_dict().items()}
    return after, stats | {"moved": max((after[k] - before[k]).abs().max().item() for k in after)}


def ppo_step(cfg, model, tok):
    """A given rollout of B episodes; its second half repeats the first half's rewards and values (not its tokens),
    so each rank's per-minibatch whitening (the original's) uses the same moments as one process on the whole."""
    g = torch.Generator().manual_seed(1)
    T = cfg.task.response_length
    policy = Policy(copy.deepcopy(model), tok, cfg.task.temperature)
    queries = format_queries(torch.randint(0, 1000, (B, cfg.task.query_length), generator=g), [], [])
    responses = torch.randint(0, 1000, (B, T), generator=g)
    with torch.no_grad():
        logprobs, _, _ = policy(queries, responses)
    ref = logprobs - 0.1 * torch.rand(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    scores = torch.randn(B, generator=g)
    values[B // 2 :], scores[B // 2 :] = values[: B // 2], scores[: B // 2]
    ref[B // 2 :] = ref[: B // 2] + (logprobs[B // 2 :] - logprobs[: B // 2])  # the same KL, so the same rewards
    rewards, _, _ = kl_penalized_rewards(logprobs, ref, scores, 0.15)
    rollout = Rollout(queries, responses, logprobs, ref, values, scores, rewards)
    part = B // dist.world()
    mine = rollout[slice(dist.rank() * part, (dist.rank() + 1) * part)]
    ppo_cfg = R(cfg.ppo, nminibatches=1, noptepochs=2, lr=1e-3)
    model_ = dist.wrap(policy)
    opt = TFAdam(policy.trainable_parameters(), lr=ppo_cfg.lr)
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    stats = ppo_update(lambda mb: model_(mb.queries, mb.responses), opt, mine, ppo_cfg,
                       torch.Generator().manual_seed(2), reduce=dist.all_reduce_mean)  # fmt: skip
    after = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    return after, stats | {"moved": max((after[k] - before[k]).abs().max().item() for k in after)}


def main(out: str) -> None:
    dist.init()
    cfg = preset("tiny")
    torch.manual_seed(0)
    model, tok = load_lm("tiny-gpt2")
    rm_params, rm_stats = reward_epoch(cfg, model, tok)
    pol_params, pol_stats = ppo_step(cfg, model, tok)
    if dist.is_main():
        torch.save({"rm": rm_params, "rm_stats": rm_stats, "policy": pol_params, "ppo_stats": pol_stats,
                    "world": dist.world()}, out)  # fmt: skip
    dist.teardown()


if __name__ == "__main__":
    main(sys.argv[1])
