"""`lmprefs score`: rewards of texts under a trained reward model. Each input line is a response, or a query and a
response separated by a tab; the query is formatted as in training (the task saved beside the model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lmprefs.errors import UserError


def score_texts(rm, task: dict, pairs: list[tuple[str, str]], device, batch_size: int = 32,
                truncate: bool = False) -> tuple[list[float], dict[str, int]]:  # fmt: skip
    """Rewards of (query, response) texts -> (scores, counts). Whole texts are scored (padded to the longest in
    each batch) unless `truncate`, which cuts queries and responses to the task's query_length / response_length
    as in training. Texts longer than the model's context keep their last tokens. counts: "longer" (texts beyond
    the trained lengths), "cut" (texts that were cut)."""
    from lmprefs.models.lm import PAD, max_positions
    from lmprefs.tasks import encode_fixed, format_queries

    tok = rm.tokenizer
    prefix, suffix = encode_fixed(tok, task["query_prefix"]), encode_fixed(tok, task["query_suffix"])
    Q, T = task["query_length"], task["response_length"]
    context = max_positions(rm.lm) - len(prefix) - len(suffix)
    counts = {"longer": 0, "cut": 0}

    def pad(rows, n):
        return [ids + [PAD] * (n - len(ids)) for ids in rows]

    out = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        qs, rs = [encode_fixed(tok, a) for a, _ in chunk], [encode_fixed(tok, b) for _, b in chunk]
        for j, (q, r) in enumerate(zip(qs, rs, strict=True)):
            if not r:
                raise UserError(f"line {i + j + 1}: empty response")
            longer = len(q) > Q or len(r) > T
            counts["longer"] += longer
            if truncate:
                q, r = q[:Q], r[:T]
            if len(q) + len(r) > context:  # keep the response and the end of the query
                r = r[:context]
                q = q[len(q) - (context - len(r)) :] if context > len(r) else []
            counts["cut"] += truncate and longer or len(q) + len(r) < len(qs[j]) + len(rs[j])
            qs[j], rs[j] = q, r
        q = torch.tensor(pad(qs, max(map(len, qs))), device=device, dtype=torch.long).reshape(len(chunk), -1)
        r = torch.tensor(pad(rs, max(map(len, rs))), device=device, dtype=torch.long)
        with torch.no_grad():
            out += rm(format_queries(q, prefix, suffix), r).float().tolist()
    return out, counts


def reward_model_task(path: Path) -> dict:
    """The query format and lengths the reward model in `path` was trained with (lmprefs.json). A reward model
    from elsewhere (e.g. TRL) has none: texts are scored as given, with no trained lengths to warn about."""
    meta = json.loads((path / "lmprefs.json").read_text()) if (path / "lmprefs.json").is_file() else {}
    return meta.get("task") or {"query_prefix": "", "query_suffix": "", "query_length": 1 << 30,
                                "response_length": 1 << 30}  # fmt: skip


def score_cli(a) -> int:
    from lmprefs.models.lm import is_reward_model_dir, load_reward_model, pick_device

    path = Path(a.reward_model)
    if not is_reward_model_dir(path):
        raise UserError(f"--reward-model {path}: not a reward-model directory (no sequence classifier with "
                        "num_labels=1)")  # fmt: skip
    task = reward_model_task(path)
    if a.file and not Path(a.file).is_file():
        raise UserError(f"input file {a.file} does not exist")
    lines = (Path(a.file).read_text() if a.file else sys.stdin.read()).splitlines()
    pairs = [tuple(line.split("\t", 1)) if "\t" in line else ("", line) for line in lines if line.strip()]
    if not pairs:
        raise UserError("no texts to score (one per line on stdin or in the file)")
    device = pick_device(a.device)
    rm = load_reward_model(path, device).eval()
    scores, counts = score_texts(rm, task, pairs, device, truncate=a.truncate)
    for (_, r), s in zip(pairs, scores, strict=True):
        print(f"{s:+.4f}\t{r}")
    if counts["longer"]:  # on stderr, so stdout stays one score per input line
        how = ("cut to those lengths (--truncate)" if a.truncate else
               "scored whole; the model was not trained on texts this long (--truncate cuts them as in training)")
        print(f"lmprefs score: warning: {counts['longer']} of {len(pairs)} texts are longer than the reward model's "
              f"training (query {task['query_length']}, response {task['response_length']} tokens): {how}"
              + (f"; {counts['cut']} cut to the model's context" if counts["cut"] and not a.truncate else ""),
              file=sys.stderr)  # fmt: skip
    return 0
