"""Training the policy directly on labeled comparisons with DPO (`lmprefs train-dpo`; the losses are in
`lmprefs.training.dpo`): the labels the reward model would train on, the initial policy as the frozen reference,
TF1-style Adam with the LR decaying linearly to 0, checkpoints that resume bitwise, and the held-out labels' accuracy
(how often the implicit reward beta * log(pi / pi_ref) ranks the chosen response first).

log pi(y|x) is the sum over the response's tokens of their log-probabilities at the task's temperature: the
distribution the policy samples from (`lmprefs sample`, PPO's policy.temperature). Padding after a truncated
response counts nothing. The reference's log-probabilities are computed once, before training, for every label.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import torch
from torch import Tensor

from lmprefs.config import Config, DPOConfig
from lmprefs.data.tasks import PAD, TaskContext
from lmprefs.errors import UserError
from lmprefs.io.atomic import crash_point
from lmprefs.io.publish import latest_good
from lmprefs.models.lora import lora_modules, using
from lmprefs.models.policy import Policy
from lmprefs.models.token_logprobs import token_logprobs
from lmprefs.models.trunk import FrozenPrefix, frozen_depth, response_logits_hidden
from lmprefs.runtime.memory import available_memory
from lmprefs.runtime.runlog import progress
from lmprefs.training.comparisons import Comparisons
from lmprefs.training.dpo import (
    implicit_rewards,
    listwise_losses,
    pairwise_losses,
    preference_stats,
    sequence_logprobs,
)
from lmprefs.training.optim import TFAdam
from lmprefs.training.question_prefixes import PREFIX_CACHE_BYTES, QuestionPrefixes, label_prefixes, prefix_bytes
from lmprefs.training.sft import epoch_order
from lmprefs.training.step_checkpoint import load_step_checkpoint, save_step_checkpoint

STATS = ("loss", "accuracy", "margin", "chosen_reward", "rejected_reward")

LOGITS_BYTES = 512 << 20
"""What the fp32 logits of one forward may take when dpo.microbatch is None, on a CPU. The logits [labels x S x T,
V] and their gradient are a DPO step's largest tensors: a 64-label step of the quickstart's best-of-4 labels (1.2
GB of logits) peaked at 6.7 GB, 16 labels a forward at 2.7 GB (docs/results.md)."""
FREE_SHARE = 8
"""...and at most this fraction of the memory free at the start: a step held about 4.4 times its logits."""


def dpo_microbatch(d: DPOConfig, samples: int, positions: int, vocab: int, device: torch.device) -> int:
    """Labels per forward of a DPO step (DPOConfig `d`) whose labels hold `samples` responses of `positions` tokens
    each over a `vocab`-wide head: dpo.microbatch where set (0: the whole batch); None: the whole batch on a GPU, on
    a CPU the largest power of two of labels whose fp32 logits fit LOGITS_BYTES and 1 / FREE_SHARE of the free
    memory, at least 1 and at most the batch."""
    if d.microbatch is not None:
        return d.microbatch or d.batch_size
    if device.type != "cpu":
        return d.batch_size
    free = available_memory()
    budget = min(LOGITS_BYTES, free // FREE_SHARE) if free else LOGITS_BYTES
    fits = max(1, budget // (samples * positions * vocab * 4))
    return min(d.batch_size, 1 << (fits.bit_length() - 1))


def response_logprobs(policy: Policy, queries: Tensor, samples: Tensor, ctx: TaskContext, *, reference: bool = False,
                      ref_lm=None, prefix: FrozenPrefix | None = None) -> Tensor:  # fmt: skip
    """log pi(y|x) [b, S] of the S samples [b, S, T] of each query [b, Q] (unformatted): the policy's, or with
    `reference` the frozen reference's (ref_lm, or under LoRA the policy's base with its adapters off). Each query
    runs once for its S samples; with `prefix` (the frozen blocks' outputs for these rows, `label_prefixes`) only the
    blocks above it run. The log-softmax over the vocabulary is `token_logprobs`': on the CPU a few rows at a time,
    its backward recomputing them rather than keeping [b * S, T, V] fp32 tensors."""
    b, S, _ = samples.shape
    lm = ref_lm if reference and ref_lm is not None else policy.lm
    r = samples.flatten(0, 1).to(ctx.device)  # [b * S, T]
    with using(lm, None if reference else policy.adapter), ctx.autocast():
        _, logits = response_logits_hidden(lm, ctx.format(queries), r, prefix, S)  # [b * S, T, V'], V' >= vocab
    lp, _ = token_logprobs(logits, r, policy.temperature, policy.vocab)  # [b * S, T] fp32
    return sequence_logprobs(lp, r != PAD).view(b, S)


def frozen_prefixes(policy: Policy, data: Comparisons, ctx: TaskContext,
                    batch_size: int) -> QuestionPrefixes | None:  # fmt: skip
    """label_prefixes of the policy's LM for every row of `data`, when its bottom blocks are frozen (LoRA in the top
    blocks) and they fit PREFIX_CACHE_BYTES: the frozen blocks then run once, not at every step and pass. They serve
    the policy with its adapters on or off (the reference under LoRA): the frozen blocks carry no adapter."""
    if len(data) == 0 or frozen_depth(policy.lm) == 0 or prefix_bytes(policy.lm, data, ctx) > PREFIX_CACHE_BYTES:
        return None
    bar = progress(len(data), "DPO: frozen blocks")
    try:
        own = label_prefixes(policy.lm, data, ctx, batch_size, bar)
    finally:
        bar.close()
    return QuestionPrefixes.own(own, data) if own is not None else None


def chosen(data: Comparisons) -> Tensor:
    """The chosen response of each question [N]: DPO learns from choices (best_of_N, or scores compared in pairs)."""
    if data.best is None:
        raise ValueError("DPO trains on choices between responses; these questions have none (best is None)")
    return data.best


def losses(logp: Tensor, ref: Tensor, best: Tensor, cfg: Config) -> tuple[Tensor, Tensor]:
    """(the loss of each question [b], the implicit rewards [b, S]) under dpo.loss. A label type with a whole
    ranking would pass it to listwise_losses in place of `best[:, None]` (full Plackett-Luce)."""
    d = cfg.dpo
    h = implicit_rewards(logp, ref, d.beta)
    if d.loss == "pairwise":
        return pairwise_losses(logp, ref, best, d.beta), h
    return listwise_losses(logp, ref, best.unsqueeze(1), d.beta), h


@torch.no_grad()
def all_logprobs(policy: Policy, data: Comparisons, ctx: TaskContext, batch_size: int, *,
                 reference: bool, ref_lm=None, bar=None,
                 prefix: QuestionPrefixes | None = None) -> Tensor:  # fmt: skip
    """log pi(y|x) [N, S] of every sample in `data`, in order, without gradients: the policy's, or with `reference`
    the frozen reference's (ref_lm, or the policy's base with its adapters off). prefix: frozen_prefixes(data)."""
    out, S = [], data.samples.shape[1]
    for i in range(0, len(data), batch_size):
        pre = prefix.rows(torch.arange(i, min(i + batch_size, len(data)))) if prefix is not None else None
        out.append(response_logprobs(policy, data.queries[i : i + batch_size], data.samples[i : i + batch_size], ctx,
                                     reference=reference, ref_lm=ref_lm, prefix=pre).float().cpu())  # fmt: skip
        if bar is not None:
            bar.update(len(out[-1]))
    return torch.cat(out) if out else torch.zeros(0, S)


def evaluate(policy: Policy, data: Comparisons, ref: Tensor, cfg: Config, ctx: TaskContext, micro: int,
             prefix: QuestionPrefixes | None = None) -> dict:  # fmt: skip
    """The held-out labels' mean loss, accuracy (the chosen response's implicit reward above every other's),
    margin and mean implicit rewards of the chosen and the other responses, `micro` labels a forward; {} without
    held-out labels."""
    if len(data) == 0:
        return {}
    logp = all_logprobs(policy, data, ctx, micro, reference=False, prefix=prefix)
    each, h = losses(logp, ref, chosen(data), cfg)
    stats = {"loss": each.mean()} | preference_stats(h, chosen(data))
    return {f"heldout/{k}": float(stats[k]) for k in STATS} | {"heldout/n": len(data)}


def trained_parameters(policy: Policy) -> list[torch.nn.Parameter]:
    """What DPO trains: the policy's adapter under LoRA, else every weight of its LM (never the value head, which
    DPO has no use for and which is saved as it was)."""
    if policy.adapter is None:
        return [p for p in policy.lm.parameters() if p.requires_grad]
    return [p for m in lora_modules(policy.lm) for p in (m.A[policy.adapter], m.B[policy.adapter])]


def log_step(log, stats: dict[str, float], step: int, cfg: Config, what: str) -> None:
    """A step's stats refused when one is not finite (the run diverged), else logged every run.log_interval steps
    under phase dpo, with the crash point the resume tests stop at."""
    if not all(math.isfinite(v) for v in stats.values()):
        raise FloatingPointError(f"{what} diverged at step {step}: {stats}")
    if log is not None and step % max(1, cfg.run.log_interval) == 0:
        log.scalars(stats, step, phase="dpo")
        crash_point("dpo:logged")


def checkpoint_step(run_dir: Path) -> int | None:
    """The optimizer steps done at the run's last good DPO checkpoint (None: no checkpoint)."""
    found = latest_good(Path(run_dir) / "checkpoint")
    return None if found is None else int(found[1]["step"])


