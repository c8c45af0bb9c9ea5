"""Reward-model training from judgments (train_reward.py @cbfd210): sample comparisons from the initial policy,
normalize the reward on initial-policy samples, one epoch over the labels with linear LR decay to 0 and TF1-style
Adam, normalize again, report held-out accuracy and loss."""

from __future__ import annotations

import hashlib
import json
import math

import torch
from torch import Tensor

from lmprefs.config import Config, TaskConfig
from lmprefs.data.tasks import PAD, TaskContext, stop_tokens, truncate_responses
from lmprefs.io.atomic import crash_point
from lmprefs.models import parallel
from lmprefs.models.ensemble import RewardEnsemble
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.models.trunk import FrozenPrefix, frozen_depth
from lmprefs.runtime import distributed as dist
from lmprefs.training.comparisons import Comparisons
from lmprefs.training.optim import TFAdam
from lmprefs.training.question_prefixes import QuestionPrefixes


def prompt_id(text: str) -> int:
    """A stable 56-bit id of a prompt's text (fits an int64 tensor; the same on every machine and run)."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8", "surrogatepass")).digest()[:7], "big")


def score_pairs(score: Tensor, groups: Tensor, min_gap: float = 0.0) -> tuple[Tensor, Tensor]:
    """(i, j) [P] each: every two rows i < j of the same prompt (`groups`) whose scores differ by more than
    `min_gap`, prompts in order of first appearance."""
    by_prompt: dict[int, list[int]] = {}
    for n, g in enumerate(groups.tolist()):
        by_prompt.setdefault(g, []).append(n)
    s = score.tolist()
    pairs = [(i, j) for rows in by_prompt.values() for a, i in enumerate(rows) for j in rows[a + 1 :]
             if abs(s[i] - s[j]) > min_gap]  # fmt: skip
    i, j = (list(x) for x in zip(*pairs, strict=True)) if pairs else ([], [])
    return torch.tensor(i, dtype=torch.long), torch.tensor(j, dtype=torch.long)


def pairs_from_scores(data: Comparisons, min_gap: float = 0.0) -> Comparisons:
    """best_of_2 comparisons derived from per-response scores (labels.scores_as=comparisons): every two responses to
    the same prompt whose scores differ by more than `min_gap`, the higher score winning; the pair keeps the order
    of the two responses in `data`, so the winner is sample 0 or 1 as it falls. data: scalar_rating questions
    ([N, 1, T] samples, `score`, `groups`) -> [P, 2, T] questions with `best`, `groups`, `items` = the first
    response's item, and no weights."""
    if data.score is None or data.groups is None:
        raise ValueError("pairs_from_scores needs scalar_rating questions with scores and prompts")
    i, j = score_pairs(data.score, data.groups, min_gap)
    samples = torch.stack([data.samples[i, 0], data.samples[j, 0]], dim=1)  # [P, 2, T]
    best = (data.score[j] > data.score[i]).long()  # [P]: 1 when the second response scored higher
    items = None if data.items is None else data.items[i]
    return Comparisons(data.queries[i], samples, best, items, None, None, data.groups[i])


def heldout_mask(items: Tensor, seed: int, fraction: float) -> Tensor:
    """[N] bool: whether each item is held out, by a hash of (seed, item id). The split of an item never changes as
    the store grows (online retrains never train on what an earlier model was evaluated on), and all labels of one
    item fall on the same side."""

    def u(i: int) -> float:  # a uniform draw in [0, 1) per item
        return int.from_bytes(hashlib.sha1(f"{seed}:{i}".encode()).digest()[:8], "big") / 2**64

    return torch.tensor([u(i) < fraction for i in items.tolist()], dtype=torch.bool)


def split_heldout_mask(keys: Tensor, splits: list[str | None], seed: int, fraction: float) -> tuple[Tensor, str]:
    """[N] bool: whether each label is held out by its item's imported split (all but `train`), or where it has none
    (None) by heldout_mask's hash of `keys`; and what the held-out labels measure, comma-separated: their splits,
    and 'hash' for those the hash chose ('' when none is held out)."""
    by_hash = heldout_mask(keys, seed, fraction).tolist()
    held = [h if s is None else s != "train" for s, h in zip(splits, by_hash, strict=True)]
    measured = sorted({s or "hash" for s, h in zip(splits, held, strict=True) if h})
    return torch.tensor(held, dtype=torch.bool), ",".join(measured)


def tokenizer_id(tok) -> str:
    """A stable name for a tokenizer's vocabulary, under which the label store keeps token ids."""
    if len(tok) == 50257 and tok("Hello world", add_special_tokens=False).input_ids == [15496, 995]:
        return "gpt2"
    vocab = sorted(tok.get_vocab().items())
    return "vocab-" + hashlib.sha1(json.dumps(vocab).encode()).hexdigest()[:12]


