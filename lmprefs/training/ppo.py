"""The PPO math of lm-human-preferences: whitening, KL-penalized rewards, GAE, KL controllers, the clipped losses and
one `ppo_update` over a rollout batch (RLOO's loss, `rloo`, where the rollout carries its advantages). Ported from
`lm_human_preferences/train_policy.py` and `utils/core.py` at openai/lm-human-preferences@cbfd210 (cited as
`train_policy.py#Lxx`); every piece has a NumPy parity test in tests/training/test_ppo_math.py. Imports only torch,
so the math can be read and tested without models or tokenizers.

Shapes: B = rollout batch, b = minibatch, Q = query length, T = response length.

Responses that stop at EOS (task.stop_at_eos) end before T: a `mask` [B, T] marks their real tokens, and each
function takes it to count those only (`masked`). mask=None is the original's fixed-length math, unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lmprefs.training.grpo import NORMALIZERS, group_losses
from lmprefs.training.masked import masked_mean, masked_var, partial_mask
from lmprefs.training.rloo import rloo_losses
from lmprefs.training.surrogate import clipped_surrogate

if TYPE_CHECKING:
    from lmprefs.config import PPOConfig, RewardsConfig


def whiten(x: Tensor, shift_mean: bool = True, mask: Tensor | None = None) -> Tensor:
    """Normalize `x` to variance 1 using moments over *all* its elements (utils/core.py#L336-L341).

    shift_mean=True: mean 0, variance 1 (used for advantages).
    shift_mean=False: divide the deviations by the std but keep the original mean, i.e. (x - mean)/std + mean
    (used for rewards, so a whitened reward keeps its sign on average).
    The variance is biased (divides by N), as `tf.nn.moments`; eps 1e-8 sits inside the rsqrt, as the original.
    With a mask [b, T], the moments are those of the real tokens, and padding whitens to 0.
    """
    if mask is not None:
        mean, var = masked_mean(x, mask), masked_var(x, mask)
    else:
        mean, var = x.mean(), x.var(correction=0)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened if mask is None else torch.where(mask.bool(), whitened, 0)


def kl_penalized_rewards(
    logprobs: Tensor, ref_logprobs: Tensor, scores: Tensor, kl_coef: float, mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token reward -kl_coef * (logp - logp_ref), plus the score on the last token (train_policy.py#L149-L154).

    logprobs, ref_logprobs: [B, T]; scores: [B]. Returns (rewards, non_score_reward, kl), each [B, T].
    With a mask [B, T], the KL of padding is 0 and the score goes on each row's last real token, its stop token.
    """
    kl = logprobs - ref_logprobs  # [B, T] the sampled-token estimate of KL(pi || pi_ref)
    if mask is not None:
        kl = torch.where(mask.bool(), kl, 0)
    non_score_reward = -kl_coef * kl
    rewards = non_score_reward.clone()
    if mask is None:
        rewards[:, -1] += scores  # every response has exactly T tokens, so the last index is the episode's end
    else:
        last = mask.bool().sum(1) - 1  # [B] index of each row's last real token
        rewards[torch.arange(rewards.shape[0], device=rewards.device), last] += scores
    return rewards, non_score_reward, kl


def gae(values: Tensor, rewards: Tensor, gamma: float, lam: float,
        mask: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Generalized advantage estimation over the fixed T steps (train_policy.py#L327-L336).

    values, rewards: [b, T]. The value after the last token is 0 (the episode ends). Returns (advantages, returns),
    each [b, T], with returns = advantages + values (the value target, as in the original; not a discounted sum).
    With a mask [b, T], padding has reward 0 and value 0, so a row's episode ends at its last real token (the value
    after it is 0) and its advantages and returns on padding are 0.
    """
    if mask is not None:
        keep = mask.bool()
        values, rewards = torch.where(keep, values, 0), torch.where(keep, rewards, 0)
    T = rewards.shape[1]
    lastgaelam = torch.zeros_like(rewards[:, 0])  # [b]
    advantages_reversed = []
    for t in reversed(range(T)):
        nextvalues = values[:, t + 1] if t < T - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)  # [b, T]
    return advantages, advantages + values


class FixedKLController:
    """A constant KL coefficient (train_policy.py#L107-L112): used when rewards.kl_target is None."""

    def __init__(self, value: float) -> None:
        self.value = float(value)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional control of the KL coefficient toward a target KL (train_policy.py#L115-L124).

    Per update: beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon, where kl is the mean summed
    per-episode KL of the batch and n_steps the episodes in it (the original passes ppo.batch_size, #L305).
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        mult = 1.0 + proportional_error * n_steps / self.horizon
        self.value *= mult

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(rewards_cfg: RewardsConfig) -> KLController:
    """The original's choice (train_policy.py#L136-L139): adaptive iff a KL target is set."""
    if rewards_cfg.kl_target is None:
        return FixedKLController(rewards_cfg.kl_coef)
    return AdaptiveKLController(rewards_cfg.kl_coef, rewards_cfg.kl_target, rewards_cfg.kl_horizon)


def ppo_losses(  # noqa: PLR0917 (the original's loss inputs, one by one, as in train_policy.py)
    logprobs: Tensor,
    old_logprobs: Tensor,
    vpred: Tensor,
    old_values: Tensor,
    advantages: Tensor,
    returns: Tensor,
    cliprange: float,
    cliprange_value: float,
    vf_coef: float,
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO policy loss + clipped value loss on one minibatch (train_policy.py#L343-L371).

    All inputs [b, T]; `logprobs` and `vpred` carry gradients, the rest are constants of the rollout.
    Returns (loss, stats), stats as detached 0-dim tensors under the original's names (minus ppo/policy/entropy,
    which needs the forward's entropies and is added by `ppo_update`). With a mask [b, T], every mean and variance
    is over the real tokens: padding adds neither loss nor gradient.
    """
    mean, var = _moments(mask)
    # Value loss, clipped around the rollout's values as baselines' ppo2 (#L344-L348)
    vpredclipped = torch.clamp(vpred, old_values - cliprange_value, old_values + cliprange_value)
    vf_losses1 = (vpred - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    vf_loss = 0.5 * mean(torch.max(vf_losses1, vf_losses2))

    # Policy loss, pessimistic clipped surrogate (#L350-L355)
    pg_losses, clipped = clipped_surrogate(torch.exp(logprobs - old_logprobs), advantages, cliprange)
    pg_loss = mean(pg_losses)

    loss = pg_loss + vf_coef * vf_loss  # #L357

    with torch.no_grad():  # #L359-L370; var is biased as tf.nn.moments
        stats = {
            "ppo/loss/policy": pg_loss,
            "ppo/loss/value": vf_loss,
            "ppo/loss/total": loss,
            "ppo/policy/approxkl": 0.5 * mean((logprobs - old_logprobs) ** 2),
            "ppo/policy/clipfrac": mean(clipped),
            "ppo/returns/mean": mean(returns),
            "ppo/returns/var": var(returns),
            "ppo/val/vpred": mean(vpred),
            "ppo/val/error": mean((vpred - returns) ** 2),
            "ppo/val/clipfrac": mean((vf_losses2 > vf_losses1).to(vf_losses1.dtype)),
            "ppo/val/mean": mean(old_values),
            "ppo/val/var": var(old_values),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def _moments(mask: Tensor | None) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """(mean, biased variance) of a [b, T] tensor: over every element (mask None, the original's .mean()), or over
    the real tokens of a mask."""
    if mask is None:
        return (lambda x: x.mean()), (lambda x: x.var(correction=0))
    return (lambda x: masked_mean(x, mask)), (lambda x: masked_var(x, mask))


@dataclass(frozen=True)
class Rollout:
    """One batch of episodes, everything PPO needs; tensors index along dim 0 (B)."""

    queries: Tensor  # [B, Q] token ids
    responses: Tensor  # [B, T] token ids
    logprobs: Tensor  # [B, T] log pi_old(response_t), at the sampling temperature
    ref_logprobs: Tensor  # [B, T] log pi_ref(response_t), same temperature
    values: Tensor  # [B, T] V_old
    scores: Tensor  # [B] reward-model score after truncation/penalty
    rewards: Tensor  # [B, T] -kl_coef * KL, plus the score on the last token
    prefix: object = None  # FrozenPrefix [B, L, d] of query+response, or None: what the forward may reuse
    advantages: Tensor | None = None  # [B] or [B, T] a group estimator's advantages (ppo.estimator rloo, grpo, ...)
    mask: Tensor | None = None  # [B, T] 1 on real tokens (task.stop_at_eos), None when every row is full length
    loss_kl_coef: Tensor | None = None  # [B] beta of the k3 KL term in the loss (ppo.kl_in=loss), else None

    def __getitem__(self, idx: Tensor | slice) -> Rollout:
        # not dataclasses.astuple/asdict: they deep-copy every tensor
        parts: dict[str, Any] = {f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[idx]
                                 for f in fields(self)}  # fmt: skip
        return Rollout(**parts)

    def __len__(self) -> int:
        return self.responses.shape[0]


Forward = Callable[[Rollout], tuple[Tensor, Tensor, Tensor]]


def ppo_update(
    forward: Forward,
    optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    rollout: Rollout,
    cfg: PPOConfig,
    gen: torch.Generator,
    *,
    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    reduce: Callable[[dict[str, float]], dict[str, float]] = lambda stats: stats,
) -> dict[str, float]:
    """cfg.noptepochs passes of clipped PPO over cfg.nminibatches shuffled minibatches (train_policy.py#L180-L196).

    `forward(mb)` returns (logprobs, vpred, entropy), each [b, T], for the minibatch's responses under the current
    policy: logprobs at the sampling temperature, values, per-token entropy. It runs inside `autocast()`; its
    outputs are cast to float32 for the losses (keep the rollout's tensors in float32 too). `optimizer`: one, or
    several stepped together after each minibatch's one backward (a separate value model has its own).
    Returns the stats averaged over all minibatches, as the original's record_step_stats, then over the ranks by
    `reduce` (mpi_allreduce_mean) when several ranks each update on their own share of the batch. Whitening stays per
    rank's minibatch, as in the original (its whiten() takes moments of the local tensor only).
    """
    optimizers = list(optimizer) if isinstance(optimizer, Sequence) else [optimizer]
    B = len(rollout)
    if B % cfg.nminibatches:
        raise ValueError(f"rollout batch {B} is not divisible by ppo.nminibatches={cfg.nminibatches}")
    mb_size = B // cfg.nminibatches
    stat_list: list[dict[str, Tensor]] = []
    for _ in range(cfg.noptepochs):
        order = torch.randperm(B, generator=gen, device=gen.device)  # a fresh shuffle each epoch (#L185)
        order = order.to(rollout.responses.device)
        for start in range(0, B, mb_size):
            mb = rollout[order[start : start + mb_size]]
            with autocast():
                logprobs, vpred, entropy = forward(mb)  # [b, T] each
            mask = partial_mask(mb.mask)  # [b, T], None when no row of the minibatch stopped early
            loss, stats = _minibatch_loss(mb, logprobs.float(), vpred.float(), cfg, mask)
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in optimizers:
                opt.step()

            stats["ppo/policy/entropy"] = _moments(mask)[0](entropy.detach().float())  # #L359: per-token entropy
            stat_list.append(stats)

    keys = list(stat_list[0])
    means = torch.stack([torch.stack([s[k] for s in stat_list]).mean() for k in keys]).tolist()  # one sync
    out = reduce(dict(zip(keys, means, strict=True)))
    # record_step_stats (#L241): from the minibatch-averaged stats, i.e. how well the *current* value head
    # (vpred, before each step) explains the returns: 1 - E[(vpred - R)^2] / Var[R]
    if "ppo/returns/var" in out:  # RLOO has no value head to explain the returns
        returns_var = out["ppo/returns/var"]
        out["ppo/val/var_explained"] = 1.0 - out["ppo/val/error"] / returns_var if returns_var > 0 else float("nan")
    return out


def _minibatch_loss(mb: Rollout, logprobs: Tensor, vpred: Tensor, cfg: PPOConfig,
                    mask: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """The loss of one minibatch: a group estimator's when the rollout carries its advantages, else PPO's. mask
    [b, T]: the real tokens of rows that stopped early (None: all of them)."""
    if mb.advantages is not None and cfg.estimator in NORMALIZERS:
        kl_coef = None if mb.loss_kl_coef is None else mb.loss_kl_coef[0]
        return group_losses(logprobs, mb.logprobs, mb.ref_logprobs, vpred, mb.advantages, cfg.cliprange,
                            normalizer=NORMALIZERS[cfg.estimator], kl_coef=kl_coef, mask=mask)  # fmt: skip
    if mb.advantages is not None:
        return rloo_losses(logprobs, mb.logprobs, vpred, mb.advantages, cfg.cliprange, mask, cfg.rloo_ratio)
    # The original whitens rewards and advantages per minibatch, inside loss() (#L324-L339)
    with torch.no_grad():
        rewards = whiten(mb.rewards, shift_mean=False, mask=mask) if cfg.whiten_rewards else mb.rewards  # [b, T]
        advantages, returns = gae(mb.values, rewards, cfg.gamma, cfg.lam, mask)  # [b, T]
        advantages = whiten(advantages, mask=mask)
    return ppo_losses(logprobs, mb.logprobs, vpred, mb.values, advantages, returns,
                      cfg.cliprange, cfg.cliprange_value, cfg.vf_coef, mask)  # fmt: skip
