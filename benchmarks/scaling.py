#!/usr/bin/env python
"""The cost of the distributed engine on one CPU machine: PPO episodes/s of `lmprefs train-policy` as 1 process x 2
threads against `torchrun --nproc-per-node 2` x 1 thread each (DDP over gloo), the same global batch.

What is measured
  Each configuration is a fresh `lmprefs train-policy PRESET --reward vader` run (VADER scores the responses, so no
  reward model is trained first) of --updates PPO updates of --batch episodes; episodes/s is
  batch * (updates - 1) / (elapsed/time of the last update - elapsed/time of the first), read from the run's
  metrics.jsonl, so start-up, model loading and the first (warm-up) update are left out. Under two ranks
  elapsed/time is the mean of the ranks' clocks. Models: `tiny` (the tests' random 2-layer GPT-2) and `smollm2`
  (SmolLM2-135M, full fine-tuning, the austen-sentiment preset at 32 query / 24 response tokens), the latter only
  when its files are in the cache (`lmprefs assets prepare smollm2-135m`).
  The target of issue 10: 2 x 1 at least 0.85x of 1 x 2. os.getloadavg() is printed before and after: on a shared
  machine the figures move with other jobs.

    python benchmarks/scaling.py [--models tiny,smollm2] [--updates 6] [--reps 1]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "tiny": ("tiny", 64, ["--ppo.nminibatches", "4"]),
    "smollm2": ("austen-sentiment", 16, ["--ppo.nminibatches", "2", "--task.query-length", "32",
                                         "--run.dtype", "float32", "--run.device", "cpu"]),
}  # fmt: skip


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(model: str, procs: int, threads: int, updates: int, out: Path) -> float:
    preset, batch, extra = MODELS[model]
    args = ["train-policy", preset, "--reward", "vader", "--ppo.batch-size", str(batch), "--ppo.total-episodes",
            str(batch * updates), "--run.threads", str(threads), "--run.log-interval", "1000", "--run.save-interval",
            "1000", "--run-dir", str(out), *extra]  # fmt: skip
    if procs == 1:
        cmd = [sys.executable, "-m", "lmprefs", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--master-addr",
               "127.0.0.1", "--master-port", str(_port()), "-m", "lmprefs", *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return batch * (len(rows) - 1) / (rows[-1]["elapsed/time"] - rows[0]["elapsed/time"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--updates", type=int, default=6)
    p.add_argument("--reps", type=int, default=1)
    a = p.parse_args()
    from lmprefs.assets import asset_status

    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"--models: unknown model {m!r}; choose from {', '.join(MODELS)}")
    if "smollm2" in models and asset_status("smollm2-135m") != "ready":
        print("smollm2: not in the cache (lmprefs assets prepare smollm2-135m); skipped")
        models.remove("smollm2")
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            for rep in range(a.reps):
                t0 = time.time()
                one = run(m, 1, 2, a.updates, Path(tmp) / f"{m}-1x2-{rep}")
                two = run(m, 2, 1, a.updates, Path(tmp) / f"{m}-2x1-{rep}")
                print(f"{m:8s} batch {MODELS[m][1]:3d}: 1 process x 2 threads {one:7.1f} episodes/s; 2 processes x 1 "
                      f"thread {two:7.1f} episodes/s; ratio {two / one:.2f}x  ({time.time() - t0:.0f}s)", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
