#!/usr/bin/env python
"""What a reward-model ensemble costs: train_reward_model with train_reward.ensemble K against K = 1, same labels.

What is measured
  A preset with LoRA (--lora-rank, in the top --lora-layers blocks) through the package pipeline:
    1. `collect_labels(t, store, --labels, labeler="vader")`: best-of-N questions sampled from the initial policy
       into a fresh LabelStore, answered by the simulated VADER labeler;
    2. alternately, --reps times each, `train_reward_model(setup_task(cfg), store, out)` with
       train_reward.ensemble 1 and --members: the wall-clock seconds of the call (normalization sampling before and
       after, training, held-out evaluation, saving), the model already loaded.
  Reported: the median seconds of each, their ratio, and that ratio against --members (what K separate reward
  models would cost). An ensemble's members share the frozen blocks below the adapters (computed once for all
  of them) and the initial policy's normalization samples (drawn once), so its ratio is under K.

Writes only into a temporary directory (removed at the end), and --json. No network: the preset's assets must be in
$LMPREFS_CACHE.

Example
  python benchmarks/reward_ensemble_cost.py --preset tiny --labels 200 --members 4 --lora-layers 1
  python benchmarks/reward_ensemble_cost.py --preset quickstart --labels 64 --members 4 --epochs 1 --reps 1
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import (  # noqa: E402
    ArgumentParser,
    busy_cpu_seconds,
    cpu_name,
    int_at_least,
    positive_int,
    run_main,
    source_fingerprint,
)

from lmprefs.config import PRESETS, preset  # noqa: E402
from lmprefs.pipeline.labeling import collect_labels, open_store  # noqa: E402
from lmprefs.pipeline.reward_training import train_reward_model  # noqa: E402
from lmprefs.pipeline.task import setup_task  # noqa: E402

R = dataclasses.replace


def parse(argv=None):
    p = ArgumentParser(prog="reward_ensemble_cost.py", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", choices=list(PRESETS), help="lmprefs preset")
    p.add_argument("--labels", type=positive_int, default=200, help="labeled questions in the store")
    p.add_argument("--members", type=int_at_least(2), default=4, help="ensemble size K compared with 1")
    p.add_argument("--lora-rank", type=positive_int, default=None, help="default: the preset's (4 if it has none)")
    p.add_argument("--lora-layers", type=positive_int, default=None, help="default: the preset's (1 if it has none)")
    p.add_argument("--epochs", type=positive_int, default=None, help="train_reward.epochs (default: the preset's)")
    p.add_argument("--response-length", type=positive_int, default=None, help="default: the preset's")
    p.add_argument("--reps", type=positive_int, default=2, help="timed runs of each size")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: the preset's)")
    p.add_argument("--json", default=None, help="write the results here")
    return p.parse_args(argv)


def config(a):
    cfg = preset(a.preset)
    lora = R(cfg.lora, rank=a.lora_rank or cfg.lora.rank or 4, layers=a.lora_layers or cfg.lora.layers or 1)
    tr = R(cfg.train_reward, epochs=a.epochs or cfg.train_reward.epochs)
    task = R(cfg.task, response_length=a.response_length or cfg.task.response_length)
    run = R(cfg.run, threads=a.threads) if a.threads else cfg.run
    return R(cfg, lora=lora, train_reward=tr, task=task, run=run,
             labels=R(cfg.labels, num_train=a.labels, heldout_fraction=0.2))  # fmt: skip


def main(argv=None) -> int:
    a = parse(argv)
    cfg = config(a)
    times: dict[int, list[float]] = {1: [], a.members: []}
    cpu: dict[int, list[float]] = {1: [], a.members: []}  # CPU seconds: less moved by other jobs than wall time
    busy0, own0 = busy_cpu_seconds(), time.process_time()
    with tempfile.TemporaryDirectory(prefix="ensemble-cost-") as tmp:
        store = open_store(Path(tmp) / "labels.sqlite")
        t0 = time.time()
        collect_labels(setup_task(cfg), store, a.labels, labeler="vader")
        print(f"{a.labels} labels in {time.time() - t0:.0f}s", flush=True)
        for rep in range(a.reps):
            for K in times:
                t = setup_task(R(cfg, train_reward=R(cfg.train_reward, ensemble=K)))
                t0, c0 = time.perf_counter(), time.process_time()
                _, summary = train_reward_model(t, store, Path(tmp) / f"rm-{K}-{rep}")
                times[K].append(time.perf_counter() - t0)
                cpu[K].append(time.process_time() - c0)
                print(f"ensemble {K}: {times[K][-1]:.2f}s, {cpu[K][-1]:.1f} CPU-s of this process (held-out accuracy "
                      f"{summary.get('heldout/accuracy', float('nan')):.3f})", flush=True)  # fmt: skip
        store.close()
    one, many = statistics.median(times[1]), statistics.median(times[a.members])
    out = {"preset": a.preset, "labels_train": summary["labels_train"], "members": a.members,
           "lora": dataclasses.asdict(cfg.lora), "epochs": cfg.train_reward.epochs,
           "seconds": {str(k): v for k, v in times.items()}, "cpu_seconds": {str(k): v for k, v in cpu.items()},
           "cpu_ratio": statistics.median(cpu[a.members]) / statistics.median(cpu[1]),
           "median_1": one, f"median_{a.members}": many,
           "ratio": many / one, "ratio_per_member": many / one / a.members, "cpu": cpu_name(),
           "other_cpu_seconds": busy_cpu_seconds() - busy0 - (time.process_time() - own0),
           "source": source_fingerprint()}  # fmt: skip
    print(f"K={a.members} vs K=1: {many:.2f}s / {one:.2f}s = {many / one:.2f}x ({a.members} separate reward "
          f"models: {a.members}x; the ensemble costs {many / one / a.members:.0%} of that); CPU seconds "
          f"{out['cpu_ratio']:.2f}x")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
