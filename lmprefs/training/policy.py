"""Policy training with PPO against a reward model or a reward function (train_policy.py @cbfd210), with
checkpoints that resume exactly and an automatic stop (the "andon cord") for runs that go wrong.

One update, numbered as the original's PPOTrainer.step:
 1. sample queries and fixed-length responses from the policy
 2. score logprobs and values of the policy, and logprobs of the frozen reference, on the full responses
 3. truncate responses, score them, give penalty_reward_value to those that did not truncate
 4. per-token rewards -beta * KL with the score on the last token
 5. noptepochs x nminibatches of clipped PPO (whitening and GAE per minibatch, in ppo_update)
 6. update the KL controller, log, checkpoint
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from lmprefs.config import Config
from lmprefs.config.diff import config_meta
from lmprefs.data.tasks import apply_penalty, decode, format_queries, query_texts, show, truncate_responses
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text, crash_point
from lmprefs.io.publish import latest_good
from lmprefs.models import parallel
from lmprefs.models.artifacts import _save_policy, atomic_dir, plain_copy, save_policy
from lmprefs.models.lora import adapter_state, using
from lmprefs.models.policy import Policy
from lmprefs.models.sampling import sample, sampler_options
from lmprefs.models.trunk import FrozenPrefix, frozen_prefix, logprobs_and_entropy, response_logits_hidden
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.device import autocast, pick_dtype
from lmprefs.runtime.runlog import progress
from lmprefs.training.optim import TFAdam
from lmprefs.training.ppo import Rollout, kl_penalized_rewards, make_kl_controller, ppo_update

# (formatted queries [B, Q'], truncated responses [B, T], FrozenPrefix of the rollout or None) -> scores [B]
ScoreFn = Callable[[Tensor, Tensor, FrozenPrefix | None], Tensor]


class AndonStop(RuntimeError):
    """The run stopped itself (NaN/inf, KL past its ceiling, or a collapsing score); the last good checkpoint is
    kept and RUN_DIR/ANDON says why."""


def rm_score_fn(rm) -> ScoreFn:
    """Scores from a reward model; a reward adapter on the policy's base reuses the rollout's frozen prefix."""

    def score(queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None) -> Tensor:
        with torch.no_grad():
            return rm(queries, responses, prefix).float()

    return score


def text_score_fn(fn: Callable[[list[str], list[str]], list[float]], tok, mean: float = 0.0, std: float = 1.0,
                  prefix: list[int] = (), suffix: list[int] = ()) -> ScoreFn:  # fmt: skip
    """A reward on the response text (e.g. VADER): the paper's 'direct access to the true reward', as
    (fn(responses, queries) - mean) / std; the queries are the query texts without the task's prefix and suffix."""

    def score(queries: Tensor, responses: Tensor, frozen: FrozenPrefix | None = None) -> Tensor:
        texts = fn(decode(tok, responses), query_texts(tok, queries, prefix, suffix))
        raw = torch.tensor(texts, dtype=torch.float32, device=responses.device)
        return (raw - mean) / std

    return score


