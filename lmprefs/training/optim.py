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
from collections import defaultdict
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
            buckets: dict[tuple, list[tuple[Tensor, ...]]] = defaultdict(list)
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
                row = (p, p.grad, state["exp_avg"], state["exp_avg_sq"])
                buckets[(state["step"], _fusable(row), p.device, p.dtype)].append(row)
            for (t, fusable, _, _), rows in buckets.items():
                _tf_adam_step(rows, t, fusable, group)
        return loss


def _fusable(row: tuple[Tensor, ...]) -> bool:
    """Whether torch's fused Adam kernel can take these tensors: plain, dense, contiguous, of one dtype, on one CPU
    or CUDA device (a tensor subclass such as FSDP2's DTensor goes through the foreach ops instead)."""
    p = row[0]
    return p.device.type in ("cpu", "cuda") and all(
        type(x) in (Tensor, torch.nn.Parameter) and x.is_contiguous() and x.dtype == p.dtype and x.device == p.device
        for x in row
    )


def _tf_adam_step(rows: list[tuple[Tensor, ...]], t: int, fusable: bool, group: dict[str, Any]) -> None:
    """One TF1 Adam step of rows (param, grad, m, v) on one device and dtype, all at step t."""
    params, grads, exp_avgs, exp_avg_sqs = (list(x) for x in zip(*rows, strict=True))
    lr, eps, (beta1, beta2) = group["lr"], group["eps"], group["betas"]
    if fusable:
        # torch's fused Adam, one pass over each tensor where the foreach ops below make six, computes
        # p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps'); eps' = eps/sqrt(1-b2^t) makes that TF1's rule.
        step = torch.tensor(float(t), device=params[0].device)  # read, not advanced, by the kernel
        torch._fused_adam_(
            params, grads, exp_avgs, exp_avg_sqs, [], [step] * len(params),
            lr=lr, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps / math.sqrt(1 - beta2**t),
            amsgrad=False, maximize=False,
        )  # fmt: skip
        return
    # bias correction folded into the step size, computed in double as a Python float
    step_size = -lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)  # m += (g - m) * (1 - b1), TF's own form
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)  # v = b2 v + (1 - b2) g^2
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, eps)  # epsilon hat: on the uncorrected sqrt(v)
    torch._foreach_addcdiv_(params, exp_avgs, denom, value=step_size)  # p -= lr_t * m / (sqrt(v) + eps)
