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
  is the fair one when other work shares the cores. Both sides' CPU seconds are read unrounded (_exact_cpu.py; the
  anchor's record rounds its cores to 0.01, up to 5% of a loaded ratio).

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
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ArgumentParser, busy_cpu_seconds, nonnegative_int, positive_int
from _ppo_report import report
from _ppo_worker import lmprefs_worker

from lmprefs.assets.models import MODEL_ASSETS, resolve_model

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ANCHOR_DIR = REPO.parent / "shared" / "bench"
DEFAULT_ANCHOR_PYTHON = REPO / ".venv-anchor" / "bin" / "python"
MODES = ("shared", "separate")
# what an anchor result must have been measured with for a ratio against it to mean anything
ANCHOR_SETTINGS = ("batch_size", "query_len", "response_len", "ppo_epochs", "minibatches", "temperature")
ANCHOR_SHAPE = ("n_layer", "n_head", "n_embd", "vocab_size")


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


def busy_cores(window: float = 3.0) -> float:
    """Cores busy system-wide over `window` seconds (this script sleeps meanwhile), from /proc/stat."""
    b0 = busy_cpu_seconds()
    time.sleep(window)
    return (busy_cpu_seconds() - b0) / window


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
    assert res is not None  # retries >= 0: the loop ran
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


def check_anchor_paths(parser: ArgumentParser, args) -> None:
    """TRL's python (unless TRL is not run) and the anchor's harness, before anything is written."""
    anchor_py = Path(args.anchor_python)
    if not args.skip_trl and not args.anchor_result and not anchor_py.exists():
        parser.error(f"{anchor_py} not found: create the TRL venv as ../shared/bench/README.md says, or pass "
                     "--anchor-result or --skip-trl")  # fmt: skip
    if not (Path(args.anchor_dir) / "_anchor_common.py").exists():
        parser.error(f"--anchor-dir {args.anchor_dir}: no _anchor_common.py there (the queries and the anchor model "
                     "come from it)")  # fmt: skip


def print_machine(args, out: Path) -> tuple[float, float, float]:
    """The invocation's header: versions, machine, and its load before (returned, for results.json)."""
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
    return load_start


def prepare_model(parser: ArgumentParser, args, model_dir: Path) -> dict:
    """The anchor model built if absent; its shape, which an --anchor-result must have been measured on."""
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
    return shape


def shared_flags(args, model_dir: Path) -> list[str]:
    """The settings both sides are run with, as flags of trl_ppo_bench.py and of this script's worker."""
    flags = []
    for name in ("batch_size", "query_len", "response_len", "steps", "ppo_epochs", "minibatches", "temperature",
                 "lr", "threads", "seed"):  # fmt: skip
        flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return [*flags, "--model-dir", str(model_dir)]


def trl_command(args, flags: list[str]) -> list[str]:
    bf16 = ["--bf16"] if args.dtype == "bfloat16" else []
    exact = Path(__file__).resolve().parent / "_exact_cpu.py"  # the anchor's CPU seconds unrounded
    return [str(Path(args.anchor_python)), str(exact), str(Path(args.anchor_dir) / "trl_ppo_bench.py"), "--reward",
            "char-frac:e", *flags, *bf16]  # fmt: skip


def lmprefs_command(args, out: Path, flags: list[str], mode: str, profile: bool = False) -> list[str]:
    """This script as the lmprefs worker; profiled: 2 updates (warm-up and a timed one) before the profiled one."""
    profiling = ["--profile-update", "--profile-top", str(args.profile_top), "--steps", "2"] if profile else []
    return [sys.executable, str(Path(__file__).resolve()), "--worker", "lmprefs", "--value-model", mode, "--out-dir",
            str(out), "--anchor-dir", args.anchor_dir, "--dtype", args.dtype, *flags, *profiling]  # fmt: skip


def measure(args, cmd: list[str], env: dict, label: str) -> dict | None:
    idle = (args.idle_threshold, args.max_wait)
    return run_json(cmd, env, args.timeout, label, idle, args.max_other, args.retries)


def run_rounds(args, systems: list[str], commands: dict[str, list[str]], env: dict) -> dict[str, list[dict | None]]:
    """--reps rounds of every system, the order rotated each round; TRL's side is the --anchor-result if given."""
    results: dict[str, list[dict | None]] = {s: [] for s in systems}
    for rep in range(args.reps):
        k = rep % len(systems)
        order = systems[k:] + systems[:k]
        for s in order:
            if s == "trl" and args.anchor is not None:
                results[s].append(args.anchor)
                continue
            results[s].append(measure(args, commands[s], env, f"rep {rep + 1}/{args.reps} {s}"))
    return results


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
    check_anchor_paths(parser, args)
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="ppo-throughput-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "tmp").mkdir(exist_ok=True)
    model_dir = Path(args.model_dir or out / "anchor-model")
    load_start = print_machine(args, out)
    shape = prepare_model(parser, args, model_dir)

    env = dict(os.environ, TMPDIR=str(out / "tmp"))
    flags = shared_flags(args, model_dir)
    commands = {"trl": trl_command(args, flags), **{m: lmprefs_command(args, out, flags, m) for m in modes}}
    systems = ([] if args.skip_trl else ["trl"]) + modes
    results = run_rounds(args, systems, commands, env)
    profiles = {}
    if args.profile:
        for m in modes:
            profiles[m] = measure(args, lmprefs_command(args, out, flags, m, profile=True), env, f"profile {m}")
    load_end = os.getloadavg()

    summary = report(args, systems, modes, results, profiles, shape)
    print("machine load before: {:.2f} {:.2f} {:.2f}; after: {:.2f} {:.2f} {:.2f}".format(*load_start, *load_end))
    summary.update(
        {"load_before": load_start, "load_after": load_end, "args": vars(args), "runs": results, "profiles": profiles}
    )
    (out / "results.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