@dataclass
class PolicyRun:
    """Everything one train_policy run holds; `state_dict` is what a checkpoint resumes."""

    policy: Policy
    ref_lm: object | None
    optimizer: TFAdam
    kl_ctl: object
    stream: object
    gen_sample: torch.Generator
    gen_ppo: torch.Generator
    update: int = 0
    elapsed: float = 0.0
    best_score_ema: float = -math.inf
    score_ema: float | None = None
    extras: dict = field(default_factory=dict)
    """More state for the checkpoint: name -> an object with state_dict()/load_state_dict() holding tensors and
    plain types only (state.pt loads with weights_only=True): the online reward state, a LoRA reward model's head."""
    saved_update: int | None = None  # the update of the last checkpoint written or loaded (None: none yet)
    value_optimizer: TFAdam | None = None
    """A separate value model's own optimizer (ppo.value_model=separate); None: one optimizer for everything."""

    @property
    def optimizers(self) -> list[TFAdam]:
        return [self.optimizer] + ([self.value_optimizer] if self.value_optimizer is not None else [])

    def state_dict(self) -> dict:
        s = {"optimizer": self.optimizer.state_dict(), "kl_ctl": self.kl_ctl.state_dict(),
             "stream": self.stream.state_dict(), "gen_sample": self.gen_sample.get_state(),
             "gen_ppo": self.gen_ppo.get_state(), "update": self.update, "elapsed": self.elapsed,
             "best_score_ema": self.best_score_ema, "score_ema": self.score_ema,
             "extras": {k: v.state_dict() for k, v in self.extras.items()}}  # fmt: skip
        if self.value_optimizer is not None:
            s["value_optimizer"] = self.value_optimizer.state_dict()
        return s

    def load_state_dict(self, s: dict) -> None:
        missing = [k for k in self.extras if k not in s.get("extras", {})]
        if missing:
            raise UserError(f"the checkpoint holds no {missing[0]!r} state, which this run needs")
        if (self.value_optimizer is not None) != ("value_optimizer" in s):
            raise UserError("the checkpoint was written with another ppo.value_model (shared or separate) than this "
                            "run's")  # fmt: skip
        if s["optimizer"] is not None:  # None: loaded already (FSDP's named optimizer state)
            self.optimizer.load_state_dict(s["optimizer"])
        if self.value_optimizer is not None:
            self.value_optimizer.load_state_dict(s["value_optimizer"])
        self.kl_ctl.load_state_dict(s["kl_ctl"])
        self.stream.load_state_dict(s["stream"])
        self.gen_sample.set_state(s["gen_sample"])
        self.gen_ppo.set_state(s["gen_ppo"])
        self.update, self.elapsed = s["update"], s["elapsed"]
        self.best_score_ema, self.score_ema = s["best_score_ema"], s["score_ema"]
        for k, v in self.extras.items():
            v.load_state_dict(s["extras"][k])


def ref_logprobs(ref_lm, queries: Tensor, responses: Tensor, temperature: float, vocab: int,
                 prefix: FrozenPrefix | None = None, repeats: int = 1) -> Tensor:  # fmt: skip
    _, logits = response_logits_hidden(ref_lm, queries, responses, prefix, repeats)
    return logprobs_and_entropy(logits, responses, temperature, vocab)[0]


@torch.no_grad()
def make_rollout(run: PolicyRun, score_fn: ScoreFn, queries: Tensor, cfg: Config, prefix, suffix, device, dtype):
    """Steps 1-4 of an update: (Rollout, stats, texts for printing)."""

    policy, task = run.policy, cfg.task
    q = format_queries(queries.to(device), prefix, suffix)

    def policy_pass():
        # logprobs and values come from the sampling pass itself (policy.respond in the original): no extra forward
        with using(policy.lm, policy.adapter):
            responses, logprobs, hidden = sample(policy.lm, q, task.response_length, task.temperature, policy.vocab,
                                                 run.gen_sample, return_hidden=True,
                                                 **sampler_options(cfg.run))  # fmt: skip
        # with LoRA in the top blocks, the frozen blocks below run once here for the reference, the reward model
        # and every PPO epoch of this batch (None when all blocks train)
        prefix = frozen_prefix(policy.lm, torch.cat([q, responses], dim=1))
        values = policy.values_from(q, responses, hidden, prefix)
        return responses, logprobs, values, prefix

    def ref_pass():
        with using(policy.lm, None):  # with LoRA the reference is the shared base, adapters off
            return ref_logprobs(run.ref_lm or policy.lm, q, responses, task.temperature, policy.vocab, prefix)

    with autocast(device, dtype):  # under FSDP each pass gathers its model's shards first (a collective)
        responses, logprobs, values, prefix = parallel.gathered(policy, policy_pass)
        ref = parallel.gathered(run.ref_lm, ref_pass) if run.ref_lm is not None else ref_pass()
    logprobs, values, ref = logprobs.float(), values.float(), ref.float()
    post = truncate_responses(responses, task.truncate_token, task.truncate_after)  # 3. score the truncated text
    with autocast(device, dtype):
        raw = score_fn(q, post, prefix).float()
    scores = apply_penalty(raw, post, task)
    rewards, non_score, kl = kl_penalized_rewards(logprobs, ref, scores, run.kl_ctl.value)  # 4.
    stats = {  # record_step_stats (train_policy.py#L241)
        "objective/kl": kl.sum(1).mean().item(),
        "objective/kl_coef": run.kl_ctl.value,
        "objective/entropy": (-logprobs).sum(1).mean().item(),
        "objective/score": scores.mean().item(),
        "objective/score_total": (non_score.sum(1) + scores).mean().item(),
        "objective/penalized_fraction": (scores != raw).float().mean().item(),
    }
    rollout = Rollout(q, responses, logprobs, ref, values, scores, rewards, prefix)
    return rollout, stats, {"responses": post, "kl": kl.sum(1)}


