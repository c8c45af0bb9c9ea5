#!/usr/bin/env python
"""PPO throughput: lmprefs against Hugging Face TRL's PPO on the same model, settings and machine, in one invocation.

What is measured
  Episodes per second of PPO updates (rollout + optimisation), for
    * TRL 1.12's PPOTrainer, via the speed anchor ../shared/bench/trl_ppo_bench.py run with the anchor venv's python
      (.venv-anchor; see ../shared/bench/README.md for its set-up), and
    * lmprefs' real training loop, `lmprefs.training.policy.train_policy` (build_run + make_rollout + ppo_update,
      KL controller, LR decay, andon checks), once with the defaults (`ppo.value_model=shared`: a value head on the
      policy trunk) and once with `ppo.value_model=separate` (its own trunk, like TRL's value model).
  Both sides load the SAME model directory: the anchor's random 5.3M-parameter GPT-2 (4 layers, 4 heads, 256 dims,
  8,192-token byte-level BPE) built by _anchor_common.ensure_model, and the same 32-token queries
  (_anchor_common.make_queries, same seed). Settings as the anchor: batch 64, query 32, response 24, 4 PPO epochs x
  4 minibatches (16 optimizer steps per batch), temperature 0.7, lr 1e-5, 2 threads, fp32 (lmprefs run.dtype=float32,
  TRL bf16 off; with --dtype bfloat16 both sides in bf16: lmprefs run.dtype=bfloat16, TRL --bf16), no truncation
  (TRL stop_token None; lmprefs task.truncate_token None). The reward is the anchor's
  default cheap text reward, the fraction of 'e' characters in the decoded response (TRL: wrapped as a pseudo reward
  model; lmprefs: `text_score_fn`). The first update of each run is warm-up and excluded, as the anchor does:
  episodes/s = batch * (steps - 1) / (sum of the other updates' seconds).
  Per CPU-second: batch * steps / (CPU seconds the process spent in its training call, warm-up update included, the
  same window on both sides): a figure that a loaded machine changes far less than wall time, so the ratio of these
  is the fair one when other work shares the cores.

How
  Each measurement is its own subprocess (fresh process, same interpreter settings). With --reps R the script runs R
  rounds of [TRL, lmprefs shared, lmprefs separate], rotating the order every round, and reports per-round ratios
  (TRL measured in the same round) and medians. Loads are shared: it prints os.getloadavg() before and after and, for
  every run, the cores used by other processes during the timed region (other_cores_avg; ~0 means a clean number).
  Before each run it waits (up to --max-wait s) until fewer than --idle-threshold cores are busy, and it redoes a run
  whose timed region had more than --max-other foreign cores (up to --retries times; a run that stays contaminated is
  flagged and left out of the medians when clean runs exist). On 2 cores, one foreign busy core slows lmprefs ~10x.

  --profile adds one profiled lmprefs update per mode (after a warm-up): seconds per phase (sampling, rollout policy
  forward, reference forward, scoring, PPO train forwards / backward / optimizer steps / rest), torch.profiler's
  top operators by self CPU time, and the update's FLOPs (torch FlopCounterMode over the warm-up update), next to a
  matmul FLOP model of TRL's and lmprefs' updates.

Writes only under --out-dir (default: a new temporary directory): the model directory (unless --model-dir is given),
lmprefs' run directories, TRL's output (its subprocess gets TMPDIR=<out-dir>/tmp) and results.json.

  --anchor-result FILE takes TRL's side from a result the anchor printed earlier (e.g. run_anchors.py's
  ppo_repN.json) instead of running TRL: the settings and model shape must match; its ratios are then against a run
  made at another time.

Example
  export LMPREFS_CACHE=/tmp/lmcache
  python benchmarks/ppo_throughput.py --reps 3 --profile
  # the script itself in seconds (as tests/test_benchmarks.py runs it): lmprefs' tiny-gpt2 asset, a saved anchor
  python benchmarks/ppo_throughput.py --model-dir tiny-gpt2 --anchor-result anchor.json --batch-size 4 \
      --query-len 8 --response-len 4 --steps 2 --ppo-epochs 1 --minibatches 1 --threads 1 --reps 1 --max-wait 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ANCHOR_DIR = REPO.parent / "shared" / "bench"
DEFAULT_ANCHOR_PYTHON = REPO / ".venv-anchor" / "bin" / "python"
MODES = ("shared", "separate")
# what an anchor result must have been measured with for a ratio against it to mean anything
ANCHOR_SETTINGS = ("batch_size", "query_len", "response_len", "ppo_epochs", "minibatches", "temperature")
ANCHOR_SHAPE = ("n_layer", "n_head", "n_embd", "vocab_size")

from _common import ArgumentParser, nonnegative_int, positive_int, source_fingerprint  # noqa: E402

# lmprefs internals this script uses, all in this block
import lmprefs  # noqa: E402
from lmprefs.assets.models import MODEL_ASSETS, resolve_model  # noqa: E402
from lmprefs.config import Config, PPOConfig, RewardsConfig, RunConfig, TaskConfig  # noqa: E402
from lmprefs.data.queries import QueryStream  # noqa: E402
from lmprefs.data.tasks import TaskContext  # noqa: E402
from lmprefs.models.loading import load_lm  # noqa: E402
from lmprefs.pipeline.policy import policy_for  # noqa: E402
from lmprefs.pipeline.task import Task  # noqa: E402
from lmprefs.runtime.device import setup_torch  # noqa: E402
from lmprefs.training import policy as P  # noqa: E402
from lmprefs.training import rollout as RO  # noqa: E402 (sample, ref_logprobs, frozen_prefix are timed there)
from lmprefs.training.policy_run import build_run  # noqa: E402


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default=None, help="where everything is written (default: a new temp dir)")
    p.add_argument(
        "--model-dir",
        default=None,
        help="anchor model directory to use (created if absent; default <out-dir>/anchor-model), or an lmprefs "
        f"model asset ({', '.join(MODEL_ASSETS)}; tiny-gpt2 for a quick check of the script itself)",
    )
    p.add_argument("--anchor-dir", default=str(DEFAULT_ANCHOR_DIR), help="folder of trl_ppo_bench.py")
    p.add_argument("--anchor-python", default=str(DEFAULT_ANCHOR_PYTHON), help="python of the TRL venv")
    p.add_argument(
        "--anchor-result",
        default=None,
        metavar="JSON",
        help="take TRL's side from this file (one JSON object as trl_ppo_bench.py prints it, e.g. run_anchors.py's "
        "ppo_repN.json) instead of running TRL; it must have been measured with the same settings and model shape. "
        "Its ratios compare against a run made at another time, not in the same round",
    )
    p.add_argument("--reps", type=nonnegative_int, default=3,
                   help="rounds of [TRL, lmprefs modes], order rotated per round")  # fmt: skip
    p.add_argument("--modes", default="shared,separate", help="lmprefs value-model modes to time")
    p.add_argument("--skip-trl", action="store_true", help="time lmprefs only (no ratios)")
    p.add_argument("--profile", action="store_true", help="also print a profile of one lmprefs update per mode")
    p.add_argument("--profile-top", type=positive_int, default=15, help="operators listed per profile")
    p.add_argument(
        "--steps", type=positive_int, default=5, help="PPO updates per run (at least 2); the first is warm-up"
    )
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--query-len", type=positive_int, default=32)
    p.add_argument("--response-len", type=positive_int, default=24)
    p.add_argument("--ppo-epochs", type=positive_int, default=4)
    p.add_argument("--minibatches", type=positive_int, default=4)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the autocast dtype of both sides: lmprefs' run.dtype and, for bfloat16, TRL's --bf16 "
                   "(an --anchor-result must have been measured with the same)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=positive_int, default=1800, help="seconds allowed per subprocess")
    p.add_argument(
        "--idle-threshold",
        type=float,
        default=0.5,
        help="before each run, wait until fewer than this many cores are busy (measured over 3 s)",
    )
    p.add_argument("--max-wait", type=float, default=240,
                   help="seconds to wait for that before running anyway; 0: run at once (busy cores measured over "
                   "0.5 s)")  # fmt: skip
    p.add_argument(
        "--max-other",
        type=float,
        default=0.15,
        help="a run during whose timed region other processes used more cores than this is redone",
    )
    p.add_argument("--retries", type=nonnegative_int, default=3, help="redo a contaminated run at most this often")
    # internal: one lmprefs measurement in this process, JSON on stdout
    p.add_argument("--worker", choices=("lmprefs",), help=argparse.SUPPRESS)
    p.add_argument("--value-model", choices=MODES, default="shared", help=argparse.SUPPRESS)
    p.add_argument("--profile-update", action="store_true", help=argparse.SUPPRESS)
    return p


def parse_args(argv=None, p: ArgumentParser | None = None):
    p = p or build_parser()
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2 (the first update is warm-up, left out of the timing)")
    if args.batch_size % args.minibatches:
        p.error(f"--batch-size {args.batch_size} is not a multiple of --minibatches {args.minibatches}")
    for flag in ("temperature", "lr"):
        if not getattr(args, flag) > 0:
            p.error(f"--{flag} must be positive, not {getattr(args, flag)}")
    if any(m not in MODES for m in args.modes.split(",") if m) or not args.modes.strip(","):
        p.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    if args.skip_trl and args.anchor_result:
        p.error("--skip-trl and --anchor-result contradict each other")
    args.anchor = None
    if args.anchor_result:
        args.anchor, why = load_anchor_result(args.anchor_result, args)
        if why:
            p.error(f"--anchor-result {why}")
    if args.model_dir in MODEL_ASSETS:  # an asset is built into lmprefs' cache once, offline
        args.model_dir = resolve_model(args.model_dir)
    return args


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> str:
    return "loadavg {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# ----------------------------------------------------------------------------------------------------------------
# worker: lmprefs


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


def lmprefs_worker(args) -> dict:
    import torch

    sys.path.insert(0, args.anchor_dir)
    import _anchor_common as common

    src = source_fingerprint()
    steps = args.steps + (1 if args.profile_update else 0)
    B = args.batch_size
    cfg = Config(
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
    t_setup = time.perf_counter()
    device, dtype = setup_torch(cfg.run)
    torch.manual_seed(args.seed)
    model, tok = load_lm(args.model_dir, device)
    queries = torch.tensor(anchor_queries(common, tok, args))[: steps * B]
    t = Task(cfg, device, dtype, model, tok, queries, queries[:0], [], [])
    policy = policy_for(t)
    run = build_run(cfg, policy, QueryStream(queries, cfg.run.seed), device)
    score_fn = RO.text_score_fn(char_frac("e"), tok)
    setup_s = time.perf_counter() - t_setup

    # ---- phase timers: wrap what the loop calls, as the anchor wraps TRL's helpers ----
    cur: dict[str, float] = defaultdict(float)
    prof_state = {"prof": None}

    def timed(name_fn, fn):
        def wrapper(*a, **k):
            name = name_fn(*a, **k)
            t0 = time.perf_counter()
            with torch.profiler.record_function("lmprefs::" + name):
                try:
                    return fn(*a, **k)
                finally:
                    cur[name] += time.perf_counter() - t0

        return wrapper

    RO.sample = timed(lambda *a, **k: "sample", RO.sample)
    RO.ref_logprobs = timed(lambda *a, **k: "rollout_ref_fwd", RO.ref_logprobs)
    P.ppo_update = timed(lambda *a, **k: "ppo_update", P.ppo_update)
    score_fn = timed(lambda *a, **k: "score", score_fn)
    policy.forward = timed(
        lambda *a, **k: "ppo_train_fwd" if torch.is_grad_enabled() else "rollout_policy_fwd", policy.forward
    )
    if hasattr(policy, "values_from"):  # newer lmprefs: rollout values from the sampler's hidden states
        policy.values_from = timed(lambda *a, **k: "rollout_policy_fwd", policy.values_from)
    run.optimizer.step = timed(lambda *a, **k: "ppo_optimizer_step", run.optimizer.step)
    orig_backward = torch.Tensor.backward
    torch.Tensor.backward = timed(lambda *a, **k: "ppo_backward", orig_backward)

    updates: list[dict] = []
    mark = {"t": None}
    last_stats: dict = {}

    def on_update(r, stats):
        now = time.perf_counter()
        rec = {"total_s": now - mark["t"], **cur}
        updates.append(rec)
        cur.clear()
        last_stats.update(stats)
        if args.profile_update:
            if r.update == 1 and prof_state.get("flops") is not None:
                prof_state["flops"].__exit__(None, None, None)
                prof_state["gflop"] = prof_state["flops"].get_total_flops() / 1e9
            if r.update == steps - 1:  # profile the next (last) update
                prof_state["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                prof_state["prof"].start()
            elif prof_state["prof"] is not None:
                prof_state["prof"].stop()
        mark["t"] = time.perf_counter()

    run_dir = Path(args.out_dir) / f"lmprefs-{args.value_model}-{os.getpid()}"
    if args.profile_update:  # count the FLOPs of the warm-up update (excluded from timing anyway)
        from torch.utils.flop_counter import FlopCounterMode

        prof_state["flops"] = FlopCounterMode(display=False)
        prof_state["flops"].__enter__()
    mon = common.CpuMonitor().start()
    mark["t"] = time.perf_counter()
    t0 = time.perf_counter()
    P.train_policy(cfg, run, score_fn, _NullLog(), run_dir, TaskContext([], [], device, dtype), on_update=on_update)
    train_s = time.perf_counter() - t0
    cpu = mon.stop()
    torch.Tensor.backward = orig_backward

    def phase(rec):
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

    per = [phase(r) for r in updates]
    timed_steps = per[1 : args.steps]  # warm-up excluded; a profiled update (if any) is not in the average
    n = len(timed_steps)
    eps = B * n / sum(s["total_s"] for s in timed_steps)
    n_params = sum(p.numel() for p in policy.parameters())
    res = {
        "bench": f"lmprefs_ppo[{args.value_model}]",
        "versions": {**common.versions(), "lmprefs": getattr(lmprefs, "__version__", "?")},
        "lmprefs_source": src,
        "lmprefs_source_end": source_fingerprint(),
        "model": {
            **common.model_info(model),
            "dir": args.model_dir,
            "policy_params_M": round(n_params / 1e6, 3),
            "value_model": args.value_model,
            "param_dtype": str(next(policy.parameters()).dtype),
            "autocast_dtype": str(dtype),
        },
        "episodes_per_sec": round(eps, 3),
        "sec_per_step_mean": {
            k: round(sum(s[k] for s in timed_steps) / n, 4)
            for k in ("total_s", "generation_s", "rollout_forward_s", "scoring_s", "optimization_s")
        },
        "detail_mean": {
            k: round(sum(s["detail"].get(k, 0.0) for s in timed_steps) / n, 4)
            for k in sorted({k for s in timed_steps for k in s["detail"]})
        },
        "warmup_step_s": round(per[0]["total_s"], 4),
        "per_step_total_s": [round(s["total_s"], 4) for s in per],
        "setup_s": round(setup_s, 3),
        "train_wall_s": round(train_s, 3),
        "last_metrics": {
            k: last_stats.get(k)
            for k in ("objective/score", "objective/kl", "ppo/loss/policy", "ppo/loss/value", "ppo/policy/approxkl")
        },
        "peak_rss_mib": round(common.peak_rss_mib(), 1),
        "cpu_during_train": cpu,
    }
    if args.profile_update:
        prof = prof_state["prof"]
        prof_rec = per[-1]
        res["profile"] = {
            "update_s": round(prof_rec["total_s"], 4),
            "gflop": round(prof_state.get("gflop") or 0.0, 2),
            "phases": prof_rec["detail"],
            "table": prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=args.profile_top, max_name_column_width=48
            ),
            "phase_table": prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=48),
        }
    return res


# ----------------------------------------------------------------------------------------------------------------
# orchestrator


def busy_cores(window: float = 3.0) -> float:
    """Cores busy system-wide over `window` seconds (this script sleeps meanwhile), from /proc/stat."""

    def jiffies():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v[:8]) - v[3] - v[4]

    b0 = jiffies()
    time.sleep(window)
    return (jiffies() - b0) / os.sysconf("SC_CLK_TCK") / window


def wait_idle(threshold: float, max_wait: float) -> float:
    if max_wait <= 0:  # run at once; still say how busy the machine was
        return busy_cores(0.5)
    t0 = time.time()
    while True:
        busy = busy_cores()
        if busy <= threshold or time.time() - t0 > max_wait:
            return busy
        log(f"machine busy ({busy:.2f} cores in use by others), waiting ...")


def run_json(
    cmd: list[str], env: dict, timeout: int, label: str, idle=(0.5, 240.0), max_other: float = 0.15, retries: int = 3
) -> dict | None:
    """Run one measurement subprocess (JSON on its stdout); redo it while other processes took more than
    `max_other` cores during its timed region (at most `retries` times; the last attempt is kept, flagged)."""
    res = None
    for attempt in range(retries + 1):
        busy = wait_idle(*idle)
        log(f"{label}: {' '.join(cmd[:2])} ... (busy cores before {busy:.2f}, {loadavg()})")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            log(f"{label} FAILED (rc {p.returncode}); stderr tail:\n{p.stderr[-3000:]}")
            return None
        try:
            res = json.loads(p.stdout)
        except json.JSONDecodeError:
            log(f"{label}: no JSON on stdout; stdout tail:\n{p.stdout[-2000:]}\nstderr tail:\n{p.stderr[-2000:]}")
            return None
        res["busy_cores_before"] = round(busy, 2)
        res["attempt"] = attempt + 1
        other = res.get("cpu_during_train", {}).get("other_cores_avg", 0.0)
        log(
            f"{label}: {res['episodes_per_sec']:.3f} episodes/s (wall {time.perf_counter() - t0:.0f}s, "
            f"other_cores_avg {other}, {loadavg()})"
        )
        if other <= max_other:
            return res
        if attempt < retries:
            log(f"{label}: other processes used {other} cores during the timed region; redoing")
    res["contaminated"] = True
    return res


def model_shape(model_dir: Path) -> dict:
    """n_layer, n_head, n_embd, vocab_size of a model directory (GPT-2's names; others' mapped), as far as known."""
    c = json.loads((model_dir / "config.json").read_text())
    names = {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads", "n_embd": "hidden_size"}
    return {k: c.get(k, c.get(names.get(k, k))) for k in ANCHOR_SHAPE}


def load_anchor_result(path: str, args) -> tuple[dict | None, str | None]:
    """TRL's result read from a file, or (None, why it cannot stand beside this run's settings)."""
    try:
        r = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        return None, f"cannot read {path}: {e}"
    if (
        not isinstance(r, dict)
        or not all(k in r for k in ("episodes_per_sec", "config", "sec_per_step_mean"))
        or (not isinstance(r["config"], dict))
    ):
        return None, f"{path} is not a trl_ppo_bench.py result (episodes_per_sec, config, sec_per_step_mean)"
    if not isinstance(r["episodes_per_sec"], (int, float)) or not r["episodes_per_sec"] > 0:
        return None, f"{path}: episodes_per_sec {r['episodes_per_sec']!r} is not a positive number"
    for k in ANCHOR_SETTINGS:
        if r["config"].get(k) != getattr(args, k):
            return None, f"{path} was measured with {k} {r['config'].get(k)}, this run uses {getattr(args, k)}"
    if bool(r["config"].get("bf16")) != (args.dtype == "bfloat16"):
        bf16 = bool(r["config"].get("bf16"))
        return None, f"{path} was measured with bf16 {bf16}, this run uses --dtype {args.dtype}"
    r.setdefault("per_step", [])
    r.setdefault("cpu_during_train", {})
    r["from_file"] = str(path)
    return r, None


def flop_model(args, n_layer: int = 4, d: int = 256, V: int = 8192) -> dict:
    """Matmul GFLOP per update of TRL's PPO and of lmprefs' (current code), for a GPT-2 of this shape (by default the
    anchor model's)."""
    B, Q, T, E = args.batch_size, args.query_len, args.response_len, args.ppo_epochs
    Ft, Fh = 24 * n_layer * d * d, 2 * d * V
    L = Q + T
    gen = B * (L - 1) * Ft + B * T * Fh  # prefill + T-1 cached steps, head on the T sampling positions
    trl = gen + B * L * (Ft + Fh) + B * L * Ft + 3 * E * B * L * (2 * Ft + Fh)
    shared = gen + B * (L * Ft + T * Fh) + 3 * E * B * (L * Ft + T * Fh)
    separate = shared + B * L * Ft + 3 * E * B * L * Ft
    return {"trl": trl / 1e9, "lmprefs shared": shared / 1e9, "lmprefs separate": separate / 1e9}


def fmt_phases(s: dict) -> str:
    keys = ("total_s", "generation_s", "rollout_forward_s", "scoring_s", "optimization_s")
    return (
        "total {:.3f} s = generation {:.3f} + rollout forwards {:.3f} + scoring {:.3f} + optimization {:.3f}".format(
            *(s[k] for k in keys)
        )
    )


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def eps_per_cpu_second(r: dict | None, args) -> float | None:
    """Episodes per CPU-second of a run's training call (warm-up included), from its CpuMonitor record: the
    process's own cores times the call's wall seconds."""
    cpu = (r or {}).get("cpu_during_train", {})
    own, wall = cpu.get("own_cores_avg"), cpu.get("wall_s")
    if not own or not wall:
        return None
    return args.batch_size * args.steps / (own * wall)


def report_per_cpu_second(args, systems, modes, results, summary) -> None:
    """The same rounds per CPU-second: a ratio that other work on the machine moves far less than wall time."""
    print()
    print("episodes per CPU-second of the training call (warm-up included), per round:")
    per = {s: [eps_per_cpu_second(r, args) for r in results[s]] for s in systems}
    for s in systems:
        cells = ", ".join("n/a" if x is None else f"{x:.3f}" for x in per[s])
        print(f"  {('TRL' if s == 'trl' else 'lmprefs ' + s):>18}: {cells}")
    if "trl" not in systems:
        return
    targets = {"shared": 3.5, "separate": 2.0}
    for m in modes:
        ratios = [a / b for a, b in zip(per[m], per["trl"], strict=True) if a and b]
        if not ratios:
            continue
        r_med = median(ratios)
        summary["ratios"].setdefault(m, {})["per_cpu_second"] = {"per_round": ratios, "median": r_med}
        print(f"lmprefs ({m:>8} value model) / TRL per CPU-second: {r_med:.2f}x (rounds "
              f"{', '.join(f'{x:.2f}' for x in ratios)}) target >= {targets[m]}x: "
              f"{'MET' if r_med >= targets[m] else 'NOT MET'}")  # fmt: skip


def report_throughput(args, systems, modes, results, summary) -> None:
    """Per-round episodes/s, medians, ratios against TRL and the phase split of the median runs."""

    def eps_list(s):
        return [r["episodes_per_sec"] if r else None for r in results[s]]

    print()
    print("episodes/s per round [cores used by other processes during the timed region / busy cores just before]:")
    for s in systems:
        cells = []
        for r in results[s]:
            if r is None:
                cells.append("FAILED")
                continue
            other = r["cpu_during_train"].get("other_cores_avg")
            flag = " CONTAMINATED" if r.get("contaminated") else ""
            cells.append(f"{r['episodes_per_sec']:.3f} [{other}/{r.get('busy_cores_before')}]{flag}")
        print(f"  {('TRL' if s == 'trl' else 'lmprefs ' + s):>18}: " + ", ".join(cells))

    def clean(r):
        return r is not None and not r.get("contaminated")

    any_clean = all(any(clean(r) for r in results[s]) for s in systems)
    use = clean if any_clean else (lambda r: r is not None)
    if not any_clean:
        print("WARNING: some system has no uncontaminated run; the figures below include contaminated runs")
    for s in systems:
        ok = [r["episodes_per_sec"] for r in results[s] if use(r)]
        summary["systems"][s] = {"episodes_per_sec_median": median(ok), "per_round": eps_list(s), "used": len(ok)}
    print()
    targets = {"shared": 3.5, "separate": 2.0}  # per episode, both sides at their best dtype
    for m in modes:
        med = summary["systems"][m]["episodes_per_sec_median"]
        line = f"lmprefs ({m:>8} value model): {med:.3f} episodes/s (median of {summary['systems'][m]['used']})"
        if "trl" in systems:
            ratios = [
                a["episodes_per_sec"] / b["episodes_per_sec"]
                for a, b in zip(results[m], results["trl"], strict=True)
                if use(a) and use(b)
            ]
            trl_med = summary["systems"]["trl"]["episodes_per_sec_median"]
            r_med = median(ratios)
            summary["ratios"][m] = {
                "per_round": ratios,
                "median_of_round_ratios": r_med,
                "ratio_of_medians": med / trl_med,
                "target": targets[m],
            }
            line += (
                f" | TRL {trl_med:.3f} | ratio {r_med:.2f}x (median of per-round ratios "
                f"{', '.join(f'{x:.2f}' for x in ratios) or 'none usable'}; ratio of medians "
                f"{med / trl_med:.2f}x) target >= {targets[m]}x: "
                f"{'MET' if min(r_med, med / trl_med) >= targets[m] else 'NOT MET'}"
            )
        print(line)
    report_per_cpu_second(args, systems, modes, results, summary)
    print()
    print("mean seconds per update (median run of each system):")
    for s in systems:
        ok = [r for r in results[s] if use(r)]
        if not ok:
            continue
        r = sorted(ok, key=lambda r: r["episodes_per_sec"])[len(ok) // 2]
        print(f"  {('TRL' if s == 'trl' else 'lmprefs ' + s):>18}: {fmt_phases(r['sec_per_step_mean'])}")
        if s != "trl":
            print(f"  {'':>18}  detail: {json.dumps(r['detail_mean'])}")
        else:
            d = defaultdict(float)
            for st in r["per_step"][1:]:
                for k, v in st["detail"].items():
                    d[k] += v / (len(r["per_step"]) - 1)
            print(f"  {'':>18}  detail: {json.dumps({k: round(v, 4) for k, v in sorted(d.items())})}")
        print(f"  {'':>18}  last metrics: {json.dumps(r.get('last_metrics'))}")


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(argv, parser)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.worker:
        import contextlib

        with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the JSON result
            res = lmprefs_worker(args)
        print(json.dumps(res, indent=1))
        return 0

    modes = [m for m in args.modes.split(",") if m]
    anchor_py = Path(args.anchor_python)
    if not args.skip_trl and not args.anchor_result and not anchor_py.exists():
        parser.error(f"{anchor_py} not found: create the TRL venv as ../shared/bench/README.md says, or pass "
                     "--anchor-result or --skip-trl")  # fmt: skip
    if not (Path(args.anchor_dir) / "_anchor_common.py").exists():
        parser.error(f"--anchor-dir {args.anchor_dir}: no _anchor_common.py there (the queries and the anchor model "
                     "come from it)")  # fmt: skip
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="ppo-throughput-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "tmp").mkdir(exist_ok=True)
    model_dir = Path(args.model_dir or out / "anchor-model")

    import platform

    import torch
    import transformers

    print(f"# ppo_throughput  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  out={out}")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"cpu_count {os.cpu_count()}, threads {args.threads}, {platform.machine()}"
    )
    load_start = os.getloadavg()
    print(f"machine load before: {loadavg()}")

    sys.path.insert(0, args.anchor_dir)
    import _anchor_common as common

    log(f"model dir {model_dir} (built once if absent)")
    common.ensure_model(str(model_dir))
    shape, anchor = model_shape(model_dir), args.anchor
    for k in ANCHOR_SHAPE if anchor is not None else ():
        theirs = (anchor.get("model") or {}).get(k)
        if theirs is not None and theirs != shape.get(k):
            parser.error(f"--anchor-result {args.anchor_result} was measured on a model with {k} {theirs}; "
                         f"{model_dir} has {shape.get(k)}")  # fmt: skip

    env = dict(os.environ, TMPDIR=str(out / "tmp"))
    shared_flags = [
        "--batch-size",
        str(args.batch_size),
        "--query-len",
        str(args.query_len),
        "--response-len",
        str(args.response_len),
        "--steps",
        str(args.steps),
        "--ppo-epochs",
        str(args.ppo_epochs),
        "--minibatches",
        str(args.minibatches),
        "--temperature",
        str(args.temperature),
        "--lr",
        str(args.lr),
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--model-dir",
        str(model_dir),
    ]
    trl_cmd = [
        str(anchor_py),
        str(Path(args.anchor_dir) / "trl_ppo_bench.py"),
        "--reward",
        "char-frac:e",
        *shared_flags,
        *(["--bf16"] if args.dtype == "bfloat16" else []),
    ]

    def lm_cmd(mode, profile=False):
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "lmprefs",
            "--value-model",
            mode,
            "--out-dir",
            str(out),
            "--anchor-dir",
            args.anchor_dir,
            "--dtype",
            args.dtype,
            *shared_flags,
            *(["--profile-update", "--profile-top", str(args.profile_top), "--steps", "2"] if profile else []),
        ]

    systems = ([] if args.skip_trl else ["trl"]) + modes
    idle = (args.idle_threshold, args.max_wait)
    results: dict[str, list[dict | None]] = {s: [] for s in systems}
    for rep in range(args.reps):
        k = rep % len(systems)
        order = systems[k:] + systems[:k]
        for s in order:
            if s == "trl" and anchor is not None:
                results[s].append(anchor)
                continue
            cmd = trl_cmd if s == "trl" else lm_cmd(s)
            results[s].append(
                run_json(cmd, env, args.timeout, f"rep {rep + 1}/{args.reps} {s}", idle, args.max_other, args.retries)
            )

    profiles = {}
    if args.profile:
        for m in modes:
            profiles[m] = run_json(
                lm_cmd(m, profile=True), env, args.timeout, f"profile {m}", idle, args.max_other, args.retries
            )

    load_end = os.getloadavg()

    # ---------------- report ----------------
    print()
    first = next((r for s in systems for r in results[s] if r), None)
    trl_first = next((r for r in results.get("trl", []) if r), None)
    if trl_first:
        print(f"TRL side: {trl_first.get('ppo_trainer')} versions {json.dumps(trl_first.get('versions'))}")
    if anchor is not None:
        print(
            f"TRL side read from {args.anchor_result} (not measured in this invocation: its ratios compare runs made "
            "at different times)"
        )
    if first and "lmprefs" in first.get("versions", {}):
        print(f"lmprefs side: versions {json.dumps(first['versions'])}")
    if first:
        print(f"model: {json.dumps(first['model'])}")
    srcs = {
        json.dumps(r[k])
        for s in systems
        if s != "trl"
        for r in results[s]
        if r
        for k in ("lmprefs_source", "lmprefs_source_end")
    }
    srcs |= {json.dumps(pr[k]) for pr in profiles.values() if pr for k in ("lmprefs_source", "lmprefs_source_end")}
    print(
        f"lmprefs source (sha1 of lmprefs/**/*.py): {', '.join(sorted(srcs))}"
        + ("  WARNING: the package changed during this benchmark" if len(srcs) > 1 else "")
    )
    print(
        f"settings: batch {args.batch_size}, query {args.query_len}, response {args.response_len}, "
        f"{args.ppo_epochs} epochs x {args.minibatches} minibatches, T {args.temperature}, lr {args.lr}, "
        f"{args.threads} threads, both sides "
        f"{'fp32' if args.dtype == 'float32' else 'bf16 (TRL --bf16, lmprefs autocast)'}, "
        f"reward char-frac:e, {args.steps} updates/run (first = warm-up, excluded)"
    )
    summary: dict = {"systems": {}, "ratios": {}}
    if args.reps > 0:
        report_throughput(args, systems, modes, results, summary)
    else:
        print("(--reps 0: no throughput rounds)")
    fm = None
    if all(isinstance(shape.get(k), int) for k in ("n_layer", "n_embd", "vocab_size")):  # a GPT-2-like config
        fm = flop_model(args, shape["n_layer"], shape["n_embd"], shape["vocab_size"])
        print()
        print(
            "FLOP model per update (matmuls only; per token Ft = 24*n_layer*d^2, LM head Fh = 2*d*V per position; "
            "training = 3x forward):"
        )
        for k, v in fm.items():
            ceiling = f", TRL/this = {fm['trl'] / v:.2f}x" if k != "trl" else ""
            print(f"  {k:>18}: {v:8.2f} GFLOP{ceiling}")
        print(
            "  (TRL: full-sequence logits and a separate critic trunk in every train forward, reference logits over "
            "the whole sequence; lmprefs: LM head only at the response positions, values from the sampler's hidden "
            "states)"
        )
    summary["flop_model_gflop"] = fm

    if profiles:
        print()
        for m, pr in profiles.items():
            if not pr:
                print(f"profile {m}: FAILED")
                continue
            pf = pr["profile"]
            ph = pf["phases"]
            print(
                f"== profile of one lmprefs update, value_model={m} (torch.profiler on; "
                f"{pf['update_s']:.3f} s with profiler, {pr['sec_per_step_mean']['total_s']:.3f} s mean "
                f"unprofiled in the same run) =="
            )
            opt_parts = ("ppo_train_fwd", "ppo_backward", "ppo_optimizer_step")
            n_opt = args.ppo_epochs * args.minibatches
            rows = [
                (f"sampling (KV-cache, {args.response_len} tokens)", ph.get("sample", 0)),
                ("rollout forward: policy/value", ph.get("rollout_policy_fwd", 0)),
                ("rollout forward: reference", ph.get("rollout_ref_fwd", 0)),
                ("scoring (decode + char-frac)", ph.get("score", 0)),
                (f"PPO: train forwards ({n_opt})", ph.get("ppo_train_fwd", 0)),
                (f"PPO: backward ({n_opt})", ph.get("ppo_backward", 0)),
                (f"PPO: optimizer steps ({n_opt})", ph.get("ppo_optimizer_step", 0)),
                ("PPO: rest (GAE, whitening, losses)", ph.get("ppo_update", 0) - sum(ph.get(k, 0) for k in opt_parts)),
            ]
            accounted = sum(v for _, v in rows)
            rows.append(("other (loop, KL ctl, stream, stats)", pf["update_s"] - accounted))
            for name, v in rows:
                print(f"  {name:<38} {v:8.3f} s  {100 * v / pf['update_s']:5.1f}%")
            print(f"  {'total':<38} {pf['update_s']:8.3f} s")
            if pf.get("gflop"):
                unprof = pr["sec_per_step_mean"]["total_s"]
                print(
                    f"  FLOPs of one update (torch FlopCounterMode: matmuls + attention): {pf['gflop']:.0f} GFLOP "
                    f"= {pf['gflop'] / unprof:.0f} GFLOP/s at the unprofiled {unprof:.3f} s/update"
                )
            print(f"top {args.profile_top} operators by self CPU time:")
            print(pf["table"])

    print("machine load before: {:.2f} {:.2f} {:.2f}; after: {:.2f} {:.2f} {:.2f}".format(*load_start, *load_end))
    summary.update(
        {"load_before": load_start, "load_after": load_end, "args": vars(args), "runs": results, "profiles": profiles}
    )
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
