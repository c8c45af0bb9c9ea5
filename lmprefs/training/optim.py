"""TF1's AdamOptimizer as a torch optimizer: the "Adam epsilon quirk" of lm-human-preferences.

The original trains everything with `tf.train.AdamOptimizer(lr, epsilon=1e-5)` (utils/core.py#L621-L629 @cbfd210).
TF1 folds Adam's bias correction into the step size and adds epsilon to the *uncorrected* sqrt(v) (the paper's
"epsilon hat", the formula just before its section 2.1):
    lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)
    m    = b1 * m + (1 - b1) * g
    v    = b2 * v + (1 - b2) * g^2
    p   -= lr_t * m / (sqrt(v) + eps)

torch.optim.Adam adds eps to the bias-corrected sqrt(v_hat) instead, which is the same as an epsilon hat of
eps * sqrt(1 - b2^t): ~30x smaller at t=1 for b2=0.999, so early updates are larger. The reproduction measured 6x
the approxkl and 4x the clipfrac in the first epochs with torch Adam (the N-implementation-details blog, item 12;
vwxyzjn/lm-human-preference-details `AdamTensorFlowStyle`). Weight decay and amsgrad do not exist here, as in TF1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, overload

import torch
from torch import Tensor


class TFAdam(torch.optim.Optimizer):
    """Adam with TF1's update rule (see the module docstring). Change `param_groups[i]["lr"]` to schedule the LR.

    State per parameter: `step` (int), `exp_avg` (m), `exp_avg_sq` (v); standard `state_dict`/`load_state_dict`.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-5,
    ) -> None:
        if lr < 0 or eps < 0 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid TFAdam settings: lr={lr}, betas={betas}, eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            params, grads, exp_avgs, exp_avg_sqs, step_sizes = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("TFAdam does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                # bias correction folded into the step size, computed in double as a Python float
                step_sizes.append(-group["lr"] * math.sqrt(1 - beta2**t) / (1 - beta1**t))
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
            if not params:
                continue
            # Whole-tensor foreach ops: one kernel per list, fast enough for 100M+ parameters.
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)  # m += (g - m) * (1 - b1), TF's own form
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)  # v = b2 v + (1 - b2) g^2
            denom = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_add_(denom, group["eps"])  # epsilon hat: on the uncorrected sqrt(v)
            torch._foreach_addcdiv_(params, exp_avgs, denom, step_sizes)  # p -= lr_t * m / (sqrt(v) + eps)
        return loss
