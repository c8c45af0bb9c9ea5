#!/usr/bin/env python
"""PPO throughput on the original sentiment job's shapes, split by phase, on a GPU (or, smaller, on the CPU).

The original's sentiment run: a GPT-2 124M policy, query 64 / response 24 tokens, batch 512, one minibatch, 4 PPO
epochs, a GPT-2 124M reward model, 1M episodes (4.8 h on 8 V100s). This script runs lmprefs' own PPO loop
(lmprefs.training.policy.train_policy) on those shapes with random weights (GPT-2's weights are not available
offline; `--model smollm2-135m` or any local HF directory uses real ones) and prints:

- episodes/s end to end, and seconds per update split into generation, rollout forwards (values, reference,
  frozen prefix), scoring (the reward model) and PPO optimisation (4 epochs of forward, backward, Adam);
- model FLOPs per update (analytic: 2 x block parameters per token forward, x3 for forward+backward, attention,
  the LM head where it runs) and the utilisation against the GPU's bf16 dense peak (`--peak-tflops` elsewhere);
- the projected wall time of 1M episodes;
- beside it, in the same invocation, the sampler alone in each of its modes (dynamic cache, static cache, static
  cache with the compiled decode step) and Hugging Face `generate` on the same model and batch: the speed a user
  gets from plain transformers.

    python benchmarks/gpu_throughput.py                      # CUDA: GPT-2 124M, batch 512; CPU: a 4-layer GPT-2
    python benchmarks/gpu_throughput.py --model smollm2-135m --batch 256
    python benchmarks/gpu_throughput.py --profile            # also a torch.profiler table of one update

Prints a table and, last, one JSON line (also written to --json).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from _common import ArgumentParser, nonnegative_int, positive_int, run_main  # noqa: E402

# lmprefs internals this script uses, all in this block
import lmprefs  # noqa: E402
from lmprefs.assets.models import resolve_model  # noqa: E402
from lmprefs.config import Config, RunConfig, preset  # noqa: E402
from lmprefs.data.queries import QueryStream  # noqa: E402
from lmprefs.data.tasks import TaskContext  # noqa: E402
from lmprefs.models import attention  # noqa: E402
from lmprefs.models.loading import load_lm, trunk_blocks  # noqa: E402
from lmprefs.models.reward_model import RewardModel  # noqa: E402
from lmprefs.models.sampling import sample, sampler_mode  # noqa: E402
from lmprefs.pipeline.policy import policy_for  # noqa: E402
from lmprefs.pipeline.task import Task  # noqa: E402
from lmprefs.runtime.device import autocast, compiles_forwards, setup_torch  # noqa: E402
from lmprefs.training import policy as P  # noqa: E402
from lmprefs.training import rollout as RO  # noqa: E402 (sample, ref_logprobs, frozen_prefix are timed there)
from lmprefs.training.policy_run import PolicyRun, build_run  # noqa: E402

# bf16 dense tensor-core peaks (TFLOP/s, no sparsity) by GPU name, for the utilisation figure
BF16_PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.0, "H200": 989.0, "GH200": 989.0, "A100": 312.0,
                    "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0, "RTX 4090": 165.0}  # fmt: skip

ARCHS: dict[str, dict[str, Any]] = {  # random-weight GPT-2s: the original's 124M, and a small one for CPUs
    "gpt2-124m": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
    "gpt2-mini": dict(n_layer=4, n_embd=256, n_head=4, n_positions=1024),
}


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    p.add_argument("--model", default=None,
                   help="gpt2-124m or gpt2-mini (random weights, the exact GPT-2 tokenizer), an lmprefs asset such as "
                        "smollm2-135m, or a local HF directory; default gpt2-124m on CUDA, gpt2-mini on the CPU")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="episodes per update; default 512 (CUDA) / 32 (CPU)")  # fmt: skip
    p.add_argument("--query-len", type=positive_int, default=64)
    p.add_argument("--response-len", type=positive_int, default=24)
    p.add_argument("--noptepochs", type=positive_int, default=4)
    p.add_argument("--nminibatches", type=positive_int, default=1)
    p.add_argument("--updates", type=positive_int, default=None, help="timed PPO updates; default 5 (CUDA) / 2 (CPU)")
    p.add_argument("--warmup", type=nonnegative_int, default=1,
                   help="untimed updates first (compilation happens there)")  # fmt: skip
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"], help="run.compile for the sampler")
    p.add_argument("--kv-cache", default="auto", choices=["auto", "static", "dynamic"], help="run.kv_cache")
    p.add_argument("--decode-attention", default="fused", choices=["fused", "sdpa"],
                   help="a compiled decode step's attention on a GPU: lmprefs' fused form (the default) or SDPA's")
    p.add_argument("--sampler-reps", type=positive_int, default=3,
                   help="timed calls per sampler mode and for HF generate")  # fmt: skip
    p.add_argument("--no-generate", action="store_true", help="skip the sampler-alone and HF generate comparison")
    p.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak for the utilisation figure")
    p.add_argument("--threads", type=nonnegative_int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--profile", action="store_true",
                   help="print a torch.profiler table of one extra update (two more updates run)")
    p.add_argument("--profile-sampler", action="store_true",
                   help="print a torch.profiler table of one sampler call (static cache, compiled on CUDA)")
    p.add_argument("--json", default=None, help="also write the result JSON here")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", a.device):
        p.error(f"--device {a.device!r}: choose auto, cpu, cuda or cuda:N")
    if a.batch is not None and a.batch % a.nminibatches:
        p.error(f"--batch {a.batch} is not a multiple of --nminibatches {a.nminibatches}")
    if a.peak_tflops is not None and not a.peak_tflops > 0:
        p.error(f"--peak-tflops must be positive, not {a.peak_tflops}")
    return a


def build_model_dir(arch: str, seed: int, parent: Path | None = None) -> str:
    """A random-weight GPT-2 of `arch` saved with the exact GPT-2 tokenizer, so it loads like any model."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    out = Path(tempfile.mkdtemp(prefix=f"lmprefs-{arch}-", dir=parent))
    torch.manual_seed(seed)
    GPT2LMHeadModel(GPT2Config(vocab_size=50257, **ARCHS[arch])).save_pretrained(out)
    AutoTokenizer.from_pretrained(resolve_model("tiny-gpt2")).save_pretrained(out)  # GPT-2's own BPE
    return str(out)


