"""What a policy run holds between updates (`PolicyRun`: the policy, its frozen reference, optimizers, KL
controller, query stream and generators), how a run is built, and the checks that stop it (the "andon cord")."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from lmprefs.config import Config
from lmprefs.errors import UserError
from lmprefs.models import parallel
from lmprefs.models.policy import Policy
from lmprefs.models.trunk import FrozenPrefix
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.device import pick_dtype
from lmprefs.training.optim import TFAdam
from lmprefs.training.ppo import KLController, make_kl_controller

if TYPE_CHECKING:
    from lmprefs.data.queries import QueryStream

# (formatted queries [B, Q'], truncated responses [B, T], FrozenPrefix of the rollout or None) -> scores [B], or a
# reward-model ensemble's member scores [K, B] (rm_score_fn), which the caller reduces by rewards.ensemble_reduce
ScoreFn = Callable[[Tensor, Tensor, FrozenPrefix | None], Tensor]


@dataclass
class PolicyRun:
    """Everything one train_policy run holds; `state_dict` is what a checkpoint resumes."""

    policy: Policy
    ref_lm: nn.Module | None
    optimizer: TFAdam
    kl_ctl: KLController
    stream: QueryStream
    gen_sample: torch.Generator
    gen_ppo: torch.Generator
    update: int = 0
    elapsed: float = 0.0
    best_score_ema: float = -math.inf
    score_ema: float | None = None
    watched: dict = field(default_factory=dict)
    """The over-optimization signals' running means and their bests: metric name -> [running mean, best]."""
    extras: dict = field(default_factory=dict)
    """More state for the checkpoint: name -> an object with state_dict()/load_state_dict() holding tensors and
    plain types only (state.pt loads with weights_only=True): the online reward state, a LoRA reward model's head."""
    saved_update: int | None = None  # the update of the last checkpoint written or loaded (None: none yet)
    value_optimizer: TFAdam | None = None
    """A separate value model's own optimizer (ppo.value_model=separate); None: one optimizer for everything."""

    @property
    def optimizers(self) -> list[TFAdam]:
        return [self.optimizer] + ([self.value_optimizer] if self.value_optimizer is not None else [])

    def state_dict(self) -> dict:
        s = {"optimizer": self.optimizer.state_dict(), "kl_ctl": self.kl_ctl.state_dict(),
             "stream": self.stream.state_dict(), "gen_sample": self.gen_sample.get_state(),
             "gen_ppo": self.gen_ppo.get_state(), "update": self.update, "elapsed": self.elapsed,
             "best_score_ema": self.best_score_ema, "score_ema": self.score_ema,
             "watched": {k: list(v) for k, v in self.watched.items()},
             "extras": {k: v.state_dict() for k, v in self.extras.items()}}  # fmt: skip
        if self.value_optimizer is not None:
            s["value_optimizer"] = self.value_optimizer.state_dict()
        return s

    def load_state_dict(self, s: dict) -> None:
        missing = [k for k in self.extras if k not in s.get("extras", {})]
        if missing:
            raise UserError(f"the checkpoint holds no {missing[0]!r} state, which this run needs")
        if (self.value_optimizer is not None) != ("value_optimizer" in s):
            raise UserError("the checkpoint was written with another ppo.value_model (shared or separate) than this "
                            "run's")  # fmt: skip
        if s["optimizer"] is not None:  # None: loaded already (FSDP's named optimizer state)
            self.optimizer.load_state_dict(s["optimizer"])
        if self.value_optimizer is not None:
            self.value_optimizer.load_state_dict(s["value_optimizer"])
        self.kl_ctl.load_state_dict(s["kl_ctl"])
        self.stream.load_state_dict(s["stream"])
        self.gen_sample.set_state(s["gen_sample"])
        self.gen_ppo.set_state(s["gen_ppo"])
        self.update, self.elapsed = s["update"], s["elapsed"]
        self.best_score_ema, self.score_ema = s["best_score_ema"], s["score_ema"]
        self.watched = {k: list(v) for k, v in s.get("watched", {}).items()}
        if s.get("true_ema") is not None:  # a checkpoint that kept the true reward's running mean alone
            self.watched["objective/true_reward"] = [s["true_ema"], s["best_true_ema"]]
        for k, v in self.extras.items():
            v.load_state_dict(s["extras"][k])


def build_run(cfg: Config, policy: Policy, stream, device) -> PolicyRun:
    # the frozen initial model; with LoRA it is the shared base itself (adapters off), no copy needed
    ref_lm = None if policy.adapter else copy.deepcopy(policy.lm).requires_grad_(False).eval()
    if cfg.run.parallel == "fsdp" and dist.active():  # sharded before the optimizer sees the parameters
        dtype = pick_dtype(cfg.run.dtype, device)
        parallel.fsdp_shard(policy, dtype)
        if ref_lm is not None:
            parallel.fsdp_shard(ref_lm, dtype)
    params, value_opt = policy.trainable_parameters(), None
    if cfg.ppo.value_model == "separate":  # the value model's trunk and head train under their own optimizer
        value = policy.value_parameters()
        params = [p for p in params if all(p is not v for v in value)]
        value_opt = TFAdam(value, lr=cfg.ppo.vf_lr or cfg.ppo.lr)
    seed = dist.rank_seed(cfg.run.seed)  # seed + rank * 100003 (set_mpi_seed); cfg.run.seed in one process
    return PolicyRun(
        policy=policy, ref_lm=ref_lm, optimizer=TFAdam(params, lr=cfg.ppo.lr), kl_ctl=make_kl_controller(cfg.rewards),
        stream=stream, gen_sample=torch.Generator(device=device).manual_seed(seed),
        gen_ppo=torch.Generator(device=device).manual_seed(seed + 1), value_optimizer=value_opt,
    )  # fmt: skip


class AndonStop(RuntimeError):
    """The run stopped itself (NaN/inf, KL past its ceiling, or a collapsing score); the last good checkpoint is
    kept and RUN_DIR/ANDON says why."""


def nonfinite_parameters(run: PolicyRun) -> str | None:
    """Why the parameters must not be saved (NaN/inf in one of them), or None."""
    params = run.policy.trainable_parameters()
    # this rank's shards under FSDP (then all ranks must agree), one host sync, not one per tensor (GPU)
    finite = torch.stack([torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all() for p in params])
    if not dist.any_rank(not bool(finite.all())) if parallel.is_sharded(run.policy) else bool(finite.all()):
        return None
    if bool(finite.all()):
        return f"non-finite parameters on another rank after update {run.update}"
    named = {id(p): n for n, p in run.policy.named_parameters()}
    first = params[int((~finite).nonzero()[0])]
    return f"non-finite parameter {named.get(id(first), '?')} after update {run.update}"