def _pad(ids: list[int], n: int) -> list[int]:
    ids = [i for i in ids if i != PAD][:n]
    return ids + [PAD] * (n - len(ids))


def question_tensors(questions, tok, task: TaskConfig) -> tuple[Tensor, Tensor]:
    """Questions (anything with query, samples, query_tokens and sample_tokens: store examples, pending items) ->
    queries [N, Q] and samples [N, S, T] in `tok`'s ids, PAD right: the stored ids when they exist for this
    tokenizer, else the texts re-encoded (the original's files are GPT-2 ids; any other model re-tokenizes the
    decoded text); samples cut as the task cuts them (a no-op on samples the task sampled; stored ones from before a
    truncation setting, or re-encoded texts, then reach the reward model as the judge and the rollouts see them)."""
    qs, ss = [], []
    for e in questions:
        if e.query_tokens is not None and e.sample_tokens is not None:
            q, s = e.query_tokens, e.sample_tokens
        else:
            q = tok(e.query, add_special_tokens=False).input_ids
            s = [tok(x, add_special_tokens=False).input_ids for x in e.samples]
        qs.append(_pad(q, task.query_length))
        ss.append([_pad(x, task.response_length) for x in s])
    samples = torch.tensor(ss)
    if len(ss):
        cut = truncate_responses(samples.flatten(0, 1), task.truncate_token, task.truncate_after)
        samples = cut.view(samples.shape)
    return torch.tensor(qs), samples


def examples_to_comparisons(examples, tok, task: TaskConfig) -> Comparisons:
    """Store examples -> tensors in `tok`'s ids (`question_tensors`). Examples are of one label type: best_of_N (->
    `best`), ranking_K (-> `ranking` and its top as `best`) or scalar_rating (-> `score` and the prompt of each,
    `groups`)."""
    queries, samples = question_tensors(examples, tok, task)
    labels = [e.best if e.best is not None else e.score for e in examples]
    items = [e.item_id for e in examples]
    out = Comparisons(queries, samples, None, torch.tensor(items))
    if examples and examples[0].ranking is not None:
        out.ranking = torch.tensor([e.ranking for e in examples], dtype=torch.long)
    if examples and examples[0].best is None:  # scalar_rating: scores, grouped by prompt
        out.score = torch.tensor(labels, dtype=torch.float32)
        out.groups = torch.tensor([prompt_id(e.query) for e in examples], dtype=torch.long)
    else:
        out.best = torch.tensor(labels, dtype=torch.long)
    return out


