"""ppo_throughput.py's lmprefs worker: one measurement of lmprefs' PPO in this process (`--worker lmprefs`), timed per
phase as the anchor times TRL's, returned as the dict the orchestrator reads from the worker's stdout."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from _common import source_fingerprint
from _exact_cpu import exact_cpu
from torch.utils.flop_counter import FlopCounterMode

# lmprefs internals the worker uses, all in this block
import lmprefs
from lmprefs.config import Config, PPOConfig, RewardsConfig, RunConfig, TaskConfig
from lmprefs.data.queries import QueryStream
from lmprefs.data.tasks import TaskContext
from lmprefs.models.loading import load_lm
from lmprefs.pipeline.policy import policy_for
from lmprefs.pipeline.task import Task
from lmprefs.runtime.device import setup_torch
from lmprefs.training import policy as P
from lmprefs.training import rollout as RO  # its sample and ref_logprobs are timed, not a frozen_prefix of its own
from lmprefs.training.policy_run import build_run

PHASE_KEYS = ("total_s", "generation_s", "rollout_forward_s", "scoring_s", "optimization_s")
METRIC_KEYS = ("objective/score", "objective/kl", "ppo/loss/policy", "ppo/loss/value", "ppo/policy/approxkl")


def char_frac(target: str):
    """The anchor's default reward: fraction of `target` characters in each decoded response. lmprefs' text rewards
    take the query texts too (text_score_fn calls fn(responses, queries)); this one ignores them, as the anchor's."""

    def fn(texts: list[str], queries: list[str]) -> list[float]:
        return [t.count(target) / max(len(t), 1) for t in texts]

    return fn


class _NullLog:
    """What train_policy needs of a RunLogger, without files (the anchor runs TRL with report_to=none)."""

    def scalars(self, stats, step):
        pass

    def samples(self, rows, step):
        pass


def anchor_queries(common, tok, args) -> list[list[int]]:
    """The anchor's queries (_anchor_common.make_queries: the same seed, so the same as TRL's), kept in --out-dir:
    they tokenize 2 MB of text, seconds with a slow tokenizer, once per invocation instead of once per run."""
    n = args.steps * args.batch_size + args.batch_size
    key = f"{Path(args.model_dir).resolve()}|{n}|{args.query_len}|{args.seed}".encode()
    path = Path(args.out_dir) / f"queries-{hashlib.sha1(key).hexdigest()[:12]}.json"
    if path.exists():
        return json.loads(path.read_text())
    q = common.make_queries(tok, n, args.query_len, seed=args.seed)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(q))
    tmp.replace(path)
    return q


def worker_config(args, steps: int) -> Config:
    """lmprefs' config with the anchor's settings, for `steps` updates."""
    B = args.batch_size
    return Config(
        task=TaskConfig(
            query_dataset="bundled",
            query_length=args.query_len,
            response_length=args.response_len,
            start_text=None,
            end_text=None,
            truncate_token=None,
            temperature=args.temperature,
            initial_model=args.model_dir,
        ),
        rewards=RewardsConfig(kl_coef=0.05, kl_target=None),  # TRL's PPOConfig default: fixed 0.05
        ppo=PPOConfig(
            total_episodes=B * steps,
            batch_size=B,
            nminibatches=args.minibatches,
            noptepochs=args.ppo_epochs,
            lr=args.lr,
            value_model=args.value_model,
            score_drop_stop=None,
        ),
        run=RunConfig(
            seed=args.seed,
            device="cpu",
            dtype=args.dtype,
            threads=args.threads,
            log_interval=10**9,
            save_interval=10**9,
        ),
    )


def timed(cur: dict[str, float], name_fn: Callable[..., str], fn: Callable) -> Callable:
    """fn, adding its seconds to cur[name_fn(same arguments)] and marking the call in torch.profiler's trace."""

    def wrapper(*a, **k):
        name = name_fn(*a, **k)
        t0 = time.perf_counter()
        with torch.profiler.record_function("lmprefs::" + name):
            try:
                return fn(*a, **k)
            finally:
                cur[name] += time.perf_counter() - t0

    return wrapper