def build_run(cfg: Config, policy: Policy, stream, device) -> PolicyRun:
    # the frozen initial model; with LoRA it is the shared base itself (adapters off), no copy needed
    ref_lm = None if policy.adapter else copy.deepcopy(policy.lm).requires_grad_(False).eval()
    if cfg.run.parallel == "fsdp" and dist.active():  # sharded before the optimizer sees the parameters

        dtype = pick_dtype(cfg.run.dtype, device)
        parallel.fsdp_shard(policy, dtype)
        if ref_lm is not None:
            parallel.fsdp_shard(ref_lm, dtype)
    params, value_opt = policy.trainable_parameters(), None
    if cfg.ppo.value_model == "separate":  # the value model's trunk and head train under their own optimizer
        value = policy.value_parameters()
        params = [p for p in params if all(p is not v for v in value)]
        value_opt = TFAdam(value, lr=cfg.ppo.vf_lr or cfg.ppo.lr)
    seed = dist.rank_seed(cfg.run.seed)  # seed + rank * 100003 (set_mpi_seed); cfg.run.seed in one process
    return PolicyRun(
        policy=policy, ref_lm=ref_lm, optimizer=TFAdam(params, lr=cfg.ppo.lr), kl_ctl=make_kl_controller(cfg.rewards),
        stream=stream, gen_sample=torch.Generator(device=device).manual_seed(seed),
        gen_ppo=torch.Generator(device=device).manual_seed(seed + 1), value_optimizer=value_opt,
    )  # fmt: skip


def andon_check(run: PolicyRun, stats: dict, cfg: Config) -> str | None:
    """Why the run must stop now, or None. The paper's sign-flip bug ran all night unnoticed."""
    bad = [k for k, v in stats.items() if not math.isfinite(v)]
    if bad:
        return f"non-finite {', '.join(bad[:4])} at update {run.update}"
    if stats["objective/kl"] > cfg.ppo.kl_stop:
        return f"objective/kl = {stats['objective/kl']:.2f} exceeds ppo.kl_stop = {cfg.ppo.kl_stop}"
    s = stats["objective/score"]
    run.score_ema = s if run.score_ema is None else 0.8 * run.score_ema + 0.2 * s
    run.best_score_ema = max(run.best_score_ema, run.score_ema)
    if cfg.ppo.score_drop_stop is not None and run.best_score_ema - run.score_ema > cfg.ppo.score_drop_stop:
        return (f"score collapsed: running mean {run.score_ema:+.3f} is {run.best_score_ema - run.score_ema:.2f} "
                f"below its best {run.best_score_ema:+.3f} "
                f"(ppo.score_drop_stop = {cfg.ppo.score_drop_stop})")  # fmt: skip
    return None


def nonfinite_parameters(run: PolicyRun) -> str | None:
    """Why the parameters must not be saved (NaN/inf in one of them), or None."""
    params = run.policy.trainable_parameters()
    # this rank's shards under FSDP (then all ranks must agree), one host sync, not one per tensor (GPU)
    finite = torch.stack([torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all() for p in params])
    if not dist.any_rank(not bool(finite.all())) if parallel.is_sharded(run.policy) else bool(finite.all()):
        return None
    if bool(finite.all()):
        return f"non-finite parameters on another rank after update {run.update}"
    named = {id(p): n for n, p in run.policy.named_parameters()}
    first = params[int((~finite).nonzero()[0])]
    return f"non-finite parameter {named.get(id(first), '?')} after update {run.update}"


RANK_STATE_FILE = "ranks.pt"  # every rank's generators and query-stream position, and the world size


def rank_states(run: PolicyRun) -> dict:
    """What differs between ranks, gathered from all of them (a collective: every rank calls it)."""
    mine = {"stream": run.stream.state_dict(), "gen_sample": run.gen_sample.get_state(),
            "gen_ppo": run.gen_ppo.get_state()}  # fmt: skip
    return {"world_size": dist.world(), "ranks": dist.all_gather_objects(mine)}


