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

from lmprefs import distributed as dist
from lmprefs.config import Config, TaskConfig
from lmprefs.models.lm import PAD, FrozenPrefix, RewardModel, autocast, frozen_depth, frozen_prefix, hidden_size
from lmprefs.sampling import sample, sampler_options
from lmprefs.tasks import format_queries, truncate_responses


@dataclass
class Comparisons:
    """Labeled questions as tensors: queries [N, Q] (unformatted, PAD right), samples [N, S, T], labels [N], the
    store's item id of each question [N] (None when they did not come from a store) and optional loss weights [N]
    (per-labeler weights from labels.weight_by_gold)."""

    queries: Tensor
    samples: Tensor
    best: Tensor
    items: Tensor | None = None
    weights: Tensor | None = None

    def __len__(self) -> int:
        return len(self.queries)

    def __getitem__(self, idx) -> Comparisons:
        items = None if self.items is None else self.items[idx]
        weights = None if self.weights is None else self.weights[idx]
        return Comparisons(self.queries[idx], self.samples[idx], self.best[idx], items, weights)


def heldout_mask(items: Tensor, seed: int, fraction: float) -> Tensor:
    """[N] bool: whether each item is held out, by a hash of (seed, item id). The split of an item never changes as
    the store grows (online retrains never train on what an earlier model was evaluated on), and all labels of one
    item fall on the same side."""

    def u(i: int) -> float:  # a uniform draw in [0, 1) per item
        return int.from_bytes(hashlib.sha1(f"{seed}:{i}".encode()).digest()[:8], "big") / 2**64

    return torch.tensor([u(i) < fraction for i in items.tolist()], dtype=torch.bool)


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
    qs, ss, best, items = [], [], [], []
    for e in examples:
        if e.query_tokens is not None and e.sample_tokens is not None:
            q, s = e.query_tokens, e.sample_tokens
        else:
            q = tok(e.query, add_special_tokens=False).input_ids
            s = [tok(x, add_special_tokens=False).input_ids for x in e.samples]
        qs.append(_pad(q, task.query_length))
        ss.append([_pad(x, task.response_length) for x in s])
        best.append(e.best)
        items.append(e.item_id)
    return Comparisons(torch.tensor(qs), torch.tensor(ss), torch.tensor(best), torch.tensor(items))