def model_flops(model, B: int, Q: int, T: int, noptepochs: int, vocab: int) -> dict:
    """Analytic model FLOPs of one update: a forward costs 2 x (block parameters) per token, attention
    2 x 2 x d x (context) per token and layer, the LM head 2 x d x V where logits are needed (response positions);
    a backward twice the forward."""
    blocks = trunk_blocks(model)
    n_block = sum(p.numel() for p in blocks.parameters())
    d, L, n_layer = model.config.hidden_size, Q + T, len(blocks)

    def fwd(tokens: int, ctx: float, head_positions: int) -> float:
        return tokens * (2 * n_block + 4 * n_layer * d * ctx) + head_positions * 2 * d * vocab

    full = fwd(B * L, L / 2, 0)  # one pass over query + response
    gen = fwd(B * Q, Q / 2, 0) + fwd(B * T, Q + T / 2, B * T)  # prefill, then T decode steps with the head
    out = {"generation": gen, "rollout_forward": full + B * T * 2 * d * vocab,  # reference logprobs
           "scoring": full, "optimization": 3 * noptepochs * (full + B * T * 2 * d * vocab)}  # fmt: skip
    out["total"] = sum(out.values())
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    # the random model and the run's checkpoint (500 MB each for GPT-2 124M) go when the benchmark ends
    with tempfile.TemporaryDirectory(prefix="lmprefs-gpu-bench-") as tmp:
        return bench(args, Path(tmp))


def bench(args, tmp: Path) -> int:
    run_cfg = RunConfig(device=args.device, dtype=args.dtype, threads=args.threads, seed=args.seed,
                        compile=args.compile, kv_cache=args.kv_cache, log_interval=10**9,
                        save_interval=10**9)  # fmt: skip
    device, dtype = setup_torch(run_cfg)
    attention.FUSED_DECODE = args.decode_attention == "fused"
    cuda = device.type == "cuda"
    name = args.model or ("gpt2-124m" if cuda else "gpt2-mini")
    B = args.batch or (512 if cuda else 32)
    updates = args.updates or (5 if cuda else 2)
    Q, T = args.query_len, args.response_len
    model_dir = build_model_dir(name, args.seed, tmp) if name in ARCHS else name
    cfg = ppo_config(args, run_cfg, model_dir, B, updates)
    model, tok = load_lm(model_dir, device)
    V = len(tok)
    gpu = torch.cuda.get_device_name(device) if cuda else None
    print(f"lmprefs {lmprefs.__version__}, torch {torch.__version__}, device {gpu or 'cpu'}, autocast {dtype}, "
          f"model {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M), batch {B}, Q {Q}, T {T}, "
          f"{args.noptepochs} epochs x {args.nminibatches} minibatch, sampler static/compiled = "
          f"{sampler_mode(args.kv_cache, args.compile, device)}, decode attention {args.decode_attention}",
          flush=True)  # fmt: skip

    g = torch.Generator().manual_seed(args.seed)
    queries = torch.randint(0, V, (B * (args.warmup + updates + 2), Q), generator=g)
    t = Task(cfg, device, dtype, model, tok, queries, queries[:0], [], [])
    policy = policy_for(t)
    rm = RewardModel(copy.deepcopy(model), tok, seed=args.seed).to(device).freeze().eval()  # the original's RM
    run = build_run(cfg, policy, QueryStream(queries, args.seed), device)

    # ---- phase timers around what the loop calls (synchronising on CUDA so each phase owns its kernels) ----
    clock = PhaseClock(device, last_timed=args.warmup + updates, profile=args.profile)
    RO.sample = clock.timed("generation", RO.sample)
    RO.ref_logprobs = clock.timed("rollout_forward", RO.ref_logprobs)
    RO.frozen_prefix = clock.timed("rollout_forward", RO.frozen_prefix)
    policy.values_from = clock.timed("rollout_forward", policy.values_from)
    score_fn = clock.timed("scoring", RO.rm_score_fn(rm, compiles_forwards(args.compile, device)))
    clock.start()
    P.train_policy(cfg, run, score_fn, NullLog(), tmp / "run", TaskContext([], [], device, dtype),
                   on_update=clock.on_update)  # fmt: skip
    timed_recs = clock.records[args.warmup : args.warmup + updates]
    res = ppo_report(args, t, timed_recs, model_flops(model, B, Q, T, args.noptepochs, V), name, gpu)

    if not args.no_generate:
        res["sampler_alone"] = sampler_comparison(args, policy.lm, tok, queries[:B].to(device), cfg, device, dtype)
    if args.profile_sampler:
        sampler_profile(policy.lm, tok, queries[:B].to(device), cfg, device, dtype)
    if clock.prof is not None:
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(clock.prof.key_averages().table(sort_by=key, row_limit=25))
    line = json.dumps(res)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    return 0