def labels_digest(train: Comparisons, held: Comparisons) -> str:
    """Which labels a run trains and is evaluated on: their items, choices and weights, in order. A store that
    gained or lost labels since the checkpoint would make a resumed run another run."""
    h = hashlib.sha256()
    for t in (train.items, train.best, train.weights, held.items, held.best):
        h.update(repr(None if t is None else t.tolist()).encode())
    return h.hexdigest()


def _save_checkpoint(run_dir: Path, cfg: Config, step: int, params, opt, initial: dict, labels: str) -> None:
    save_step_checkpoint(run_dir, cfg, step, params, opt, {"initial": initial}, {"labels": labels})


def _load_checkpoint(run_dir: Path, cfg: Config, params, opt, labels: str) -> tuple[int, dict]:
    state, manifest = load_step_checkpoint(run_dir, cfg, params, opt, "DPO")
    if manifest.get("labels") != labels:
        raise UserError(f"{run_dir}: the label store's labels changed since the checkpoint was written (added, "
                        "removed or reweighted); resuming would train on others: start a new --run-dir")  # fmt: skip
    return int(state["step"]), dict(state["initial"])


def _step(policy: Policy, train: Comparisons, ref: Tensor, idx: Tensor, cfg: Config, ctx: TaskContext,
          prefix: QuestionPrefixes | None, *, micro: int) -> dict:  # fmt: skip
    """Forward and backward of one batch `idx` of the training labels, in microbatches of `micro` labels
    (dpo_microbatch) whose gradients add up to the batch's mean loss (weighted by labels.weight_by_gold where set);
    its mean stats. prefix: frozen_prefixes(train)."""
    sums = dict.fromkeys(STATS, 0.0)
    for m0 in range(0, len(idx), micro):
        sub = idx[m0 : m0 + micro]
        mb = train[sub]
        pre = prefix.rows(sub) if prefix is not None else None
        logp = response_logprobs(policy, mb.queries, mb.samples, ctx, prefix=pre)
        best = chosen(mb).to(logp.device)
        each, h = losses(logp, ref[sub].to(logp.device), best, cfg)
        w = mb.weights.to(each.device) if mb.weights is not None else torch.ones_like(each)
        ((each * w).sum() / len(idx)).backward()
        part = {"loss": each.detach().mean()} | preference_stats(h.detach(), best)
        for k in STATS:
            sums[k] += float(part[k]) * len(sub) / len(idx)
    return sums


