"""`lmprefs sample`: queries and sampled continuations from a preset's initial model or a trained policy."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmprefs.cli.common import command_parser, help_with_config
from lmprefs.errors import UserError


def sample_cli(a: argparse.Namespace, pairs) -> int:
    from lmprefs.data.tasks import show
    from lmprefs.recipes.sample import sample_texts
    from lmprefs.runtime.resolve import resolve_config

    if a.n <= 0:
        raise UserError(f"--n {a.n}: must be positive")
    policy_dir = None
    if a.run_dir:
        run_dir = Path(a.run_dir)
        if run_dir.is_file():
            raise UserError(f"{run_dir}: is a file, expected a train-policy run directory")
        if not (run_dir / "config.json").is_file():
            raise UserError(f"{run_dir} is not a run directory (no config.json)")
        cfg = resolve_config("", pairs, config_file=str(run_dir / "config.json"))
        policy_dir = run_dir / "policy"
        if not (policy_dir / "lmprefs.json").is_file():
            raise UserError(f"{run_dir} holds no trained policy yet ({policy_dir} is missing)")
    else:
        cfg = resolve_config(a.preset, pairs)
    for q, r in sample_texts(cfg, a.n, policy_dir, a.temperature, a.seed, a.split):
        print("=" * 80)
        print(show(q))
        print(show(r))
    return 0


def cmd_sample(argv: list[str]) -> int:
    from lmprefs.config.overrides import split_overrides

    argv, pairs = split_overrides(argv)
    p = command_parser("sample", "lmprefs sample [RUN_DIR] [--preset NAME] [--n N] [--temperature T] "
                       "[--section.key V ...]")
    p.add_argument("run_dir", nargs="?", help="a train-policy run directory (default: the preset's initial model)")
    p.add_argument("--preset", default="austen-sentiment", help="preset naming the task and initial model")
    p.add_argument("--n", type=int, default=4, help="number of queries to continue")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the task's; the original's sample.py used 1.0 for runs)")
    p.add_argument("--seed", type=int, default=None, help="seed (default: run.seed)")
    p.add_argument("--split", choices=["train", "heldout"], default="heldout", help="which queries to draw from")
    help_with_config(p, argv, "austen-sentiment", pairs)
    a = p.parse_args(argv)

    return sample_cli(a, pairs)
