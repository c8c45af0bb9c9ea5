"""Reward-model training from judgments (train_reward.py @cbfd210): sample comparisons from the initial policy,
normalize the reward on initial-policy samples, one epoch over the labels with linear LR decay to 0 and TF1-style
Adam, normalize again, report held-out accuracy and loss."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from lmprefs.config import Config, TaskConfig
from lmprefs.models.lm import PAD, RewardModel, autocast
from lmprefs.sampling import sample
from lmprefs.tasks import format_queries, truncate_responses


@dataclass
class Comparisons:
    """Labeled questions as tensors: queries [N, Q] (unformatted, PAD right), samples [N, S, T], labels [N]."""

    queries: Tensor
    samples: Tensor
    best: Tensor

    def __len__(self) -> int:
        return len(self.queries)

    def __getitem__(self, idx) -> Comparisons:
        return Comparisons(self.queries[idx], self.samples[idx], self.best[idx])


def tokenizer_id(tok) -> str:
    """A stable name for a tokenizer's vocabulary, under which the label store keeps token ids."""
    if len(tok) == 50257 and tok("Hello world", add_special_tokens=False).input_ids == [15496, 995]:
        return "gpt2"
    vocab = sorted(tok.get_vocab().items())
    return "vocab-" + hashlib.sha1(json.dumps(vocab).encode()).hexdigest()[:12]


def _pad(ids: list[int], n: int) -> list[int]:
    ids = [i for i in ids if i != PAD][:n]
    return ids + [PAD] * (n - len(ids))


def examples_to_comparisons(examples, tok, task: TaskConfig) -> Comparisons:
    """Store examples -> tensors in `tok`'s ids: the stored ids when they exist for this tokenizer, else the texts
    re-encoded (the original's files are GPT-2 ids; any other model re-tokenizes the decoded text)."""
    qs, ss, best = [], [], []
    for e in examples:
        if e.query_tokens is not None and e.sample_tokens is not None:
            q, s = e.query_tokens, e.sample_tokens
        else:
            q = tok(e.query, add_special_tokens=False).input_ids
            s = [tok(x, add_special_tokens=False).input_ids for x in e.samples]
        qs.append(_pad(q, task.query_length))
        ss.append([_pad(x, task.response_length) for x in s])
        best.append(e.best)
    return Comparisons(torch.tensor(qs), torch.tensor(ss), torch.tensor(best))


