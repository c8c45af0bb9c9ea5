"""`lmprefs sample`: continuations from the initial model of a preset or from a trained policy, printed in the
original's sample.py format (a rule of '=', the query, the response; newlines shown as ⏎)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lmprefs.errors import UserError


def sample_cli(a: argparse.Namespace, pairs) -> int:
    from lmprefs.cli import _config
    from lmprefs.models.lm import autocast, load_lm, load_policy, max_positions
    from lmprefs.pipeline import HELDOUT_QUERIES, setup_torch
    from lmprefs.queries import task_queries
    from lmprefs.sampling import sample, sampler_options
    from lmprefs.tasks import decode, format_queries, show

    if a.n <= 0:
        raise UserError(f"--n {a.n}: must be positive")
    if a.run_dir:
        run_dir = Path(a.run_dir)
        if not (run_dir / "config.json").is_file():
            raise UserError(f"{run_dir} is not a run directory (no config.json)")
        cfg = _config("", pairs, config_file=str(run_dir / "config.json"))
        policy_dir = run_dir / "policy"
        if not (policy_dir / "lmprefs.json").is_file():
            raise UserError(f"{run_dir} holds no trained policy yet ({policy_dir} is missing)")
    else:
        cfg = _config(a.preset, pairs)
    device, dtype = setup_torch(cfg.run)
    temperature = a.temperature if a.temperature is not None else cfg.task.temperature
    if temperature <= 0:
        raise UserError(f"--temperature {temperature}: must be positive")
    if a.run_dir:
        policy = load_policy(policy_dir, device, temperature)
        model, tok = policy.lm, policy.tokenizer
    else:
        model, tok = load_lm(cfg.task.initial_model, device)
    train, heldout, prefix, suffix = task_queries(cfg.task, tok, max_positions(model), HELDOUT_QUERIES)
    pool = heldout if a.split == "heldout" else train
    seed = cfg.run.seed if a.seed is None else a.seed
    gen = torch.Generator(device=device).manual_seed(seed)
    pick = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[: a.n]
    queries = pool[pick].to(device)
    with autocast(device, dtype):
        responses, _ = sample(model, format_queries(queries, prefix, suffix), cfg.task.response_length,
                              temperature, len(tok), gen, **sampler_options(cfg.run))  # fmt: skip
    for q, r in zip(decode(tok, queries), decode(tok, responses)):
        print("=" * 80)
        print(show(q))
        print(show(r))
    return 0