@torch.no_grad()
def sample_comparisons(model, tok, queries: Tensor, task: TaskConfig, prefix, suffix, n_samples: int,
                       batch_size: int, gen: torch.Generator, device, dtype, on_batch=None,
                       sampler: dict | None = None) -> Tensor:  # fmt: skip
    """n_samples truncated responses per query from the initial policy: [N, n_samples, T] (PAD after truncation).
    `sampler`: the sampler's cache/compile options (`sampler_options(cfg.run)`).
    Each query is repeated n_samples times within a batch, so the samples of one question come from one pass."""
    out = []
    per = max(1, batch_size // n_samples)
    for start in range(0, len(queries), per):
        q = queries[start : start + per].to(device)
        rep = q.repeat_interleave(n_samples, 0)
        with autocast(device, dtype):
            r, _ = sample(model, format_queries(rep, prefix, suffix), task.response_length, task.temperature,
                          len(tok), gen, **(sampler or {}))  # fmt: skip
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


def normalization_samples(model, tok, queries: Tensor, cfg: Config, prefix, suffix, gen, device, dtype):
    """(queries [n, Q], responses [n, T]): train_reward.normalize_samples untruncated samples of the initial policy,
    as the original's normalization draws them (train_reward.py:normalize). Under several ranks, this rank's strided
    share of them (both sizes are global totals), sampled with `gen`, the rank's own generator."""
    q = dist.shard(queries[: cfg.train_reward.normalize_samples])
    per = max(1, cfg.train_reward.rollout_batch_size // dist.world())
    responses = []
    with torch.no_grad():
        for i in range(0, len(q), per):
            qb = q[i : i + per].to(device)
            with autocast(device, dtype):
                r, _ = sample(model, format_queries(qb, prefix, suffix), cfg.task.response_length,
                              cfg.task.temperature, len(tok), gen, **sampler_options(cfg.run))  # fmt: skip
            responses.append(r.cpu())
    return q, torch.cat(responses)


def normalize(rm: RewardModel, model, tok, queries: Tensor, cfg: Config, prefix, suffix, gen, device, dtype) -> dict:
    """Set gain and bias so rewards of initial-policy samples have mean 0 and std 1 (train_reward.py:normalize;
    rewards.py:set_reward_norm). The samples are untruncated, as the original's normalization samples are."""
    q, responses = normalization_samples(model, tok, queries, cfg, prefix, suffix, gen, device, dtype)
    # the moments of every rank's samples together (the original averages them over MPI ranks)
    r = dist.gather_rows(rm_rewards(rm, q, responses, prefix, suffix, device, dtype).double())
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


def reward_prefixes(rm: RewardModel, data: Comparisons, prefix, suffix, device, dtype, batch_size: int,
                    bar=None) -> FrozenPrefix | None:  # fmt: skip
    """The frozen prefix of every (question, sample) row, [N * S, L, d], computed once so that each epoch runs only
    the adapted top blocks (None when every block trains). Row i * S + j is sample j of question i."""
    if frozen_depth(rm.lm) == 0:
        return None
    S, parts = data.samples.shape[1], []
    with torch.no_grad():
        for i in range(0, len(data), batch_size):
            mb = data[i : i + batch_size]
            q = format_queries(mb.queries.to(device), prefix, suffix).repeat_interleave(S, 0)
            with autocast(device, dtype):
                parts.append(frozen_prefix(rm.lm, torch.cat([q, mb.samples.flatten(0, 1).to(device)], 1)))
            if bar is not None:
                bar.update(len(mb))
    return FrozenPrefix(rm.lm, parts[0].start, torch.cat([p.hidden for p in parts]))


def prefix_bytes(rm: RewardModel, data: Comparisons, prefix, suffix) -> int:
    """What reward_prefixes would hold in memory (fp32 residual stream of every row)."""
    S = data.samples.shape[1]
    L = data.queries.shape[1] + len(prefix) + len(suffix) + data.samples.shape[2]
    return len(data) * S * L * hidden_size(rm.lm) * 4


def train_epoch(rm: RewardModel, data: Comparisons, label_type, cfg: Config, prefix, suffix, device, dtype,
                log=None, bar=None, cache: FrozenPrefix | None = None) -> dict:  # fmt: skip
    """train_reward.epochs passes over `data`, each in a fresh random permutation, the LR decaying linearly to 0
    over all of them (train_reward.py:train l.241-249, which makes one pass). A minibatch of train_reward.batch_size
    questions runs as forwards of train_reward.microbatch questions whose gradients add up (the same step, less
    memory). `cache`: reward_prefixes(data), so the frozen bottom blocks are not run again.
    Under several ranks every rank draws the same permutation and takes a strided share of each global batch; DDP
    averages the gradients, with each rank's loss weighted so that the average is the global batch's mean."""
    from lmprefs.training.optim import TFAdam

    params = rm.trainable_parameters()
    for p in params:  # a retrain after freeze(): these are the parameters this epoch trains
        p.requires_grad_(True)
    model = dist.wrap(rm, cfg.run.parallel, dtype)  # under FSDP sharded in place, before the optimizer sees it
    opt = TFAdam(rm.trainable_parameters(), lr=cfg.train_reward.lr)
    W = dist.world()
    g = torch.Generator().manual_seed(cfg.run.seed)
    n, bs, S = len(data), cfg.train_reward.batch_size, data.samples.shape[1]
    micro = cfg.train_reward.microbatch or bs
    total = n * cfg.train_reward.epochs
    stats, step = {}, 0
    for epoch in range(cfg.train_reward.epochs):
        perm = torch.randperm(n, generator=g)
        for start in range(0, n, bs):
            for group in opt.param_groups:
                group["lr"] = cfg.train_reward.lr * (1 - (epoch * n + start) / total)
            idx = perm[start : start + bs]  # the global batch
            mine, empty = dist.shard(idx), False
            if len(mine) == 0:  # a last batch smaller than the ranks: this rank's backward still joins the average
                mine, empty = idx[:1], True
            opt.zero_grad(set_to_none=True)
            sums = dict.fromkeys(("loss", "error", "accuracy"), 0.0)
            for m0 in range(0, len(mine), micro):
                sub = mine[m0 : m0 + micro]
                mb = data[sub]
                q = format_queries(mb.queries.to(device), prefix, suffix).repeat_interleave(S, 0)  # [b*S, Q']
                rows = (sub.unsqueeze(1) * S + torch.arange(S)).flatten()  # this microbatch's rows of the cache
                pre = cache[rows.to(cache.hidden.device)] if cache is not None else None
                # the mean over the global batch: this share's sum / len(idx), times W because DDP divides by W
                share = 0.0 if empty else len(sub) * W / len(idx)
                # gradients of all but the last microbatch stay local; the last backward averages the sum
                with dist.no_sync(model, m0 + micro < len(mine)):
                    with autocast(device, dtype):
                        rewards = model(q, mb.samples.flatten(0, 1).to(device), pre).float().view(len(mb), S)  # [b, S]
                    weight = None if mb.weights is None else mb.weights.to(device)
                    out = label_type.loss(rewards, {"best": mb.best.to(device), "weight": weight})
                    (out["loss"] * share).backward()
                for k in sums:
                    sums[k] += float(out[k].detach()) * share / W
            opt.step()
            stats = {f"train_reward/minibatch/{k}": v for k, v in dist.all_reduce_sum(sums).items()}
            stats["train_reward/lr"] = opt.param_groups[0]["lr"]
            if not all(math.isfinite(v) for v in stats.values()):
                raise FloatingPointError(f"reward-model training diverged at step {step}: {stats}")
            if log is not None and step % max(1, cfg.run.log_interval) == 0:
                log.scalars(stats, epoch * n + start + len(idx), phase="reward")  # step: labels seen
            if bar is not None:
                bar.update(len(idx))
            step += 1
    return stats
