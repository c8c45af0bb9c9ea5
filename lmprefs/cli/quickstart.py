"""`lmprefs quickstart`: label, reward model, PPO, held-out evaluation and report in one command."""

from __future__ import annotations

import sys

from lmprefs.cli.common import command_parser, help_with_config, main_rank, random_questions_only, run_dir_for
from lmprefs.errors import UserError


def cmd_quickstart(argv: list[str]) -> int:
    from lmprefs.config.overrides import split_overrides
    from lmprefs.config.validate import inert_overrides
    from lmprefs.runtime.resolve import resolve_config

    argv, pairs = split_overrides(argv)
    p = command_parser("quickstart", "lmprefs quickstart [--preset NAME] [--run-dir DIR] [--section.key VALUE ...]")
    p.add_argument("--preset", default="quickstart", help="preset (default: quickstart, SmolLM2 + Austen + VADER)")
    p.add_argument("--run-dir", default=None, help="output directory (default runs/quickstart-PRESET-TIME)")
    p.add_argument("--eval-queries", type=int, default=None, help="held-out queries for the true-reward evaluation "
                   "(default: up to 256, all the task sets aside where it sets aside fewer)")  # fmt: skip
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out query")
    p.add_argument("--plan", action="store_true", help="print this machine's matmul peak and each stage's estimated "
                   "seconds (FLOP counts at the share of the peak each stage reached when measured); runs and writes "
                   "nothing")  # fmt: skip
    help_with_config(p, argv, "quickstart", pairs)
    a = p.parse_args(argv)
    from lmprefs.recipes.quickstart import chance, run_quickstart, true_reward_name
    from lmprefs.training.policy_run import AndonStop

    if a.eval_queries is not None and a.eval_queries < 2:
        raise UserError(f"--eval-queries {a.eval_queries}: must be at least 2 (a standard error needs two)")
    if a.eval_samples < 1:
        raise UserError(f"--eval-samples {a.eval_samples}: must be at least 1")
    cfg = resolve_config(a.preset, pairs)
    if inert := inert_overrides(cfg, pairs):
        raise UserError(inert[0])
    random_questions_only(cfg, "quickstart")
    if a.plan:
        return _plan(cfg, a.preset, a.eval_queries, a.eval_samples)
    run_dir = run_dir_for(a.run_dir, cfg, "quickstart", a.preset)
    try:
        out = run_quickstart(cfg, run_dir, a.eval_queries, a.eval_samples)
    except AndonStop as e:
        print(f"lmprefs quickstart: {e}", file=sys.stderr)
        return 3
    if not main_rank():
        return 0
    b, f, st = out["before"], out["after"], out["figures"]
    se = (b["stderr"] ** 2 + f["stderr"] ** 2) ** 0.5
    print(f"\nreward model held-out accuracy: {st['rm_accuracy']:.3f} (chance {chance(cfg):.2f})")
    print(f"true reward ({true_reward_name(cfg.labels.labeler)}) on {f['n_queries']} held-out queries: "
          f"{b['mean']:+.4f} +/- {b['stderr']:.4f} -> "
          f"{f['mean']:+.4f} +/- {f['stderr']:.4f} ({(f['mean'] - b['mean']) / se if se else float('nan'):+.1f} s.e.)")
    print(f"final KL {st['kl_heldout']:.2f} nats on the held-out samples (target {cfg.rewards.kl_target}; last "
          f"training batch {st['kl']:.2f}), beta {st['beta']:.4f}; "
          f"total {sum(out['stages'].values()):.0f}s")
    if "response_length" in f:  # task.stop_at_eos: how long the answers are, before and after
        print(f"mean response length: {b['response_length']:.1f} -> {f['response_length']:.1f} tokens "
              f"(cap {cfg.task.response_length})")
    print(f"report: {out['report']}")
    return 0


def _plan(cfg, preset: str, n_eval: int | None, samples: int) -> int:
    """--plan: the model and queries loaded as the quickstart's first stage loads them (timed: that stage's
    estimate), this machine's matmul peak at the run's dtype and threads, and each later stage's FLOPs at its
    measured share of that peak; no run directory is made."""
    import time

    import torch

    from lmprefs.models.flops import ModelFacts
    from lmprefs.models.trunk import shares_queries
    from lmprefs.pipeline.task import setup_eval_task
    from lmprefs.recipes import quickstart_plan as qp
    from lmprefs.recipes.experiment import DEFAULT_EVAL_QUERIES
    from lmprefs.recipes.plan import Shape, format_plan
    from lmprefs.runtime.device import cpu_info
    from lmprefs.runtime.peak import matmul_peak

    t0 = time.time()
    t, n_eval = setup_eval_task(cfg, n_eval, DEFAULT_EVAL_QUERIES)
    load_s = time.time() - t0
    cuda = t.device.type == "cuda"
    try:
        facts = ModelFacts.from_config(t.model.config, cuda=cuda)
    except ValueError as e:
        raise UserError(f"task.initial_model={cfg.task.initial_model}: {e}") from None
    dtype, threads = str(t.dtype).removeprefix("torch."), torch.get_num_threads()
    size = 4 * qp.PEAK_SIZE if cuda else qp.PEAK_SIZE
    peak = matmul_peak(str(t.device), dtype, threads, size, qp.PEAK_REPS)
    shape = Shape(len(t.prefix) + cfg.task.query_length + len(t.suffix), len(t.train_queries), shares_queries(t.model))
    counts = qp.quickstart_counts(cfg, shape, facts.d, n_eval, samples)
    flags = frozenset() if cuda else cpu_info()[1]
    rows = qp.plan_quickstart(cfg, facts, counts, peak=peak, dtype=dtype, load_s=load_s, cpu_flags=flags)
    where = torch.cuda.get_device_name(t.device) if cuda else (cpu_info()[0] or "this CPU")
    print(f"lmprefs quickstart --preset {preset}: {cfg.labels.num_train} labels ({counts.questions} questions), "
          f"{cfg.ppo.num_updates} PPO updates of {cfg.ppo.batch_size}, {n_eval} held-out queries x {samples} "
          f"samples, {cfg.task.initial_model}")  # fmt: skip
    print(f"this machine: {where}, {threads} threads, {dtype} (run.dtype={cfg.run.dtype}); matmul peak {peak:.1f} "
          f"GFLOP/s ({dtype} {size}x{size}, best of {qp.PEAK_REPS})")  # fmt: skip
    source = qp.SHARES_SOURCE[qp.shares_class(dtype, flags)]
    print(format_plan(rows, basis=f"assets and model: timed now, as the quickstart loads them; the other stages: "
                      f"their FLOPs at the share of this peak each reached in {source}"
                      f"{' (measured on CPUs: on a GPU a rougher guess)' if cuda else ''}. "
                      "An estimate, not a measurement"))  # fmt: skip
    return 0
