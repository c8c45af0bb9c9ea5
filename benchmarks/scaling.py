#!/usr/bin/env python
"""The cost of the distributed engine: PPO episodes/s of `lmprefs train-policy` without a launcher against the same
run under torchrun, with DDP and with FSDP2 (run.parallel), the same global batch.

What is measured
  Each configuration is a fresh `lmprefs train-policy tiny --reward vader` run (VADER scores the responses, so no
  reward model is trained first) of --updates PPO updates of the model's batch; episodes/s is
  batch * (updates - 1) / (elapsed/time of the last update - elapsed/time of the first), read from the run's
  metrics.jsonl, so start-up, model loading and the first (warm-up, compile) update are left out. Under several
  ranks elapsed/time is the mean of the ranks' clocks.

  --device cpu (default): 1 process x 2 threads (and x 1 thread) against `torchrun --nproc-per-node 2` x 1 thread
    each (gloo), with each --parallel (ddp, fsdp). The target of issue 10: 2 x 1 at least 0.85x of 1 x 2.
  --device cuda: one GPU without a launcher against `torchrun --nproc-per-node 1` (NCCL, world size 1), with each
    --parallel: what the engine costs on one GPU. run.compile=auto compiles the sampler on CUDA, except under FSDP
    (refused there); --compile off compares the three without it.

Models: `tiny` (the tests' random 2-layer GPT-2, query 24 / response 8), `smollm2` (SmolLM2-135M, full fine-tuning,
the austen-sentiment preset's Austen queries at 32 query / 24 response tokens; only when its files are in the cache:
`lmprefs assets prepare smollm2-135m`), `gpt2-124m` (a random-weight GPT-2 124M with GPT-2's tokenizer, the
original's shapes: query 64 / response 24; built in a temporary directory, for GPUs). os.getloadavg() is printed
before and after each model, and the CPU model: on a shared machine the figures move with other jobs.

    python benchmarks/scaling.py [--device cpu|cuda] [--models tiny,smollm2] [--parallel ddp,fsdp] [--updates 6]
        [--batch N] [--no-launcher-threads 2,1] [--json FILE]
    python benchmarks/scaling.py --models tiny --parallel ddp --no-launcher-threads 1 --batch 8 --updates 2
        # seconds: a check that the script runs (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _common import ArgumentParser, cpu_name, int_at_least, positive_int, run_main

# lmprefs internals this script uses, all in this block (the runs themselves go through the `lmprefs` command)
from lmprefs.assets.registry import asset_status
from lmprefs.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[1]

# model -> (preset, {device: global batch}, extra overrides)
MODELS = {
    "tiny": ("tiny", {"cpu": 64, "cuda": 256}, ["--ppo.nminibatches", "4"]),
    "smollm2": ("austen-sentiment", {"cpu": 16, "cuda": 256}, ["--ppo.nminibatches", "2", "--task.query-length", "32",
                                                                "--run.dtype", "float32"]),
    # random weights: the KL runs past the andon cord's 50 nats within two updates, which ends a speed run
    "gpt2-124m": ("tiny", {"cpu": 16, "cuda": 256}, ["--ppo.nminibatches", "4", "--task.query-length", "64",
                                                     "--task.response-length", "24", "--task.truncate-after", "16",
                                                     "--ppo.kl-stop", "1e9", "--ppo.score-drop-stop", "none"]),
}  # fmt: skip


def run(model: str, device: str, procs: int | None, parallel: str, threads: int, updates: int, out: Path,
        extra: list[str], batch: int) -> float:  # fmt: skip
    """Episodes/s of one run; procs None = no launcher."""
    preset, _, overrides = MODELS[model]
    args = ["train-policy", preset, "--reward", "vader", "--ppo.total-episodes", str(batch * updates),
            "--ppo.batch-size", str(batch), "--run.threads", str(threads), "--run.log-interval", "1000",
            "--run.save-interval", "1000", "--run.device", device, "--run.parallel", parallel, "--run-dir", str(out),
            *overrides, *extra]  # fmt: skip
    if procs is None:
        cmd = [sys.executable, "-m", "lmprefs", *args]
    else:
        # --log-dir: the launcher's logs beside the run (otherwise a torchelastic_* folder per launch stays in /tmp)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), "--log-dir", str(out.with_name(out.name + "-launcher")),
               "-m", "lmprefs", *args]  # fmt: skip
    # this checkout first, then the machine's own PYTHONPATH (a GPU machine may keep packages there)
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return batch * (len(rows) - 1) / (rows[-1]["elapsed/time"] - rows[0]["elapsed/time"])


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    models, modes, solo_threads = check_args(p, a)
    if "smollm2" in models and asset_status("smollm2-135m") != "ready":
        print("smollm2: not in the cache (lmprefs assets prepare smollm2-135m); skipped")
        models.remove("smollm2")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(f"{p.prog}: error: --device cuda: CUDA is not available here", file=sys.stderr)
            return 2
        print(f"GPU: {torch.cuda.get_device_name(0)}; CPU: {cpu_name()}")
        # (label, processes (None: no launcher), run.parallel, threads)
        configs = [("no launcher", None, "ddp", 0)] + [(f"torchrun x1 NCCL {m}", 1, m, 0) for m in modes]
    else:
        print(f"CPU: {cpu_name()}, {os.cpu_count()} cores")
        # 1 x 1 as well: on a loaded machine two threads of one process can lose more than they gain
        configs = [(f"1 process x {t} thread{'s' * (t > 1)}", None, "ddp", t) for t in solo_threads]
        configs += [(f"2 processes x 1 thread {m}", 2, m, 1) for m in modes]
    results = {"device": a.device, "cpu": cpu_name(), "cpu_count": os.cpu_count(), "updates": a.updates,
               "models": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            results["models"][m] = measure_model(a, m, configs, Path(tmp))
    if a.json:
        Path(a.json).write_text(json.dumps(results) + "\n")
    return 0


def parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--models", default=None, help="comma-separated; default tiny,smollm2 (cpu), tiny,gpt2-124m (cuda)")
    p.add_argument("--parallel", default="ddp,fsdp", help="run.parallel values to launch (ddp, fsdp)")
    p.add_argument("--updates", type=int_at_least(2), default=6,
                   help="PPO updates per run (the first, warm-up, is left out of episodes/s)")  # fmt: skip
    p.add_argument("--reps", type=positive_int, default=1)
    p.add_argument("--batch", type=positive_int, default=None,
                   help="global batch of every run (default: per model, " +
                   "; ".join(f"{m} {b['cpu']} on cpu / {b['cuda']} on cuda" for m, (_, b, _) in MODELS.items()) +
                   ")")  # fmt: skip
    p.add_argument("--no-launcher-threads", default="2,1",
                   help="--device cpu: thread counts of the runs without a launcher, the first the baseline of the "
                   "ratios (each torchrun process has 1 thread)")  # fmt: skip
    p.add_argument("--compile", choices=("auto", "off"), default="auto", help="run.compile of every run")
    p.add_argument("--json", default=None, help="also write every figure here as one JSON object")
    return p


def check_args(p: ArgumentParser, a: argparse.Namespace) -> tuple[list[str], list[str], list[int]]:
    """The models, run.parallel values and no-launcher thread counts the flags name; a bad one is p.error."""
    models = [m for m in (a.models or ("tiny,smollm2" if a.device == "cpu" else "tiny,gpt2-124m")).split(",") if m]
    modes = [m for m in a.parallel.split(",") if m]
    for m in models:
        if m not in MODELS:
            p.error(f"--models: unknown model {m!r}; choose from {', '.join(MODELS)}")
    for m in modes:
        if m not in ("ddp", "fsdp"):
            p.error(f"--parallel: unknown value {m!r}; choose ddp, fsdp")
    try:
        solo_threads = [int(x) for x in a.no_launcher_threads.split(",") if x.strip()]
    except ValueError:
        solo_threads = []
    if not solo_threads or min(solo_threads) < 1:
        p.error(f"--no-launcher-threads {a.no_launcher_threads!r}: comma-separated thread counts >= 1")
    procs_max = 2 if a.device == "cpu" else 1
    for m in models:  # each rank splits its share of the batch into the model's minibatches
        nmb = int(MODELS[m][2][MODELS[m][2].index("--ppo.nminibatches") + 1])
        if a.batch is not None and a.batch % (procs_max * nmb):
            p.error(f"--batch {a.batch}: {m} runs {nmb} minibatches on each of up to {procs_max} processes; give a "
                    f"multiple of {procs_max * nmb}")  # fmt: skip
    return models, modes, solo_threads


def measure_model(a: argparse.Namespace, m: str, configs: Sequence[tuple[str, int | None, str, int]],
                  tmp: Path) -> dict:  # fmt: skip
    """--reps rounds of every configuration on model m, each printed as a line of episodes/s and ratios to the first
    configuration; the load average before and after."""
    m_extra = ["--run.compile", a.compile]
    if m == "gpt2-124m":
        sys.path.insert(0, str(Path(__file__).parent))
        from gpu_throughput import build_model_dir

        m_extra += ["--task.initial-model", build_model_dir("gpt2-124m", seed=0, parent=tmp)]
    batch = a.batch or MODELS[m][1][a.device]
    res: dict = {"batch": batch, "load_before": os.getloadavg(), "reps": []}
    print(f"load average before {m}: {os.getloadavg()}", flush=True)
    for rep in range(a.reps):
        t0, figures = time.time(), []
        for label, procs, parallel, threads in configs:
            out = tmp / f"{m}-{label.replace(' ', '_')}-{rep}"
            figures.append((label, run(m, a.device, procs, parallel, threads, a.updates, out, m_extra,
                                       batch)))  # fmt: skip
        base = figures[0][1]
        print(f"{m:9s} batch {batch:3d}: " + "; ".join(
            f"{label} {eps:7.2f} episodes/s ({eps / base:.2f}x)" for label, eps in figures) +
            f"  ({time.time() - t0:.0f}s)", flush=True)  # fmt: skip
        res["reps"].append([
            {"label": label, "processes": n or 1, "launcher": n is not None, "parallel": parallel,
             "threads": threads, "episodes_per_s": eps, "ratio": eps / base}
            for (label, eps), (_, n, parallel, threads) in zip(figures, configs, strict=True)])  # fmt: skip
    res["load_after"] = os.getloadavg()
    print(f"load average after {m}: {os.getloadavg()}", flush=True)
    return res


if __name__ == "__main__":
    sys.exit(run_main(main))
