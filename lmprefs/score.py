"""`lmprefs score`: rewards of texts under a trained reward model. Each input line is a response, or a query and a
response separated by a tab; the query is formatted as in training (the task saved beside the model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lmprefs.errors import UserError


def score_texts(rm, task: dict, pairs: list[tuple[str, str]], device, batch_size: int = 32) -> list[float]:
    from lmprefs.models.lm import PAD
    from lmprefs.tasks import encode_fixed, format_queries

    tok = rm.tokenizer
    prefix, suffix = encode_fixed(tok, task["query_prefix"]), encode_fixed(tok, task["query_suffix"])
    Q, T = task["query_length"], task["response_length"]

    def pad(ids, n):
        ids = ids[:n]
        return ids + [PAD] * (n - len(ids))

    out = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        q = torch.tensor([pad(encode_fixed(tok, a), Q) for a, _ in chunk], device=device)
        r = torch.tensor([pad(encode_fixed(tok, b), T) for _, b in chunk], device=device)
        if (r == PAD).all(-1).any():
            raise UserError(f"line {i + int((r == PAD).all(-1).nonzero()[0]) + 1}: empty response")
        with torch.no_grad():
            out += rm(format_queries(q, prefix, suffix), r).float().tolist()
    return out


def score_cli(a) -> int:
    from lmprefs.models.lm import load_reward_model, pick_device

    path = Path(a.reward_model)
    if not (path / "reward_head.safetensors").is_file():
        raise UserError(f"--reward-model {path}: not a reward-model directory (no reward_head.safetensors)")
    meta = json.loads((path / "lmprefs.json").read_text())
    if "task" not in meta:
        raise UserError(f"{path}/lmprefs.json has no task; was this reward model saved by lmprefs train-reward?")
    if a.file and not Path(a.file).is_file():
        raise UserError(f"input file {a.file} does not exist")
    lines = (Path(a.file).read_text() if a.file else sys.stdin.read()).splitlines()
    pairs = [tuple(line.split("\t", 1)) if "\t" in line else ("", line) for line in lines if line.strip()]
    if not pairs:
        raise UserError("no texts to score (one per line on stdin or in the file)")
    device = pick_device(a.device)
    rm = load_reward_model(path, device).eval()
    for (q, r), s in zip(pairs, score_texts(rm, meta["task"], pairs, device)):
        print(f"{s:+.4f}\t{r}")
    return 0
