"""`lmprefs sample`: queries and sampled continuations from a preset's initial model or a trained policy, or the
best of N of them under a reward."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmprefs.cli.common import command_parser, help_with_config, seed_arg
from lmprefs.errors import UserError

DEFAULT_PRESET = "austen-sentiment"


def sample_cli(a: argparse.Namespace, pairs) -> int:
    from lmprefs.data.tasks import show
    from lmprefs.recipes.sample import sample_texts
    from lmprefs.runtime.resolve import resolve_config

    if a.n <= 0:
        raise UserError(f"--n {a.n}: must be positive")
    _check_best_of(a)
    policy_dir = None
    if a.run_dir:
        run_dir = Path(a.run_dir)
        if run_dir.is_file():
            raise UserError(f"{run_dir}: is a file, expected a train-policy run directory")
        if not (run_dir / "config.json").is_file():
            raise UserError(f"{run_dir} is not a run directory (no config.json)")
        if a.preset is not None:  # the run's own config would replace it without a word
            raise UserError(f"--preset {a.preset}: {run_dir} is a run directory with its own config "
                            f"({run_dir / 'config.json'}); drop --preset")  # fmt: skip
        cfg = resolve_config("", pairs, config_file=str(run_dir / "config.json"))
        policy_dir = run_dir / "policy"
        if not (policy_dir / "lmprefs.json").is_file():
            raise UserError(f"{run_dir} holds no trained policy yet ({policy_dir} is missing)")
    else:
        cfg = resolve_config(a.preset or DEFAULT_PRESET, pairs)
    if a.best_of is not None:
        return _print_best_of(a, cfg, policy_dir)
    for q, r in sample_texts(cfg, a.n, policy_dir, a.temperature, a.seed, a.split):
        print("=" * 80)
        print(show(q))
        print(show(r))
    return 0


def _check_best_of(a: argparse.Namespace) -> None:
    """--best-of N needs N >= 1 and exactly one reward; a reward needs --best-of (checked before any model loads)."""
    if a.best_of is not None and a.best_of < 1:
        raise UserError(f"--best-of {a.best_of}: must be at least 1")
    if a.reward_model is not None and a.reward is not None:
        raise UserError(f"--reward-model {a.reward_model} and --reward {a.reward}: choose one")
    given = a.reward_model is not None or a.reward is not None
    if a.best_of is not None and not given:
        raise UserError(f"--best-of {a.best_of}: needs a reward to rank the samples (--reward-model DIR or "
                        "--reward vader|descriptiveness|module:function)")  # fmt: skip
    if given and a.best_of is None:
        what = f"--reward-model {a.reward_model}" if a.reward_model is not None else f"--reward {a.reward}"
        raise UserError(f"{what}: ranks samples only with --best-of N")


def _print_best_of(a: argparse.Namespace, cfg, policy_dir) -> int:
    from lmprefs.data.tasks import show
    from lmprefs.recipes.sample import best_of_n
    from lmprefs.training.scaling_laws import bon_kl

    rm = Path(a.reward_model) if a.reward_model is not None else None
    rows = best_of_n(cfg, a.n, a.best_of, policy_dir, a.temperature, a.seed, a.split, reward_model=rm,
                     reward=a.reward)  # fmt: skip
    for row in rows:
        print("=" * 80)
        print(show(row["query"]))
        print(show(row["response"]))
        print(f"score {row['score']:+.4f} (best of {a.best_of}: " + " ".join(f"{x:+.4f}" for x in row["scores"]) + ")")
    # a measured KL would need each chosen sample's probability under best-of-n, i.e. the rank of its reward among
    # many more samples of the query than the n drawn: not cheap, so only the closed form is reported
    print("=" * 80)
    print(f"best-of-{a.best_of}: KL from the sampled model = log {a.best_of} - ({a.best_of} - 1)/{a.best_of} = "
          f"{bon_kl(a.best_of):.4f} nats (analytic, for distinct rewards; not measured); mean chosen score "
          f"{sum(r['score'] for r in rows) / len(rows):+.4f}, mean drawn score "
          f"{sum(sum(r['scores']) for r in rows) / (len(rows) * a.best_of):+.4f}")  # fmt: skip
    return 0


def cmd_sample(argv: list[str]) -> int:
    from lmprefs.config.overrides import split_overrides

    argv, pairs = split_overrides(argv)
    p = command_parser("sample", "lmprefs sample [RUN_DIR | --preset NAME] [--n N] [--temperature T] "
                       "[--best-of N (--reward-model DIR | --reward NAME)] [--section.key V ...]")
    p.add_argument("run_dir", nargs="?", help="a train-policy run directory (default: the preset's initial model)")
    p.add_argument("--preset", default=None,
                   help=f"preset naming the task and initial model (default {DEFAULT_PRESET}; a run has its own)")
    p.add_argument("--n", type=int, default=4, help="number of queries to continue")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the task's; the original's sample.py used 1.0 for runs)")
    p.add_argument("--seed", type=seed_arg, default=None, help="seed (default: run.seed)")
    p.add_argument("--split", choices=["train", "heldout"], default="heldout", help="which queries to draw from")
    p.add_argument("--best-of", type=int, default=None,
                   help="best-of-N as a policy: draw N samples per query and print the one the reward ranks first")
    p.add_argument("--reward-model", default=None, help="with --best-of: a reward-model directory (the policy's "
                   "tokenizer)")  # fmt: skip
    p.add_argument("--reward", default=None,
                   help="with --best-of: a reward on response texts: vader, descriptiveness or module:function")
    help_with_config(p, argv, DEFAULT_PRESET, pairs)
    a = p.parse_args(argv)

    return sample_cli(a, pairs)
