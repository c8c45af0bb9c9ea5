"""Supervised fine-tuning of the initial policy on prompt/response pairs or conversations (`lmprefs train-sft`):
the supervised baseline of the later work (summarize-from-feedback's "supervised" policies; behavioural cloning in
the writing prompts work), from which PPO then starts with the SFT model as its reference.

Each pair is tokenized as prompt + response with no special tokens (the policy sees the same: a query, then its
response); a conversation (TRL's `messages`) through the tokenizer's chat template, or a plain `role: content`
rendering (`lmprefs.data.sft_data`, `lmprefs.data.conversations`). The loss is the mean negative log-likelihood of
the response (assistant) tokens only, at temperature 1, over the tokenizer's real vocabulary. Full fine-tuning or,
with `lora.rank > 0`, one LoRA adapter merged into the weights at the end; the result is a plain Hugging Face
directory (`save_pretrained`, safetensors) that `--task.initial-model DIR` loads.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from torch import Tensor

from lmprefs.assets.models import resolve_model
from lmprefs.config import Config
from lmprefs.data.chat import chat_template_note
from lmprefs.data.conversations import sft_uses_template
from lmprefs.data.sft_data import encode_examples, read_sft_data
from lmprefs.data.tasks import PAD
from lmprefs.errors import UserError
from lmprefs.io.atomic import crash_point
from lmprefs.io.publish import latest_good
from lmprefs.models.artifacts import atomic_dir
from lmprefs.models.loading import load_lm, max_positions, vocab_size
from lmprefs.models.lora import add_adapter, merged_copy, using
from lmprefs.models.token_logprobs import token_logprobs
from lmprefs.models.trunk import model_inputs
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.device import autocast, setup_torch
from lmprefs.runtime.runlog import progress
from lmprefs.training.optim import TFAdam
from lmprefs.training.step_checkpoint import load_step_checkpoint, save_step_checkpoint


def response_nll(model, tokens: Tensor, mask: Tensor, vocab: int) -> tuple[Tensor, Tensor]:
    """(sum of -log p(response token), number of response tokens) for a batch; tokens/mask [B, L]."""
    ids, attn, pos = model_inputs(tokens)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1]  # [B, L-1, V']
    target, m = ids[:, 1:], mask[:, 1:]  # token t+1 is predicted at position t
    logp = token_logprobs(logits, target, 1.0, vocab)[0]  # [B, L-1]
    return -(logp * m).sum(), m.sum()


@torch.no_grad()
def mean_response_loss(model, tokens: Tensor, mask: Tensor, vocab: int, device, dtype, batch_size: int) -> float:
    total, count = 0.0, 0
    for i in range(0, len(tokens), batch_size):
        rows = slice(i, i + batch_size)
        with autocast(device, dtype):
            s, c = response_nll(model, tokens[rows].to(device), mask[rows].to(device), vocab)
        total, count = total + float(s), count + int(c)
    return total / max(count, 1)


def _restore_config(model, source: str) -> None:
    """Put back the source model's dropout and activation settings, which load_lm changed for RL (dropout off,
    GELU as one kernel), so the saved directory is the source model's architecture with new weights."""
    from transformers import AutoConfig

    src = AutoConfig.from_pretrained(source).to_dict()
    for key, value in src.items():
        if ("dropout" in key or "pdrop" in key or key == "activation_function") and hasattr(model.config, key):
            setattr(model.config, key, value)


def epoch_order(seed: int, epoch: int, n: int) -> Tensor:
    """The pairs' order in one epoch, a function of (seed, epoch) only, so a resumed run repeats it."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def checkpoint_step(run_dir: Path) -> int | None:
    """The steps done at the run's last good SFT checkpoint (None: no checkpoint)."""
    found = latest_good(Path(run_dir) / "checkpoint")
    return None if found is None else int(found[1]["step"])


def resume_log_step(run_dir: Path) -> int | None:
    """The last log row a resumed SFT run keeps (RunLogger's resume_step): rows are logged by 0-based step index,
    so after a checkpoint of k steps the rows 0..k-1 stay and step k is logged again by the resumed run."""
    done = checkpoint_step(run_dir)
    return None if done is None else done - 1


def _save_checkpoint(run_dir: Path, cfg: Config, step: int, params, opt, before: float) -> None:
    save_step_checkpoint(run_dir, cfg, step, params, opt, {"initial_loss": before}, {})


def _load_checkpoint(run_dir: Path, cfg: Config, params, opt) -> tuple[int, float]:
    state, _ = load_step_checkpoint(run_dir, cfg, params, opt, "SFT")
    return int(state["step"]), float(state["initial_loss"])