def train_dpo(cfg: Config, policy: Policy, train: Comparisons, held: Comparisons, ctx: TaskContext, *, ref_lm=None,
              log=None, run_dir: Path | None = None, resume: bool = False) -> dict:  # fmt: skip
    """dpo.epochs passes over `train`, each in a fresh order, dpo.batch_size labels a step; the held-out labels
    evaluated before and after. ref_lm: the frozen reference (None: the policy's base with its adapter off, LoRA).
    run_dir: a checkpoint every run.save_interval steps (None: none); resume: continue from it, bitwise as a run
    that never stopped. Returns the summary; the caller saves the policy."""
    d, t0 = cfg.dpo, time.time()
    params = trained_parameters(policy)
    opt = TFAdam(params, lr=d.lr)
    # chosen once, before any tensor of the run is held: every step and pass of the run (and of its resumption on
    # the same machine) sums in the same order
    micro = dpo_microbatch(d, train.samples.shape[1], train.samples.shape[2], policy.vocab, ctx.device)
    cache, held_cache = (frozen_prefixes(policy, data, ctx, micro) for data in (train, held))
    bar = progress(len(train) + len(held), "reference log-probabilities")
    ref = all_logprobs(policy, train, ctx, micro, reference=True, ref_lm=ref_lm, bar=bar, prefix=cache)  # [N, S]
    held_ref = all_logprobs(policy, held, ctx, micro, reference=True, ref_lm=ref_lm, bar=bar, prefix=held_cache)
    bar.close()
    n, bs, digest = len(train), d.batch_size, labels_digest(train, held)
    total = math.ceil(n / bs) * d.epochs
    if resume:
        if run_dir is None:
            raise ValueError("train_dpo: resume needs the run_dir of the checkpoint")
        done, initial = _load_checkpoint(run_dir, cfg, params, opt, digest)
        print(f"resuming {run_dir} at step {done}/{total}", flush=True)
    else:
        done, initial = 0, evaluate(policy, held, held_ref, cfg, ctx, micro, held_cache)
    policy.train()  # dropout is off in the config (load_lm); train() only for modules that check the mode
    bar, step, stats = progress(total, "train-dpo", initial=done), 0, {}
    try:
        for epoch in range(d.epochs):
            perm = epoch_order(cfg.run.seed, epoch, n)
            for start in range(0, n, bs):
                if step < done:  # trained before the checkpoint this run resumed from
                    step += 1
                    continue
                for group in opt.param_groups:  # linear decay to 0, as every lmprefs trainer
                    group["lr"] = d.lr * (1 - step / total)
                opt.zero_grad(set_to_none=True)
                sums = _step(policy, train, ref, perm[start : start + bs], cfg, ctx, cache, micro=micro)
                opt.step()
                stats = {f"dpo/{k}": v for k, v in sums.items()} | {"dpo/lr": opt.param_groups[0]["lr"],
                                                                     "dpo/epoch": epoch + start / n}  # fmt: skip
                log_step(log, stats, step, cfg, "DPO")
                bar.update(1)
                bar.set_postfix(loss=f"{stats['dpo/loss']:.3f}", acc=f"{stats['dpo/accuracy']:.2f}")
                step += 1
                if run_dir is not None and step % max(1, cfg.run.save_interval) == 0 and step < total:
                    _save_checkpoint(run_dir, cfg, step, params, opt, initial, digest)
                    crash_point("dpo:saved")
    finally:
        bar.close()
    policy.eval()
    final = evaluate(policy, held, held_ref, cfg, ctx, micro, held_cache)
    summary = {f"initial_{k}": v for k, v in initial.items()} | final
    summary |= {"dpo/labels_train": n, "dpo/steps": total, "elapsed/time": time.time() - t0}
    if log is not None:
        log.scalars(summary, total, phase="dpo")
    return summary