def load_rank_state(run: PolicyRun, ckpt: Path) -> None:
    """This rank's part of rank_states; refuses a checkpoint written by another number of ranks."""
    path = Path(ckpt) / RANK_STATE_FILE
    saved = torch.load(path, weights_only=True) if path.is_file() else {"world_size": 1, "ranks": None}
    if saved["world_size"] != dist.world():
        raise UserError(f"--resume: the checkpoint in {Path(ckpt).parent} was written by {saved['world_size']} "
                        f"rank(s) and this launch has {dist.world()}; resume with the same number of processes "
                        f"(torchrun --nproc-per-node/--nnodes giving WORLD_SIZE={saved['world_size']})")  # fmt: skip
    if saved["ranks"] is not None:
        s = saved["ranks"][dist.rank()]
        run.stream.load_state_dict(s["stream"])
        run.gen_sample.set_state(s["gen_sample"])
        run.gen_ppo.set_state(s["gen_ppo"])


def compile_training(compile: str, device: torch.device) -> bool:
    """Whether run.compile compiles the PPO training forward: on = always, off = never, auto = on CUDA without a
    launcher (under DDP/FSDP, even at world size 1, the compiled forward has not been measured yet)."""
    return compile == "on" or (compile == "auto" and device.type == "cuda" and not dist.active())


def training_forward(model, compile: str, device: torch.device) -> Callable:
    """forward(mb) -> (logprobs, values, entropy) [b, T] for ppo_update. Compiled (compile_training) it is one
    graph: every minibatch has the same shape, and inductor fuses the layer norms, activations and the log-softmax
    and entropy over the vocabulary that eager runs as separate passes over [b, T, V] tensors."""
    call = torch.compile(model, dynamic=False) if compile_training(compile, device) else model
    return lambda mb: call(mb.queries, mb.responses, mb.prefix)


def save_checkpoint(run: PolicyRun, run_dir: Path, cfg: Config | None = None) -> None:
    """A new version of checkpoint/ (policy/ as a HF directory + value head, state.pt, ranks.pt, and with LoRA the
    exact adapter weights), published atomically with a manifest by rank 0; the previous version stays for
    fallback. Every rank calls it (their own states are gathered). Non-finite parameters are never saved."""
    from safetensors.torch import save_file

    bad = nonfinite_parameters(run)
    if bad:
        raise AndonStop(f"refusing to save a checkpoint: {bad}")
    meta = {"update": run.update, **(config_meta(cfg) if cfg is not None else {})}
    ranks = rank_states(run)
    policy, optimizer = run.policy, None
    if parallel.is_sharded(run.policy):  # FSDP: the whole model and optimizer state gathered on rank 0 (collectives)

        model_state = parallel.full_state_dict(run.policy)
        optimizer = parallel.full_optimizer_state(run.policy, run.optimizer)
        policy = plain_copy(run.policy, model_state) if dist.is_main() else None
    run.saved_update = run.update
    if not dist.is_main():
        return
    with atomic_dir(Path(run_dir) / "checkpoint", meta, keep=1) as tmp:
        torch.save(ranks, tmp / RANK_STATE_FILE)
        _save_policy(policy, tmp / "policy")
        if run.policy.adapter:  # the exact adapter weights; the merged export above is for sampling
            save_file(adapter_state(run.policy.lm), tmp / "adapters.safetensors")
        state = run.state_dict()
        if optimizer is not None:  # keyed by parameter name (get_optimizer_state_dict), not by position
            state["optimizer"] = optimizer
        torch.save(state, tmp / "state.pt")
    run.saved_update = run.update


def find_checkpoint(run_dir: Path) -> tuple[Path, dict] | None:
    """(newest checkpoint version that verifies, its manifest), or None when the run never saved one."""

    return latest_good(Path(run_dir) / "checkpoint")