def ppo_config(args, run_cfg: RunConfig, model_dir: str, B: int, updates: int) -> Config:
    """The sentiment preset on this run's model, shapes and number of updates (warm-up, timed, and two more with
    --profile), with the andon cord's KL and score-drop stops off: nothing ends a speed run early."""
    cfg0 = preset("sentiment")
    Q, T = args.query_len, args.response_len
    return replace(
        cfg0,
        task=replace(cfg0.task, initial_model=model_dir, query_dataset="bundled", query_length=Q, response_length=T),
        ppo=replace(cfg0.ppo, batch_size=B, nminibatches=args.nminibatches, noptepochs=args.noptepochs,
                    score_drop_stop=None, kl_stop=1e9,
                    total_episodes=B * (args.warmup + updates + 2 * int(args.profile))),
        run=run_cfg,
    )  # fmt: skip


class PhaseClock:
    """Seconds of each PPO update by phase: `timed` wraps what the loop calls (synchronising on CUDA so each phase
    owns its kernels), `on_update` closes an update's record, whose optimization is the rest of its time. With
    `profile`, torch.profiler records the update after the last timed one."""

    def __init__(self, device: torch.device, *, last_timed: int, profile: bool):
        self.device, self.cuda = device, device.type == "cuda"
        self.last_timed, self.profile = last_timed, profile
        self.cur: dict[str, float] = defaultdict(float)
        self.records: list[dict] = []
        self.mark = 0.0
        self.prof: torch.profiler.profile | None = None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def timed(self, phase: str, fn):
        def wrapper(*a, **k):
            self.sync()
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.sync()
                self.cur[phase] += time.perf_counter() - t0

        return wrapper

    def start(self) -> None:
        self.sync()
        self.mark = time.perf_counter()

    def on_update(self, r: PolicyRun, stats: dict) -> None:
        self.sync()
        now = time.perf_counter()
        total = now - self.mark
        rec = {"total": total, **self.cur}
        rec["optimization"] = total - sum(v for k, v in self.cur.items())
        self.records.append(rec)
        self.cur.clear()
        if self.prof is not None and r.update == self.last_timed + 1:  # before the run's final save
            self.prof.stop()
        if self.profile and r.update == self.last_timed:  # profile one extra update
            self.prof = torch.profiler.profile(activities=profiler_activities(self.cuda))
            self.prof.start()
        self.mark = time.perf_counter()


def profiler_activities(cuda: bool) -> list[torch.profiler.ProfilerActivity]:
    return [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])


class NullLog:
    """The run logger train_policy is given: nothing is logged while it is timed."""

    def scalars(self, stats, step):
        pass

    def samples(self, rows, step):
        pass


