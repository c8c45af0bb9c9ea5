"""The label-efficiency ratio of directed queries against random ones, and its bootstrap interval over seeds.

k at a budget of b directed labels: the labels random queries need to reach the true reward directed queries reach
with b, divided by b (the measure of "Asking fewer, better questions": the labels a random-query control needs for the
same result, interpolated between budgets). Random's curve is the mean over seeds of the true reward at each of its
budgets, read as piecewise linear in log(labels); the labels it needs for a reward r are the smallest n on that curve
where it reaches r. Outside the measured range k is a bound, not a number:

- directed's reward at or below random's at the smallest budget b_0: random needs at most b_0, k <= b_0 / b (side -1);
- directed's reward above random's everywhere: random needs more than its largest budget b_max, k >= b_max / b
  (side +1).

The interval resamples seeds with replacement (a seed's random and directed runs together: they share a candidate
pool), recomputes both mean curves and k, and takes the percentiles; a bound counts as 0 (side -1) or +inf (side +1)
there, so an interval end that lands on one is a bound too. Torch only.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def labels_to_reach(budgets: Tensor, curve: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """The labels a curve needs to reach each target: budgets [B] increasing, curve [..., B] (the reward at each
    budget), target [...] -> (labels [...], side [...] int: 0 interpolated, -1 reached at budgets[0] already (at
    most), +1 not reached by budgets[-1] (more than)). Interpolation is linear in log(labels) between the first pair
    of budgets where the curve crosses the target from below."""
    logb = budgets.double().log()  # [B]
    c, t = curve.double(), target.double().unsqueeze(-1)  # [..., B], [..., 1]
    below = c < t  # [..., B]
    # first budget whose reward reaches the target; B when none does
    first = torch.where(below.all(-1), torch.full_like(t[..., 0], len(budgets), dtype=torch.long),
                        (~below).double().argmax(-1))  # fmt: skip
    side = torch.where(first == 0, -1, torch.where(first == len(budgets), 1, 0))
    hi = first.clamp(1, len(budgets) - 1)  # [...]: the segment (hi - 1, hi) for interpolated targets
    c0, c1 = c.gather(-1, (hi - 1).unsqueeze(-1))[..., 0], c.gather(-1, hi.unsqueeze(-1))[..., 0]
    frac = ((t[..., 0] - c0) / (c1 - c0).where(side == 0, torch.ones_like(c0))).clamp(0, 1)
    logn = logb[hi - 1] + frac * (logb[hi] - logb[hi - 1])
    n = torch.where(side == -1, budgets[0].double(), torch.where(side == 1, budgets[-1].double(), logn.exp()))
    return n, side


def efficiency_ratio(budgets: Tensor, random: Tensor, directed: Tensor, rows: Tensor | None = None
                     ) -> tuple[Tensor, Tensor]:  # fmt: skip
    """k at each directed budget from per-seed true rewards: budgets [B], random [S, B], directed [S, B] (the same
    budgets) and the seeds to average `rows` [D, S'] (indices into S; None: every seed once, D = 1) ->
    (k [D, B], side [D, B]) as `labels_to_reach` gives them (side -1: k is at most the value, +1: at least)."""
    if rows is None:
        rows = torch.arange(len(random)).unsqueeze(0)
    r = random.double()[rows].mean(1)  # [D, B]: random's mean curve of each resample
    d = directed.double()[rows].mean(1)  # [D, B]
    n, side = labels_to_reach(budgets, r.unsqueeze(1).expand(-1, len(budgets), -1), d)  # [D, B]
    return n / budgets.double(), side


def bootstrap_rows(seeds: int, draws: int, seed: int) -> Tensor:
    """[draws, seeds]: seed indices drawn with replacement, from a generator seeded with `seed`."""
    return torch.randint(seeds, (draws, seeds), generator=torch.Generator().manual_seed(seed))


def percentile_interval(k: Tensor, side: Tensor, level: float = 0.95) -> tuple[float, float]:
    """The (lower, upper) percentiles of bootstrap draws k [D] (nearest rank: the smallest draw with at least that
    share at or below it), a bound side -1 counting as 0 and +1 as +inf."""
    x = torch.where(side < 0, 0.0, torch.where(side > 0, math.inf, k.double())).sort().values  # [D]
    D, tail = len(x), (1 - level) / 2
    lo, hi = math.ceil(tail * D - 1e-9) - 1, math.ceil((1 - tail) * D - 1e-9) - 1
    return float(x[max(lo, 0)]), float(x[min(hi, D - 1)])
