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
    p.add_argument("--eval-queries", type=int, default=256, help="held-out queries for the true-reward evaluation")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out query")
    help_with_config(p, argv, "quickstart", pairs)
    a = p.parse_args(argv)
    from lmprefs.recipes.quickstart import chance, run_quickstart, true_reward_name
    from lmprefs.training.policy_run import AndonStop

    if a.eval_queries < 2:
        raise UserError(f"--eval-queries {a.eval_queries}: must be at least 2 (a standard error needs two)")
    if a.eval_samples < 1:
        raise UserError(f"--eval-samples {a.eval_samples}: must be at least 1")
    cfg = resolve_config(a.preset, pairs)
    if inert := inert_overrides(cfg, pairs):
        raise UserError(inert[0])
    random_questions_only(cfg, "quickstart")
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