def install_timers(cur: dict[str, float], policy, run, score_fn: Callable) -> tuple[Callable, Callable]:
    """Phase timers: wrap what the loop calls, as the anchor wraps TRL's helpers. Returns the timed score_fn and
    torch.Tensor.backward as it was, to put back after the training call."""
    RO.sample = timed(cur, lambda *a, **k: "sample", RO.sample)
    RO.ref_logprobs = timed(cur, lambda *a, **k: "rollout_ref_fwd", RO.ref_logprobs)
    P.ppo_update = timed(cur, lambda *a, **k: "ppo_update", P.ppo_update)
    score_fn = timed(cur, lambda *a, **k: "score", score_fn)
    policy.forward = timed(
        cur, lambda *a, **k: "ppo_train_fwd" if torch.is_grad_enabled() else "rollout_policy_fwd", policy.forward
    )
    if hasattr(policy, "values_from"):  # newer lmprefs: rollout values from the sampler's hidden states
        policy.values_from = timed(cur, lambda *a, **k: "rollout_policy_fwd", policy.values_from)
    run.optimizer.step = timed(cur, lambda *a, **k: "ppo_optimizer_step", run.optimizer.step)
    orig_backward = torch.Tensor.backward
    torch.Tensor.backward = timed(cur, lambda *a, **k: "ppo_backward", orig_backward)  # type: ignore[method-assign]
    return score_fn, orig_backward


class UpdateRecorder:
    """train_policy's on_update: each update's seconds in all and per phase, the last update's stats and, with
    --profile-update, the FLOPs of the warm-up update and a torch.profiler trace of the last update."""

    def __init__(self, profile: bool, steps: int) -> None:
        self.profile, self.steps = profile, steps
        self.cur: dict[str, float] = defaultdict(float)
        self.updates: list[dict] = []
        self.last_stats: dict = {}
        self.flops: FlopCounterMode | None = None
        self.gflop: float | None = None
        self.prof: torch.profiler.profile | None = None
        self.mark = 0.0

    def count_flops(self) -> None:
        """Count the FLOPs of the warm-up update (excluded from timing anyway)."""
        self.flops = FlopCounterMode(display=False)
        self.flops.__enter__()

    def __call__(self, r, stats) -> None:
        now = time.perf_counter()
        self.updates.append({"total_s": now - self.mark, **self.cur})
        self.cur.clear()
        self.last_stats.update(stats)
        if self.profile:
            if r.update == 1 and self.flops is not None:
                self.flops.__exit__(None, None, None)
                self.gflop = self.flops.get_total_flops() / 1e9
            if r.update == self.steps - 1:  # profile the next (last) update
                self.prof = prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                prof.start()
            elif self.prof is not None:
                self.prof.stop()
        self.mark = time.perf_counter()


def update_phases(rec: dict) -> dict:
    """One update's seconds split as the anchor splits TRL's: generation, rollout forwards, scoring, the rest."""
    rollout_fwd = rec.get("rollout_policy_fwd", 0.0) + rec.get("rollout_ref_fwd", 0.0)
    gen, scoring = rec.get("sample", 0.0), rec.get("score", 0.0)
    return {
        "total_s": rec["total_s"],
        "generation_s": gen,
        "rollout_forward_s": rollout_fwd,
        "scoring_s": scoring,
        "optimization_s": rec["total_s"] - gen - rollout_fwd - scoring,
        "detail": {k: round(v, 4) for k, v in rec.items() if k != "total_s"},
    }


