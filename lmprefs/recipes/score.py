"""`lmprefs score`: rewards of texts under a trained reward model. Each input line is a response, or a query and a
response separated by a tab; the query is formatted as in training (the task saved beside the model)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lmprefs.data.chat import scoring_pieces
from lmprefs.data.tasks import PAD, encode_fixed, format_queries
from lmprefs.errors import UserError
from lmprefs.models.ensemble import RewardEnsemble, is_ensemble_dir, read_manifest
from lmprefs.models.loading import max_positions


def score_texts(rm, task: dict, pairs: list[tuple[str, str]], device, batch_size: int = 32,
                truncate: bool = False) -> tuple[list[float], dict[str, int]]:  # fmt: skip
    """Rewards of (query, response) texts -> (scores, counts): a reward model's, or an ensemble's mean
    (member_scores_texts)."""
    scores, counts = member_scores_texts(rm, task, pairs, device, batch_size, truncate)
    return scores.mean(0).tolist(), counts


def member_scores_texts(rm, task: dict, pairs: list[tuple[str, str]], device, batch_size: int = 32,
                        truncate: bool = False) -> tuple[torch.Tensor, dict[str, int]]:  # fmt: skip
    """Rewards [K, N] of N (query, response) texts under each of an ensemble's K members ([1, N] for a reward
    model), and counts. Whole texts are scored (padded to the longest in each batch) unless `truncate`, which cuts
    queries and responses to the task's query_length / response_length as in training. Texts longer than the
    model's context keep their last tokens. counts: "longer" (texts beyond the trained lengths), "cut" (texts that
    were cut)."""

    tok = rm.tokenizer
    before, after = scoring_pieces(task, tok)  # the frame it was trained with: a chat turn, prefix and suffix
    prefix = [i for p in before for i in encode_fixed(tok, p)]
    suffix = [i for p in after for i in encode_fixed(tok, p)]
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
        queries = torch.tensor(pad(qs, max(map(len, qs))), device=device, dtype=torch.long).reshape(len(chunk), -1)
        responses = torch.tensor(pad(rs, max(map(len, rs))), device=device, dtype=torch.long)
        fq = format_queries(queries, prefix, suffix)
        with torch.no_grad():
            s = rm.member_scores(fq, responses) if isinstance(rm, RewardEnsemble) else rm(fq, responses)[None]
            out.append(s.float().cpu())  # [K, b]
    return torch.cat(out, dim=1), counts


def reward_model_task(path: Path) -> dict:
    """The query format and lengths the reward model in `path` was trained with (lmprefs.json). A reward model
    from elsewhere (e.g. TRL) has none: texts are scored as given, with no trained lengths to warn about."""
    if is_ensemble_dir(path):  # every member was trained with the same task: the first one's
        path = Path(path) / read_manifest(path)["members"][0]
    meta = json.loads((path / "lmprefs.json").read_text()) if (path / "lmprefs.json").is_file() else {}
    return meta.get("task") or {"query_prefix": "", "query_suffix": "", "query_length": 1 << 30,
                                "response_length": 1 << 30}  # fmt: skip