def ppo_report(args, t: Task, timed_recs: list[dict], flops: dict, name: str, gpu: str | None) -> dict:
    """The medians of the timed updates against the model FLOPs, printed, and the result JSON's figures."""
    B, Q, T = t.cfg.ppo.batch_size, t.cfg.task.query_length, t.cfg.task.response_length
    device, dtype = t.device, t.dtype
    phases = ["generation", "rollout_forward", "scoring", "optimization", "total"]
    per_update = {k: statistics.median(r.get(k, 0.0) for r in timed_recs) for k in phases}
    eps = B / per_update["total"]
    peak = args.peak_tflops or next((v for k, v in BF16_PEAK_TFLOPS.items() if gpu and k in gpu), None)
    achieved = flops["total"] / per_update["total"] / 1e12
    res = {
        "device": gpu or "cpu", "model": name, "batch": B, "query_len": Q, "response_len": T,
        "noptepochs": args.noptepochs, "nminibatches": args.nminibatches, "dtype": str(dtype).removeprefix("torch."),
        "sampler": dict(zip(("static", "compiled"), sampler_mode(args.kv_cache, args.compile, device), strict=True)),
        "updates_timed": len(timed_recs), "episodes_per_s": eps, "seconds_per_update": per_update,
        "phase_episodes_per_s": {k: B / v for k, v in per_update.items() if v > 0},
        "model_tflop_per_update": {k: v / 1e12 for k, v in flops.items()},
        "decode_attention": args.decode_attention,
        "achieved_tflops": achieved, "bf16_peak_tflops": peak, "mfu": achieved / peak if peak else None,
        "projected_1M_episodes_min": 1e6 / eps / 60, "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }  # fmt: skip
    print(f"\nPPO, median of {len(timed_recs)} updates after {args.warmup} warm-up: {eps:,.1f} episodes/s, "
          f"1M episodes in {res['projected_1M_episodes_min']:.1f} min")
    for k in phases[:-1]:
        print(f"  {k:16s} {per_update[k]:8.3f} s/update  {100 * per_update[k] / per_update['total']:5.1f}%  "
              f"{flops[k] / 1e12:8.2f} TFLOP")
    print(f"  achieved {achieved:.2f} TFLOP/s" + (f", MFU {res['mfu']:.1%} of {peak:.0f}" if peak else ""))
    return res


def sampler_comparison(args, model, tok, q, cfg, device, dtype) -> dict:
    """The sampler alone in each mode, and Hugging Face generate on the same model and batch: sequences/s."""
    cuda = device.type == "cuda"
    B, T, temp = q.shape[0], cfg.task.response_length, cfg.task.temperature

    def bench(fn) -> float:
        fn()  # warm-up (compiles where asked)
        times = []
        for _ in range(args.sampler_reps):
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return B / statistics.median(times)

    gen = torch.Generator(device=device).manual_seed(0)
    modes = {"dynamic": ("dynamic", "off"), "static": ("static", "off")}
    if cuda or args.compile == "on":  # on the CPU a compile takes minutes: only when asked
        modes["static+compiled"] = ("static", "on")
    out = {}
    for label, (cache, comp) in modes.items():
        with autocast(device, dtype):
            out[label] = bench(lambda c=cache, m=comp: sample(model, q, T, temp, len(tok), gen, cache=c, compile=m))
    gcfg = dict(do_sample=True, temperature=temp, top_k=0, top_p=1.0, max_new_tokens=T, min_new_tokens=T,
                eos_token_id=None, pad_token_id=0)  # fmt: skip
    mask = torch.ones_like(q)
    with torch.no_grad(), autocast(device, dtype):
        out["hf_generate"] = bench(lambda: model.generate(input_ids=q, attention_mask=mask, **gcfg))
        out["hf_generate_static"] = bench(lambda: model.generate(input_ids=q, attention_mask=mask,
                                                                 cache_implementation="static", **gcfg))  # fmt: skip
    print(f"\nsampling alone, batch {B}, {T} tokens (sequences/s, median of {args.sampler_reps}):")
    for k, v in out.items():
        print(f"  {k:20s} {v:10,.1f}   {v / out['hf_generate']:5.2f}x HF generate")
    return out


def sampler_profile(model, tok, q, cfg, device, dtype) -> None:
    """One sampler call under torch.profiler: the kernels' summed time beside the call's wall time tells whether
    the decode loop is bound by the GPU or by launching work on it."""
    cuda = device.type == "cuda"
    T, temp = cfg.task.response_length, cfg.task.temperature
    gen = torch.Generator(device=device).manual_seed(0)
    comp = "on" if cuda else "off"

    def call():
        with autocast(device, dtype):
            sample(model, q, T, temp, len(tok), gen, cache="static", compile=comp)
        if cuda:
            torch.cuda.synchronize(device)

    call()
    acts = profiler_activities(cuda)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        call()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6 if cuda else float("nan")
    print(f"\none sampler call (batch {q.shape[0]}, {T} tokens, static cache, compile {comp}): wall {wall:.4f} s "
          f"under the profiler, kernels {busy:.4f} s ({busy / wall:.0%} busy)")
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(events.table(sort_by=key, row_limit=20))


if __name__ == "__main__":
    sys.exit(run_main(main))