def timing_record(args, per: list[dict]) -> dict:
    """Episodes/s and mean seconds per phase over the timed updates, and every update's total."""
    timed_steps = per[1 : args.steps]  # warm-up excluded; a profiled update (if any) is not in the average
    n = len(timed_steps)
    eps = args.batch_size * n / sum(s["total_s"] for s in timed_steps)
    return {
        "episodes_per_sec": round(eps, 3),
        "sec_per_step_mean": {k: round(sum(s[k] for s in timed_steps) / n, 4) for k in PHASE_KEYS},
        "detail_mean": {
            k: round(sum(s["detail"].get(k, 0.0) for s in timed_steps) / n, 4)
            for k in sorted({k for s in timed_steps for k in s["detail"]})
        },
        "warmup_step_s": round(per[0]["total_s"], 4),
        "per_step_total_s": [round(s["total_s"], 4) for s in per],
    }


def model_record(args, common, model, policy, dtype) -> dict:
    n_params = sum(p.numel() for p in policy.parameters())
    return {
        **common.model_info(model),
        "dir": args.model_dir,
        "policy_params_M": round(n_params / 1e6, 3),
        "value_model": args.value_model,
        "param_dtype": str(next(policy.parameters()).dtype),
        "autocast_dtype": str(dtype),
    }


def profile_record(args, recorder: UpdateRecorder, prof_update: dict) -> dict:
    prof = recorder.prof
    assert prof is not None  # --profile-update: the last update was profiled
    return {
        "update_s": round(prof_update["total_s"], 4),
        "gflop": round(recorder.gflop or 0.0, 2),
        "phases": prof_update["detail"],
        "table": prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=args.profile_top, max_name_column_width=48
        ),
        "phase_table": prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=48),
    }


def lmprefs_worker(args) -> dict:
    sys.path.insert(0, args.anchor_dir)
    import _anchor_common as common

    src = source_fingerprint()
    steps = args.steps + (1 if args.profile_update else 0)
    cfg = worker_config(args, steps)
    t_setup = time.perf_counter()
    device, dtype = setup_torch(cfg.run)
    torch.manual_seed(args.seed)
    model, tok = load_lm(args.model_dir, device)
    queries = torch.tensor(anchor_queries(common, tok, args))[: steps * args.batch_size]
    t = Task(cfg, device, dtype, model, tok, queries, queries[:0], [], [])
    policy = policy_for(t)
    run = build_run(cfg, policy, QueryStream(queries, cfg.run.seed), device)
    score_fn = RO.text_score_fn(char_frac("e"), tok)
    setup_s = time.perf_counter() - t_setup

    recorder = UpdateRecorder(args.profile_update, steps)
    score_fn, orig_backward = install_timers(recorder.cur, policy, run, score_fn)
    run_dir = Path(args.out_dir) / f"lmprefs-{args.value_model}-{os.getpid()}"
    if args.profile_update:
        recorder.count_flops()
    exact_cpu(common)
    mon = common.CpuMonitor().start()
    recorder.mark = time.perf_counter()
    t0 = time.perf_counter()
    P.train_policy(cfg, run, score_fn, _NullLog(), run_dir, TaskContext([], [], device, dtype), on_update=recorder)
    train_s = time.perf_counter() - t0
    cpu = mon.stop()
    torch.Tensor.backward = orig_backward  # type: ignore[method-assign]

    per = [update_phases(u) for u in recorder.updates]
    res = {
        "bench": f"lmprefs_ppo[{args.value_model}]",
        "versions": {**common.versions(), "lmprefs": getattr(lmprefs, "__version__", "?")},
        "lmprefs_source": src,
        "lmprefs_source_end": source_fingerprint(),
        "model": model_record(args, common, model, policy, dtype),
        **timing_record(args, per),
        "setup_s": round(setup_s, 3),
        "train_wall_s": round(train_s, 3),
        "last_metrics": {k: recorder.last_stats.get(k) for k in METRIC_KEYS},
        "peak_rss_mib": round(common.peak_rss_mib(), 1),
        "cpu_during_train": cpu,
    }
    if args.profile_update:
        res["profile"] = profile_record(args, recorder, per[-1])
    return res