@torch.no_grad()
def sample_comparisons(model, tok, queries: Tensor, task: TaskConfig, ctx: TaskContext, n_samples: int, *,
                       batch_size: int, gen: torch.Generator, on_batch=None, sampler: dict | None = None,
                       prefix_depth: int = 0) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """n_samples truncated responses per query from the initial policy: [N, n_samples, T] (PAD after truncation),
    and with prefix_depth d > 0 the sampling pass's frozen prefix below block d of every row [N * n_samples, L,
    d_model] (`sample`'s), else None. `sampler`: the sampler's cache/compile options
    (`sampler_options(cfg.run)`). The samples of one question come from one batch, in which its query runs through
    the model once."""
    out, hidden = [], None
    per = max(1, batch_size // n_samples)
    for start in range(0, len(queries), per):
        q = queries[start : start + per]
        with ctx.autocast():
            r, _, pre = sample(model, ctx.format(q), task.response_length, task.temperature, len(tok), gen,
                               repeats=n_samples, stop_tokens=stop_tokens(task, tok), prefix_depth=prefix_depth,
                               **(sampler or {}))  # fmt: skip
        r = truncate_responses(r, task.truncate_token, task.truncate_after)
        out.append(r.view(len(q), n_samples, -1).cpu())
        if pre is not None:  # filled in place: a concatenation at the end would hold every prefix twice
            if hidden is None:
                hidden = pre.hidden.new_empty(len(queries) * n_samples, *pre.hidden.shape[1:])
            hidden[start * n_samples : start * n_samples + len(pre.hidden)] = pre.hidden
        if on_batch:
            on_batch(len(q))
    return torch.cat(out), hidden


def rm_rewards(rm: RewardModel | RewardEnsemble, queries: Tensor, responses: Tensor, ctx: TaskContext,
               batch_size: int = 64, repeats: int = 1,
               prefixes: QuestionPrefixes | None = None) -> Tensor:  # fmt: skip
    """Rewards [B * k] of queries [B, Q] each answered by k = repeats consecutive responses [B * k, T], in batches
    of about `batch_size` rows, without gradients. `prefixes`: the frozen prefixes of these B questions' rows (only
    the blocks above them then run). An ensemble's: its members' mean."""
    return _in_batches(rm, queries, responses, ctx, batch_size, repeats, prefixes)


def member_rewards(rm: RewardModel | RewardEnsemble, queries: Tensor, responses: Tensor, ctx: TaskContext,
                   batch_size: int = 64, repeats: int = 1,
                   prefixes: QuestionPrefixes | None = None) -> Tensor:  # fmt: skip
    """rm_rewards of each member of an ensemble, [K, B * k] (a reward model: [1, B * k]); the frozen prefix of each
    batch is computed once for members on one base (RewardEnsemble.member_scores)."""
    if isinstance(rm, RewardEnsemble):
        return _in_batches(rm.member_scores, queries, responses, ctx, batch_size, repeats, prefixes)
    return rm_rewards(rm, queries, responses, ctx, batch_size, repeats, prefixes)[None]


def _in_batches(call, queries: Tensor, responses: Tensor, ctx: TaskContext, batch_size: int, repeats: int,
                prefixes: QuestionPrefixes | None) -> Tensor:  # fmt: skip
    """call(formatted queries, responses, prefix, repeats) -> [..., b] over batches of about batch_size rows, without
    gradients, joined along the last dimension."""
    out, per = [], max(1, batch_size // repeats)
    with torch.no_grad():
        for i in range(0, len(queries), per):
            q = ctx.format(queries[i : i + per])
            pre = prefixes.rows(torch.arange(i, i + len(q))) if prefixes is not None else None
            with ctx.autocast():
                r = responses[i * repeats : (i + per) * repeats].to(ctx.device)
                out.append(call(q, r, pre, repeats).float().cpu())
    return torch.cat(out, dim=-1)


def normalization_samples(model, tok, queries: Tensor, cfg: Config, ctx: TaskContext, gen, *,
                          prefix_depth: int = 0) -> tuple[Tensor, Tensor, QuestionPrefixes | None]:  # fmt: skip
    """(queries [n, Q], responses [n, T], their frozen prefixes): train_reward.normalize_samples untruncated samples
    of the initial policy, as the original's normalization draws them (train_reward.py:normalize). Under several
    ranks, this rank's strided share of them (both sizes are global totals), sampled with `gen`, the rank's own
    generator. With prefix_depth d > 0, the sampling pass's frozen prefix below block d of each sample, one per
    query (None under a compiled sampler, which keeps none), else None."""
    q = dist.shard(queries[: cfg.train_reward.normalize_samples])
    per = max(1, cfg.train_reward.rollout_batch_size // dist.world())
    responses, hidden = [], []
    with torch.no_grad():
        for i in range(0, len(q), per):
            with ctx.autocast():
                r, _, pre = sample(model, ctx.format(q[i : i + per]), cfg.task.response_length, cfg.task.temperature,
                                   len(tok), gen, stop_tokens=stop_tokens(cfg.task, tok), prefix_depth=prefix_depth,
                                   **sampler_options(cfg.run))  # fmt: skip
            responses.append(r.cpu())
            hidden.append(pre)
    prefix = FrozenPrefix.cat(hidden)
    return q, torch.cat(responses), QuestionPrefixes(prefix, torch.arange(len(q)), 1) if prefix is not None else None


def normalize(rm: RewardModel, model, tok, queries: Tensor, cfg: Config, ctx: TaskContext, gen, *,
              target: tuple[float, float] = (0.0, 1.0), memo: dict | None = None) -> dict:  # fmt: skip
    """Set gain and bias so rewards of initial-policy samples have mean and std `target`: (0, 1), or before training
    the scale of the labels when the label type has one (train_reward.py:normalize and target_mean_std;
    rewards.py:set_reward_norm). The samples are untruncated, as the original's normalization samples are. A
    reward model on the sampled model's own base scores them from the sampling pass's frozen prefix.
    `memo`: a dict the caller keeps across reward models on one initial policy (an ensemble's members): samples
    drawn from a generator state found there are taken from it, and `gen` is left where drawing them left it."""
    shared = getattr(rm, "lm", None) is model and cfg.run.parallel != "fsdp"  # a sharded trunk scores the tokens
    depth = frozen_depth(model) if shared else 0
    key = (bytes(gen.get_state().cpu().numpy()), depth) if memo is not None else None
    if memo is not None and key in memo:
        q, responses, prefixes, after = memo[key]
        gen.set_state(after)
    else:
        q, responses, prefixes = normalization_samples(model, tok, queries, cfg, ctx, gen, prefix_depth=depth)
        if memo is not None:
            memo[key] = (q, responses, prefixes, gen.get_state())
    # the moments of every rank's samples together (the original averages them over MPI ranks)
    r = dist.gather_rows(rm_rewards(rm, q, responses, ctx, prefixes=prefixes).double())
    mean, std = r.mean().item(), r.std(unbiased=False).item()  # np.mean / np.std of the original
    rm.set_norm(mean, std, *target)
    return {"mean_before": mean, "std_before": std, "queries": q, "responses": responses}


def evaluate(rm: RewardModel | RewardEnsemble, data: Comparisons, label_type, ctx: TaskContext, batch_size=32,
             min_gap: float = 0.0, prefixes: QuestionPrefixes | None = None) -> dict:  # fmt: skip
    """Held-out loss and accuracy of the reward model on labeled questions. Accuracy: how often the chosen sample gets
    the highest reward; for scalar ratings, how often the reward orders two responses to one prompt as their scores
    do (pairs whose scores differ by more than `min_gap`), so that both ways of learning from scores are compared on
    one figure, and the Pearson correlation of rewards and scores. `prefixes`: the frozen prefixes of data's rows."""
    if len(data) == 0:
        return {}
    S = data.samples.shape[1]
    rewards = rm_rewards(rm, data.queries, data.samples.flatten(0, 1), ctx, batch_size * S, repeats=S,
                         prefixes=prefixes).view(len(data), S)  # fmt: skip
    out = label_type.loss(rewards, data.labels())
    summary = {"heldout/loss": float(out["loss"]), "heldout/n": len(data)}
    if "accuracy" in out:
        summary["heldout/accuracy"] = float(out["accuracy"])
    if data.score is not None:
        summary["heldout/corr"] = float(out["corr"])
        assert data.groups is not None  # scores come with their prompts (examples_to_comparisons)
        i, j = score_pairs(data.score, data.groups, min_gap)
        if len(i):
            right = (rewards[j, 0] > rewards[i, 0]) == (data.score[j] > data.score[i])
            summary |= {"heldout/accuracy": float(right.float().mean()), "heldout/pairs": len(i)}
    return summary


def train_epoch(rm: RewardModel, data: Comparisons, label_type, cfg: Config, ctx: TaskContext, *, log=None, bar=None,
                cache: QuestionPrefixes | None = None, seed: int | None = None) -> dict:  # fmt: skip
    """train_reward.epochs passes over `data`, each in a fresh random permutation, the LR decaying linearly to 0
    over all of them (train_reward.py:train l.241-249, which makes one pass). A minibatch of train_reward.batch_size
    questions runs as forwards of train_reward.microbatch questions whose gradients add up (the same step, less
    memory). `cache`: the frozen prefixes of data's rows (`label_prefixes`), so the frozen bottom blocks are not run
    again. `seed`: of the permutations (default run.seed; an ensemble member's own).
    Under several ranks every rank draws the same permutation and takes a strided share of each global batch; DDP
    averages the gradients, with each rank's loss weighted so that the average is the global batch's mean."""

    params = rm.trainable_parameters()
    for p in params:  # a retrain after freeze(): these are the parameters this epoch trains
        p.requires_grad_(True)
    model = parallel.wrap(rm, cfg.run.parallel, ctx.dtype)  # under FSDP sharded in place, before the optimizer sees it
    opt = TFAdam(rm.trainable_parameters(), lr=cfg.train_reward.lr)
    W = dist.world()
    g = torch.Generator().manual_seed(cfg.run.seed if seed is None else seed)
    n, bs, S = len(data), cfg.train_reward.batch_size, data.samples.shape[1]
    micro = cfg.train_reward.microbatch or bs
    # a question's S samples share one pass of its query (RewardModel.forward), except under FSDP, whose sharded
    # blocks would run twice in one forward
    shared = 1 if cfg.run.parallel == "fsdp" else S
    total = n * cfg.train_reward.epochs
    stats, step = {}, 0
    # a scalar rating's loss has no accuracy (and a minibatch's correlation is noise, or NaN for equal scores)
    keys = ("loss", "error") + (("accuracy",) if label_type.name != "scalar_rating" else ())
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
            sums = dict.fromkeys(keys, 0.0)
            for m0 in range(0, len(mine), micro):
                sub = mine[m0 : m0 + micro]
                mb = data[sub]
                q = ctx.format(mb.queries)  # [b, Q']
                if shared == 1:
                    q = q.repeat_interleave(S, 0)  # [b*S, Q']
                pre = cache.rows(sub) if cache is not None else None  # this microbatch's rows of the cache
                # the mean over the global batch: this share's sum / len(idx), times W because DDP divides by W
                share = 0.0 if empty else len(sub) * W / len(idx)
                # gradients of all but the last microbatch stay local; the last backward averages the sum
                with parallel.no_sync(model, m0 + micro < len(mine)):
                    with ctx.autocast():
                        rewards = model(q, mb.samples.flatten(0, 1).to(ctx.device), pre, shared).float()
                    out = label_type.loss(rewards.view(len(mb), S), mb.labels(ctx.device))
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
                crash_point("reward:logged")
            if bar is not None:
                bar.update(len(idx))
            step += 1
    return stats