def _sft_batches(seed: int, epochs: int, n: int, bs: int):
    """(step, epochs done as a fraction, row indices) of every step of a run, in order; each epoch in its own
    seeded order (epoch_order), so that a resumed run takes the batches an uninterrupted one would."""
    step = 0
    for epoch in range(epochs):
        perm = epoch_order(seed, epoch, n)
        for start in range(0, n, bs):
            yield step, epoch + start / n, perm[start : start + bs]
            step += 1


def _sft_step(model, opt, batch: Tensor, mask: Tensor, vocab: int, on: tuple[torch.device, torch.dtype]) -> float:
    """One optimizer step on the mean NLL of a batch's response tokens; returns that loss."""
    device, dtype = on
    keep = int((batch != PAD).sum(1).max())  # drop columns that are padding in the whole batch
    with autocast(device, dtype):
        nll, count = response_nll(model, batch[:, :keep].to(device), mask[:, :keep].to(device), vocab)
    loss = nll / count
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def train_sft(cfg: Config, out_dir: Path, log=None, *, data: str | None = None, run_dir: Path | None = None,
              resume: bool = False) -> dict:  # fmt: skip
    """Fine-tune cfg.task.initial_model on cfg.sft.data (or `data`); saves the model to out_dir; returns a summary.
    run_dir: where a checkpoint is written every run.save_interval steps (None: no checkpoints); resume: continue
    from it, with the same result as a run that never stopped."""

    s = cfg.sft
    data = data or s.data
    if not data:
        raise UserError("train-sft needs prompt/response pairs or conversations: --sft.data FILE.jsonl")
    examples = read_sft_data(data)
    device, dtype = setup_torch(cfg.run)
    torch.manual_seed(cfg.run.seed)
    model, tok = load_lm(cfg.task.initial_model, device)
    vocab = vocab_size(tok)
    max_length = min(s.max_length or max_positions(model), max_positions(model))
    chat = any(e.messages for e in examples) and sft_uses_template(cfg.task, tok)
    if chat and (line := chat_template_note(cfg.task, tok, "conversations")) and dist.is_main():
        print(line, flush=True)
    tokens, mask = encode_examples(examples, tok, max_length, chat)
    adapter = "sft" if cfg.lora.rank > 0 else None
    if adapter:
        params = add_adapter(model, cfg.lora, adapter, seed=cfg.run.seed + 5)
    else:
        params = [p for p in model.parameters() if p.requires_grad]
    opt = TFAdam(params, lr=s.lr)
    n, bs = len(tokens), s.batch_size
    steps_per_epoch = math.ceil(n / bs)
    total = steps_per_epoch * s.epochs
    t0 = time.time()
    with using(model, adapter):
        if resume:
            assert run_dir is not None  # a resumed run is continued in its run_dir
            done, before = _load_checkpoint(run_dir, cfg, params, opt)
            print(f"resuming {run_dir} at step {done}/{total}")
        else:
            done, before = 0, mean_response_loss(model, tokens, mask, vocab, device, dtype, bs)
        model.train()  # dropout is off in the config (load_lm); train() only for modules that check the mode
        bar = progress(total, "train-sft", initial=done)
        try:
            for step, epoch, idx in _sft_batches(cfg.run.seed, s.epochs, n, bs):
                if step < done:  # trained before the checkpoint this run resumed from
                    continue
                for group in opt.param_groups:  # linear decay to 0, as the other trainers
                    group["lr"] = s.lr * (1 - step / total)
                loss = _sft_step(model, opt, tokens[idx], mask[idx], vocab, (device, dtype))
                stats = {"sft/loss": loss, "sft/lr": opt.param_groups[0]["lr"], "sft/epoch": epoch}
                if not math.isfinite(loss):
                    raise FloatingPointError(f"SFT diverged at step {step}: loss {loss}")
                if log is not None and step % max(1, cfg.run.log_interval) == 0:
                    log.scalars(stats, step, phase="sft")
                    crash_point("sft:logged")
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
                if run_dir is not None and (step + 1) % max(1, cfg.run.save_interval) == 0 and step + 1 < total:
                    _save_checkpoint(run_dir, cfg, step + 1, params, opt, before)
        finally:
            bar.close()
        model.eval()
        after = mean_response_loss(model, tokens, mask, vocab, device, dtype, bs)
    summary = {"sft/initial_loss": before, "sft/final_loss": after, "sft/pairs": n,
               "sft/response_tokens": int(mask.sum()), "sft/steps": total,
               "sft/seconds": time.time() - t0}  # fmt: skip
    if log is not None:
        log.scalars(summary, total, phase="sft")
    out = merged_copy(model, adapter) if adapter else model
    _restore_config(out, resolve_model(cfg.task.initial_model))
    with atomic_dir(Path(out_dir)) as tmp:
        out.save_pretrained(tmp)  # safetensors by default
        tok.save_pretrained(tmp)
        meta = {"kind": "sft", "data": str(data), "chat_template": chat, **summary}
        (tmp / "lmprefs.json").write_text(json.dumps(meta, indent=1))
    return summary
