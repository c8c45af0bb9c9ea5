"""What `lmprefs quickstart` will take on this machine, before it runs (`lmprefs quickstart --plan`): each stage's
matmul FLOPs (`lmprefs.recipes.plan.stage_flops`, the count `benchmarks/roofline.py` divides by measured seconds) at
the share of this machine's measured matmul peak that the stage reached when the full quickstart was measured.

A stage's share of the peak is what its matmuls, small-row products, softmaxes, casts and per-op overheads together
allowed on the machine it was measured on, so the shares are kept by machine class (`shares_class`): a CPU with AMX
reaches a far smaller share of its far higher bf16 peak than one with AVX512-BF16 only. On another CPU of the same
class a share is a guess that held within a few percent where it was checked (the Zen 3 run below), on a GPU a
rougher one. Every figure is an estimate, not a measurement.
"""

from __future__ import annotations

import math

from lmprefs.config import Config, label_type_shape
from lmprefs.models import flops as F
from lmprefs.recipes.plan import Counts, Shape, prefix_cache_bytes, stage_flops

STAGE_SHARES = {
    # docs/results.md, "On the faster AMD EPYC (avx512_vp2intersect), 2026-11-26": the full bf16 run (ee0a5ab),
    # each stage's % of the 960.6 GFLOP/s bf16 peak
    "bfloat16": {"evaluate initial": 0.463, "sample and label": 0.463, "train reward model": 0.469, "PPO": 0.396,
                 "evaluate final": 0.459},
    # docs/results.md, "On an Intel Xeon with AMX, 2026-12-07": the full bf16 run (62a3abc), each stage's seconds
    # (11.9, 65.6, 88.3, 112.1, 15.4) over its FLOPs at the 2,200.3 GFLOP/s bf16 peak. AMX multiplies so fast that
    # the casts, softmaxes, elementwise passes and per-op overheads, which a peak does not measure, take most of each
    # stage: a share under half of the AVX512-BF16 CPU's, where the peak alone would promise 2.5x less time
    "bfloat16 amx": {"evaluate initial": 0.191, "sample and label": 0.202, "train reward model": 0.179, "PPO": 0.145,
                     "evaluate final": 0.204},
    # the AMD EPYC section named first, its full fp32 run with the oneDNN route (4300f71): each stage's seconds
    # (19.6, 109.9, 121.1, 145.4, 26.7) over its FLOPs at the 456.3 GFLOP/s fp32 peak. The Zen 3 quickstart
    # measured from outside (AVX2, fp32, 2026-11-27: 1,594 s) reached 55-68% of its 123.4 GFLOP/s peak by stage: the
    # same within a few %
    "float32": {"evaluate initial": 0.559, "sample and label": 0.582, "train reward model": 0.628, "PPO": 0.540,
                "evaluate final": 0.567},
}  # fmt: skip
SHARES_SOURCE = {
    "bfloat16": "the full quickstart in bf16 on an AMD EPYC with AVX512-BF16 (docs/results.md, 2026-11-26)",
    "bfloat16 amx": "the full quickstart in bf16 on an Intel Xeon with AMX (docs/results.md, 2026-12-07)",
    "float32": "the full quickstart in fp32 on an AMD EPYC with AVX-512 (docs/results.md, 2026-11-26)",
}


def shares_class(dtype: str, cpu_flags: frozenset[str] = frozenset()) -> str:
    """The STAGE_SHARES entry measured on the machine class nearest this one: bf16 on a CPU with AMX tiles apart
    from bf16 elsewhere (AVX512-BF16, and GPUs: a rougher guess), fp32 wherever it runs (matmuls on the vector
    units: AMX has no fp32 tiles)."""
    if dtype == "bfloat16":
        return "bfloat16 amx" if "amx_bf16" in cpu_flags else "bfloat16"
    return "float32"


PEAK_SIZE = 2048
"""Side of the square matmul that measures the peak on a CPU (about 17 GFLOP: a tenth of a second at 120 GFLOP/s);
8192 on a GPU, as the roofline measures it."""
PEAK_REPS = 3


def quickstart_counts(cfg: Config, shape: Shape, d_model: int, n_eval: int, samples: int) -> Counts:
    """The sizes `run_quickstart` runs at: labels.num_train labels from num_train / (1 - heldout_fraction)
    questions (the held-out split is hashed: about the rest), the frozen prefixes kept by the labeling pass where
    they fit the reward model's cache bound (collect_labels' rule), held-out queries x samples per evaluation."""
    questions = math.ceil(cfg.labels.num_train / (1 - cfg.labels.heldout_fraction))
    S, L = label_type_shape(cfg.labels.type)[1], shape.q_len + cfg.task.response_length
    kept = cfg.lora.rank > 0 and questions * S * L * d_model * 4 <= prefix_cache_bytes()
    return Counts(shape.q_len, shape.train_queries, n_eval, samples, questions, cfg.labels.num_train,
                  questions - cfg.labels.num_train, cfg.ppo.num_updates, shape.shared_queries,
                  labeling_prefixes=kept)  # fmt: skip


def plan_quickstart(cfg: Config, facts: F.ModelFacts, counts: Counts, *, peak: float, dtype: str,
                    load_s: float, cpu_flags: frozenset[str] = frozenset()) -> list[dict]:  # fmt: skip
    """[{stage, runs, gflop, seconds}] of the quickstart's six stages (report.json's names, the share of the peak
    each is estimated at in brackets): `load_s` for its assets and model, each other stage's FLOPs at its share
    (STAGE_SHARES of `shares_class(dtype, cpu_flags)`, dtype the autocast dtype's torch name) of `peak` GFLOP/s."""
    shares = STAGE_SHARES[shares_class(dtype, cpu_flags)]
    rows = [{"stage": "assets and model", "runs": 1, "gflop": 0.0, "seconds": load_s}]
    for stage, parts in stage_flops(cfg, facts, counts).items():
        if stage in shares:
            gflop = sum(parts.values()) / 1e9
            rows.append({"stage": f"{stage} ({shares[stage]:.0%} of peak)", "runs": 1, "gflop": gflop,
                         "seconds": gflop / (shares[stage] * peak)})  # fmt: skip
    return rows
