"""`lmprefs sample`: continuations from the initial model of a preset or from a trained policy, printed in the
original's sample.py format (a rule of '=', the query, the response; newlines shown as ⏎)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from lmprefs.data.queries import task_queries
from lmprefs.data.tasks import decode, format_queries
from lmprefs.errors import UserError
from lmprefs.models.artifacts import load_policy
from lmprefs.models.loading import load_lm, max_positions
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.pipeline.task import HELDOUT_QUERIES
from lmprefs.runtime.device import autocast, setup_torch


def sample_texts(cfg, n: int, policy_dir: Path | None = None, temperature: float | None = None,
                 seed: int | None = None, split: str = "heldout") -> list[tuple[str, str]]:  # fmt: skip
    """(query, response) texts: n queries of the split continued by a saved policy, or by cfg's initial model."""

    device, dtype = setup_torch(cfg.run)
    temperature = temperature if temperature is not None else cfg.task.temperature
    if not (math.isfinite(temperature) and temperature > 0):  # nan and inf sample nothing but end-of-text tokens
        raise UserError(f"--temperature {temperature}: must be a positive finite number")
    if policy_dir is not None:
        policy = load_policy(policy_dir, device, temperature)
        model, tok = policy.lm, policy.tokenizer
    else:
        model, tok = load_lm(cfg.task.initial_model, device)
    train, heldout, prefix, suffix = task_queries(cfg.task, tok, max_positions(model), HELDOUT_QUERIES)
    pool = heldout if split == "heldout" else train
    seed = cfg.run.seed if seed is None else seed
    gen = torch.Generator(device=device).manual_seed(seed)
    pick = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:n]
    queries = pool[pick].to(device)
    with autocast(device, dtype):
        responses, _ = sample(model, format_queries(queries, prefix, suffix), cfg.task.response_length,
                              temperature, len(tok), gen, **sampler_options(cfg.run))  # fmt: skip
    return list(zip(decode(tok, queries), decode(tok, responses), strict=True))
