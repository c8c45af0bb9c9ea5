"""`experiment compare`'s arms: the kinds it runs (the PPO family, each also at beta 0, DPO offline and online,
best-of-n), what `experiment compare` is asked to run (`Plan`), and the arms of a plan, one per kind and setting
(`arm_list`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from lmprefs.recipes.compare_lengths import BETA0, is_beta0
from lmprefs.training.frontier import DEFAULT_BETAS

# the PPO-family arms: what each changes in the ppo section
PPO_FAMILY = {"ppo": {"value_model": "shared", "estimator": "ppo"},
              "ppo-separate": {"value_model": "separate", "estimator": "ppo"},
              "rloo": {"value_model": "shared", "estimator": "rloo"},
              "grpo": {"value_model": "shared", "estimator": "grpo", "kl_in": "loss"},
              "grpo-kl-reward": {"value_model": "shared", "estimator": "grpo", "kl_in": "reward"},
              "dr-grpo": {"value_model": "shared", "estimator": "dr_grpo"},
              "reinforce-pp-baseline": {"value_model": "shared", "estimator": "reinforce_pp_baseline"}}  # fmt: skip
# each PPO-family kind at beta 0 too, swept over its training length (compare_lengths)
BETA0_KINDS = {k + BETA0: k for k in PPO_FAMILY}
OFFLINE_DPO = ("dpo-pairwise", "dpo-listwise")  # train-dpo on the store's labels, dpo.loss after the dash
ONLINE_DPO = "dpo-online"  # train-dpo --online on its own samples, judged by the reward model (compare_dpo)
ARMS = (*PPO_FAMILY, *BETA0_KINDS, *OFFLINE_DPO, ONLINE_DPO, "best-of-n")
NEEDS_RM = {*PPO_FAMILY, *BETA0_KINDS, ONLINE_DPO, "best-of-n"}
DEFAULT_EVAL_QUERIES = 64


def is_dpo(kind: str) -> bool:
    """A kind swept over dpo.beta (--dpo-betas): offline or online DPO."""
    return kind in OFFLINE_DPO or kind == ONLINE_DPO


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `experiment compare` runs. labels: the store's label count (None: labels.num_train); n_eval: held-out
    queries (0: 64, or all the task sets aside if fewer); db: an existing store instead of sampling and labeling
    one."""

    arms: tuple[str, ...] = (*PPO_FAMILY, *OFFLINE_DPO, "best-of-n")
    kl_coefs: tuple[float, ...] = (0.03, 0.1, 0.3)
    dpo_betas: tuple[float, ...] = (0.03, 0.1, 0.3)
    best_of: tuple[int, ...] = (2, 4, 8, 16)
    seeds: int = 1
    labels: int | None = None
    n_eval: int = 0
    eval_samples: int = 2
    samples: int = 256
    betas: tuple[float, ...] = DEFAULT_BETAS
    min_ess: float = 10.0
    db: Path | None = None
    match_kl: tuple[float, ...] = ()
    lengths: tuple[int, ...] = ()
    """Updates after which each beta-0 kind's run is evaluated (resolve_lengths: its end always among them)."""
    kind_kl_coefs: tuple[tuple[str, tuple[float, ...]], ...] = ()
    """(kind, its KL coefficients) of the PPO-family kinds swept over their own, in place of kl_coefs: a kind whose
    KL barely moves with beta over kl_coefs needs a wider sweep than the others to reach theirs."""

    def coefs(self, kind: str) -> tuple[float, ...]:
        """The KL coefficients a PPO-family kind is swept over."""
        return dict(self.kind_kl_coefs).get(kind, self.kl_coefs)


def arm_list(plan: Plan) -> list[tuple[str, str, str, float]]:
    """(name, kind, setting, value) of every arm, in plan.arms' order: one per KL coefficient of a PPO-family kind,
    one per dpo.beta of a DPO kind (offline or online), one per n of best-of-n, one per length of a beta-0 kind
    (one run of them all)."""
    out = []
    for kind in plan.arms:
        if is_beta0(kind):
            out += [(f"{kind}-u{u}", kind, f"kl_coef 0, {u} updates", float(u)) for u in plan.lengths]
        elif kind in PPO_FAMILY:
            out += [(f"{kind}-beta{c:g}", kind, f"kl_coef {c:g}", c) for c in plan.coefs(kind)]
        elif is_dpo(kind):
            out += [(f"{kind}-beta{b:g}", kind, f"dpo.beta {b:g}", b) for b in plan.dpo_betas]
        else:
            out += [(f"best-of-{n}", kind, f"n {n}", float(n)) for n in plan.best_of]
    return out