def load_checkpoint(run: PolicyRun, run_dir: Path, found: tuple[Path, dict] | None = None) -> dict:
    """Load the newest good checkpoint of run_dir into `run` (or `found`, from find_checkpoint); its manifest."""
    from safetensors.torch import load_file

    found = found or find_checkpoint(run_dir)
    if found is None:
        raise UserError(f"--resume: {run_dir} has no checkpoint")
    ckpt, manifest = found
    state = torch.load(ckpt / "state.pt", weights_only=True)
    if state["update"] != manifest.get("update"):
        raise UserError(f"{ckpt}: state.pt is of update {state['update']}, the manifest of {manifest.get('update')}")
    if run.policy.adapter:
        run.policy.lm.load_state_dict(load_file(ckpt / "adapters.safetensors"), strict=False)
        run.policy.value_head.load_state_dict(load_file(ckpt / "policy" / "value_head.safetensors"))
        run.load_state_dict(state)
        load_rank_state(run, ckpt)
        run.saved_update = run.update
        return manifest
    src = load_file(ckpt / "policy" / "model.safetensors")
    lm_state = run.policy.lm.state_dict()
    missing = [k for k in lm_state if k not in src and not _tied(run.policy.lm, k)]
    if missing:
        raise UserError(f"checkpoint in {run_dir} does not match the model (missing {missing[:3]})")
    whole = _whole(run.policy.lm, src, "lm.")
    whole |= {f"value_head.{k}": v for k, v in load_file(ckpt / "policy" / "value_head.safetensors").items()}
    if run.policy.value_lm is not None:
        value = load_file(ckpt / "policy" / "value_model" / "model.safetensors")
        whole |= _whole(run.policy.value_lm, value, "value_lm.")
    sharded = parallel.is_sharded(run.policy)
    state = {**state, "optimizer": _optimizer_keys(run.policy, state["optimizer"], by_name=sharded)}
    if sharded:  # every rank keeps its shards of the whole (set_model_state_dict)
        parallel.load_full_state_dict(run.policy, whole)
        parallel.load_full_optimizer_state(run.policy, run.optimizer, state["optimizer"])
        state["optimizer"] = None
    else:
        run.policy.load_state_dict(whole)
    run.load_state_dict(state)
    load_rank_state(run, ckpt)
    run.saved_update = run.update
    return manifest


def _tied(model, key: str) -> bool:
    return key.endswith("lm_head.weight") and getattr(model.config, "tie_word_embeddings", False)


def _optimizer_keys(policy: Policy, saved: dict, by_name: bool) -> dict:
    """An optimizer state dict keyed by parameter name (FSDP's get_optimizer_state_dict) or by position (torch's
    own), from either: a run continued after an andon stop may change run.parallel."""
    names = [n for n, p in policy.named_parameters() if p.requires_grad]  # trainable_parameters' order
    if not saved["param_groups"] or isinstance(saved["param_groups"][0]["params"][0], str) == by_name:
        return saved
    to = {n: i for i, n in enumerate(names)} if not by_name else dict(enumerate(names))
    return {"state": {to[k]: v for k, v in saved["state"].items()},
            "param_groups": [{**g, "params": [to[k] for k in g["params"]]} for g in saved["param_groups"]]}


def _whole(model, src: dict, prefix: str) -> dict:
    """`model`'s state dict from saved tensors `src`, under `prefix`; a tied output embedding, which
    save_pretrained writes once, takes the input embedding's tensor."""
    emb = model.get_input_embeddings().weight
    emb_name = next(n for n, p in model.named_parameters() if p is emb)
    return {prefix + k: src[k] if k in src else src[emb_name] for k in model.state_dict()}