@torch.no_grad()
def sample_comparisons(model, tok, queries: Tensor, task: TaskConfig, prefix, suffix, n_samples: int,
                       batch_size: int, gen: torch.Generator, device, dtype, on_batch=None) -> Tensor:  # fmt: skip
    """n_samples truncated responses per query from the initial policy: [N, n_samples, T] (PAD after truncation).
    Each query is repeated n_samples times within a batch, so the samples of one question come from one pass."""
    out = []
    per = max(1, batch_size // n_samples)
    for start in range(0, len(queries), per):
        q = queries[start : start + per].to(device)
        rep = q.repeat_interleave(n_samples, 0)
        with autocast(device, dtype):
            r, _ = sample(model, format_queries(rep, prefix, suffix), task.response_length, task.temperature,
                          len(tok), gen)  # fmt: skip
        r = truncate_responses(r, task.truncate_token, task.truncate_after)
        out.append(r.view(len(q), n_samples, -1).cpu())
        if on_batch:
            on_batch(len(q))
    return torch.cat(out)


def rm_rewards(rm: RewardModel, queries: Tensor, responses: Tensor, prefix, suffix, device, dtype,
               batch_size: int = 64) -> Tensor:  # fmt: skip
    """Rewards [B] of (query, response) pairs, in batches, without gradients."""
    out = []
    with torch.no_grad():
        for i in range(0, len(queries), batch_size):
            q = format_queries(queries[i : i + batch_size].to(device), prefix, suffix)
            with autocast(device, dtype):
                out.append(rm(q, responses[i : i + batch_size].to(device)).float().cpu())
    return torch.cat(out)


def normalize(rm: RewardModel, model, tok, queries: Tensor, cfg: Config, prefix, suffix, gen, device, dtype) -> dict:
    """Set gain and bias so rewards of initial-policy samples have mean 0 and std 1 (train_reward.py:normalize;
    rewards.py:set_reward_norm). The samples are untruncated, as the original's normalization samples are."""
    n = cfg.train_reward.normalize_samples
    q = queries[:n]
    responses = []
    with torch.no_grad():
        for i in range(0, len(q), cfg.train_reward.rollout_batch_size):
            qb = q[i : i + cfg.train_reward.rollout_batch_size].to(device)
            with autocast(device, dtype):
                r, _ = sample(model, format_queries(qb, prefix, suffix), cfg.task.response_length,
                              cfg.task.temperature, len(tok), gen)  # fmt: skip
            responses.append(r.cpu())
    responses = torch.cat(responses)
    r = rm_rewards(rm, q, responses, prefix, suffix, device, dtype).double()
    mean, std = r.mean().item(), r.std(unbiased=False).item()  # np.mean / np.std of the original
    rm.set_norm(mean, std)
    return {"mean_before": mean, "std_before": std, "queries": q, "responses": responses}


def evaluate(rm: RewardModel, data: Comparisons, label_type, prefix, suffix, device, dtype, batch_size=32) -> dict:
    """Held-out loss and accuracy of the reward model on labeled comparisons."""
    if len(data) == 0:
        return {}
    S = data.samples.shape[1]
    rewards = rm_rewards(rm, data.queries.repeat_interleave(S, 0), data.samples.flatten(0, 1), prefix, suffix,
                         device, dtype, batch_size * S).view(len(data), S)  # fmt: skip
    out = label_type.loss(rewards, {"best": data.best})
    return {"heldout/loss": float(out["loss"]), "heldout/accuracy": float(out["accuracy"]), "heldout/n": len(data)}


def train_epoch(rm: RewardModel, data: Comparisons, label_type, cfg: Config, prefix, suffix, device, dtype,
                log=None, bar=None) -> dict:  # fmt: skip
    """train_reward.epochs passes over `data`, each in a fresh random permutation, the LR decaying linearly to 0
    over all of them (train_reward.py:train l.241-249, which makes one pass)."""
    from lmprefs.training.optim import TFAdam

    params = rm.trainable_parameters()
    for p in params:  # a retrain after freeze(): these are the parameters this epoch trains
        p.requires_grad_(True)
    opt = TFAdam(params, lr=cfg.train_reward.lr)
    g = torch.Generator().manual_seed(cfg.run.seed)
    n, bs, S = len(data), cfg.train_reward.batch_size, data.samples.shape[1]
    total = n * cfg.train_reward.epochs
    stats, step = {}, 0
    for epoch in range(cfg.train_reward.epochs):
        perm = torch.randperm(n, generator=g)
        for start in range(0, n, bs):
            for group in opt.param_groups:
                group["lr"] = cfg.train_reward.lr * (1 - (epoch * n + start) / total)
            mb = data[perm[start : start + bs]]
            q = format_queries(mb.queries.to(device), prefix, suffix).repeat_interleave(S, 0)  # [b*S, Q']
            with autocast(device, dtype):
                rewards = rm(q, mb.samples.flatten(0, 1).to(device)).float().view(len(mb), S)  # [b, S]
            out = label_type.loss(rewards, {"best": mb.best.to(device)})
            opt.zero_grad(set_to_none=True)
            out["loss"].backward()
            opt.step()
            stats = {f"train_reward/minibatch/{k}": float(out[k].detach()) for k in ("loss", "error", "accuracy")}
            stats["train_reward/lr"] = opt.param_groups[0]["lr"]
            if not all(math.isfinite(v) for v in stats.values()):
                raise FloatingPointError(f"reward-model training diverged at step {step}: {stats}")
            if log is not None and step % max(1, cfg.run.log_interval) == 0:
                log.scalars(stats, step)
            if bar is not None:
                bar.update(len(mb))
            step += 1
    return stats