def train_policy(cfg: Config, run: PolicyRun, score_fn: ScoreFn, log, run_dir: Path, prefix, suffix, device, dtype,
                 on_update: Callable[[PolicyRun, dict], None] | None = None) -> dict:  # fmt: skip
    """The outer loop, from run.update to ppo.num_updates. Returns the last update's stats."""

    n_updates, B = cfg.ppo.num_updates, cfg.ppo.batch_size
    if n_updates <= 0:
        raise UserError(f"ppo.total_episodes={cfg.ppo.total_episodes} is less than one batch ({B})")
    # each rank samples and updates on its share of the global batch, in nminibatches minibatches of its own
    B_rank = dist.split_global(B, "ppo.batch_size", cfg.ppo.nminibatches)
    model = parallel.wrap(run.policy, cfg.run.parallel)  # DDP (or FSDP, sharded in build_run) averages the gradients
    forward = training_forward(model, cfg.run.compile, device)
    bar = progress(n_updates, "PPO updates", initial=run.update)
    stats: dict = {}
    while run.update < n_updates:
        t0 = time.time()
        lr = cfg.ppo.lr * (1 - run.update / n_updates)  # linear decay to 0 over the run
        for g in run.optimizer.param_groups:
            g["lr"] = lr
        vf_lr = (cfg.ppo.vf_lr or cfg.ppo.lr) * (1 - run.update / n_updates)
        for g in run.value_optimizer.param_groups if run.value_optimizer is not None else []:
            g["lr"] = vf_lr
        rollout, stats, extra = make_rollout(run, score_fn, run.stream.next(B_rank), cfg, prefix, suffix, device,
                                             dtype)  # fmt: skip
        stats = dist.all_reduce_mean(stats)  # the KL controller, the andon cord and the logs see all ranks' batch
        run.policy.train()
        opt = run.optimizer if run.value_optimizer is None else run.optimizers  # a separate value model's own too
        stats |= ppo_update(forward, opt, rollout, cfg.ppo, run.gen_ppo,
                            autocast=lambda: autocast(device, dtype), reduce=dist.all_reduce_mean)
        run.policy.eval()
        run.kl_ctl.update(stats["objective/kl"], B)  # 6.
        run.update += 1
        run.elapsed += time.time() - t0
        if run.value_optimizer is not None:
            stats["ppo/vf_lr"] = vf_lr
        stats |= {"ppo/lr": lr, "elapsed/updates": run.update, "elapsed/episodes": run.update * B,
                  "elapsed/fps": B * cfg.task.response_length / (time.time() - t0),
                  "elapsed/time": run.elapsed}  # fmt: skip
        if on_update is not None:  # may add metrics of its own before they are written
            seen = set(stats)
            on_update(run, stats)
            stats |= dist.all_reduce_mean({k: v for k, v in stats.items() if k not in seen})
        stats |= dist.all_reduce_mean({k: stats[k] for k in ("elapsed/fps", "elapsed/time")})  # clocks differ
        log.scalars(stats, run.update)
        if (run.update % cfg.run.log_interval == 0 or run.update == 1) and dist.is_main():
            _print_samples(run, rollout, extra, cfg, log)
        crash_point("train:logged")
        reason = andon_check(run, stats, cfg) or nonfinite_parameters(run)
        if reason:  # the poisoned state is not saved: the last good checkpoint stays what --resume finds
            bar.close()
            raise andon_stop(run, run_dir, reason)
        if run.update % cfg.run.save_interval == 0 or run.update == n_updates:
            save_checkpoint(run, run_dir, cfg)
            crash_point("train:saved")
        bar.update(1)
        bar.set_postfix(score=f"{stats['objective/score']:+.3f}", kl=f"{stats['objective/kl']:.2f}",
                        beta=f"{stats['objective/kl_coef']:.3f}")  # fmt: skip
    bar.close()
    policy = run.policy
    if parallel.is_sharded(policy):
        state = parallel.full_state_dict(policy)  # a collective
        policy = plain_copy(policy, state) if dist.is_main() else None
    if dist.is_main():
        save_policy(policy, Path(run_dir) / "policy")
    dist.barrier()
    return stats


def andon_stop(run: PolicyRun, run_dir: Path, reason: str) -> AndonStop:
    """Record why the run stopped in RUN_DIR/ANDON (which `--resume` reads) and build the exception to raise."""
    import json

    last = run.saved_update
    if dist.is_main():
        row = {"update": run.update, "reason": reason, "last_good_update": last}
        atomic_write_text(Path(run_dir) / "ANDON", json.dumps(row) + "\n")
    kept = (f"the last good checkpoint (update {last}) is kept in {run_dir}/checkpoint" if last is not None
            else "no checkpoint had been saved yet")  # fmt: skip
    return AndonStop(f"andon cord pulled at update {run.update}: {reason}; {kept}")


def _print_samples(run: PolicyRun, rollout: Rollout, extra: dict, cfg: Config, log, n: int = 3) -> None:
    """Three samples in the original's format (train_policy.py#L423-L430), also appended to samples.jsonl."""
    from tqdm import tqdm

    tok = run.policy.tokenizer
    beta = run.kl_ctl.value
    rows = []
    for i in range(min(n, len(rollout))):
        q, r = decode(tok, rollout.queries[i : i + 1])[0], decode(tok, extra["responses"][i : i + 1])[0]
        score, kl = rollout.scores[i].item(), extra["kl"][i].item()
        tqdm.write(f"{show(q)}\n{show(r)}\n  score = {score:+.3f}\n  kl = {kl:+.3f}\n"
                   f"  total = {score - beta * kl:+.3f}")
        rows.append({"query": q, "response": r, "score": score, "kl": kl, "total": score - beta * kl})
    log.samples(rows, run.update)
