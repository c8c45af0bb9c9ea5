#!/usr/bin/env python
"""Reward-model benchmark: held-out best-of-4 accuracy against the number of labels, and training tokens per second.

What is measured
  The `austen-sentiment` preset (SmolLM2-135M continuing Jane Austen passages; VADER plays the human labeler) through
  the package pipeline:
    1. `lmprefs.pipeline.task.setup_task(cfg)` loads the model and queries;
    2. `collect_labels(t, store, M, labeler="vader")` samples M = max(--labels) + --heldout best-of-4 questions from
       the initial policy into a fresh LabelStore and has the simulated VADER labeler answer them (noiseless:
       labels.labeler_temperature 0, random rate 0; ties broken uniformly at random);
    3. for every N in --labels, `train_reward_model(t, store, out)` (normalize, train_reward.epochs passes,
       normalize, evaluate) with labels.num_train = N and labels.heldout_fraction = H / K, K = the labels in the
       store (M). train_reward_model holds out each item whose hash of (run.seed, item id) falls under that fraction
       (about H labels), then trains on the first N of the rest; K and the seed are the same for every N, so the
       held-out set is the same for every N and the training sets are nested. The script checks this: it
       fingerprints the held-out tensors that reach `evaluate` in each run.
  Reported per N: held-out accuracy (chance 25%) before and after training, held-out loss, and the reward model's
  training throughput (tokens through forward+backward per second in train_epoch: padded positions of the
  [labels x 4, query+response] batches, and real non-pad tokens). Also reported: the accuracy ceiling of the labels
  themselves (the expected held-out accuracy of a perfect VADER scorer, < 100% because tied VADER scores, mostly
  0.0 for neutral text, are labeled at random) and the 95% binomial interval of each accuracy.
  --store reuses the labels of an earlier run (copied into --out-dir) instead of collecting: with the same --heldout
  and --seed the held-out set is that run's (e.g. to add a larger N later, or to try another --lr).

  The policy sampling and the reward model run under bf16 autocast by default (--dtype; parameters and optimizer
  state stay fp32). Target (the issue): >= 55% held-out accuracy from at most 1,000 labels.

Writes only under --out-dir (default: a new temporary directory): the label store and, with --keep-models, each
reward model (about 0.5 GB each; deleted after evaluation otherwise), and results.json. No network: the
smollm2-135m and austen assets must already be prepared in $LMPREFS_CACHE. Peak memory is ~9 GiB (the activations of a
64-sequence minibatch of SmolLM2).

Example
  export LMPREFS_CACHE=/tmp/lmcache
  python benchmarks/reward_accuracy.py --labels 100,200 --heldout 100        # a quick check (~4 min idle)
  python benchmarks/reward_accuracy.py --labels 250,500,1000 --heldout 400
  python benchmarks/reward_accuracy.py --preset tiny --labels 4,8 --heldout 8 --epochs 1 --dtype float32 \
      --threads 1     # seconds: a check that the script runs (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import ArgumentParser, nonnegative_int, positive_int, run_main, source_fingerprint  # noqa: E402
from _reward_model_timers import RewardModelTimers  # noqa: E402

# lmprefs internals this script uses, all in this block
import lmprefs  # noqa: E402
import lmprefs.pipeline.reward_model as R  # noqa: E402  (train_epoch, normalize, evaluate, label_prefixes are timed)
from lmprefs.config import PRESETS, Config, preset  # noqa: E402
from lmprefs.data.tasks import decode  # noqa: E402
from lmprefs.io import publish  # noqa: E402
from lmprefs.labels.labelers import SCORE_FNS, ScoreFn  # noqa: E402
from lmprefs.labels.store import LabelStore  # noqa: E402
from lmprefs.pipeline.labeling import collect_labels, open_store  # noqa: E402
from lmprefs.pipeline.reward_model import load_examples  # noqa: E402
from lmprefs.pipeline.reward_training import train_reward_model  # noqa: E402
from lmprefs.pipeline.task import Task, setup_task  # noqa: E402
from lmprefs.training.reward import Comparisons  # noqa: E402

# the label ceiling scores a held-out question's samples alone: labelers that read the query are not covered
LABELERS = ("vader", "descriptiveness")


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--labels", default="250,500,1000", help="comma-separated training-label counts N")
    p.add_argument("--heldout", type=positive_int, default=400, help="held-out labels H (the same set for every N)")
    p.add_argument("--out-dir", default=None, help="where everything is written (default: a new temp dir)")
    p.add_argument("--preset", default="austen-sentiment", choices=list(PRESETS),
                   help="lmprefs preset (`--preset tiny`: its tiny GPT-2, seconds, for a check of the script)")
    p.add_argument("--labeler", default="vader", choices=LABELERS, help="simulated labeler")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="autocast dtype (run.dtype)")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--seed", type=int, default=1, help="run.seed (sampling, split, training order)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="train_reward.batch_size (default: the preset's)")  # fmt: skip
    p.add_argument("--lr", type=float, default=None, help="train_reward.lr (default: the preset's)")
    p.add_argument("--epochs", type=positive_int, default=None, help="train_reward.epochs (default: the preset's)")
    p.add_argument("--microbatch", type=nonnegative_int, default=None,
                   help="train_reward.microbatch (default: the preset's)")  # fmt: skip
    p.add_argument("--lora-rank", type=nonnegative_int, default=None,
                   help="lora.rank, 0 = full fine-tuning (default: preset)")  # fmt: skip
    p.add_argument("--lora-layers", type=nonnegative_int, default=None, help="lora.layers (default: the preset's)")
    p.add_argument("--keep-models", action="store_true", help="keep each trained reward model in --out-dir")
    p.add_argument(
        "--store",
        default=None,
        help="reuse the labels of an earlier run (its labels.sqlite, copied into --out-dir) instead of "
        "collecting; the held-out set is then H labels of ALL its labels, the same set as that run's "
        "when it used the same --heldout and --seed",
    )
    args = p.parse_args(argv)
    try:
        args.ns = sorted({int(x) for x in args.labels.split(",") if x.strip()})
    except ValueError:
        args.ns = []
    if not args.ns or args.ns[0] <= 0:
        p.error(f"--labels {args.labels!r}: comma-separated positive integers")
    if args.lr is not None and not args.lr > 0:
        p.error(f"--lr must be positive, not {args.lr}")
    if args.store and not Path(args.store).is_file():
        p.error(f"--store {args.store}: no such file")
    if args.out_dir and (Path(args.out_dir) / "labels.sqlite").exists():
        p.error(f"--out-dir {args.out_dir} holds a labels.sqlite already; give a fresh one")
    return args


def given(**kw) -> dict:
    """The keyword arguments that were given on the command line (not None)."""
    return {k: v for k, v in kw.items() if v is not None}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (float("nan"), float("nan"))
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="reward-accuracy-"))
    out.mkdir(parents=True, exist_ok=True)
    cfg = run_config(args)
    M = max(args.ns) + args.heldout
    load0 = os.getloadavg()
    src = print_header(args, cfg, out, M, load0)

    # ---- 1. task + labels (once) ----
    t0 = time.time()
    t = setup_task(cfg)
    setup_s = time.time() - t0
    log(f"task ready in {setup_s:.1f}s: {len(t.train_queries)} training queries, dtype {t.dtype}")
    store, col = open_labels(args, t, out, M)
    # train_reward_model holds out int(total * heldout_fraction) of ALL labels in the store
    total = len(load_examples(cfg, store, t.tok))
    if total < M:
        print(f"reward_accuracy.py: error: --store {args.store} holds {total} labels; {M} needed (max(--labels) + "
              "--heldout)", file=sys.stderr)  # fmt: skip
        return 2
    col["labels_in_store"] = total

    # ---- 2. a reward model per N, with train_epoch / normalize / evaluate timed and the held-out set captured ----
    timers = RewardModelTimers(R)
    rows, ceiling = [], None
    for n in args.ns:
        summary, wall = train_one(cfg, t, store, out, n, args.heldout / total, timers, keep=args.keep_models)
        if ceiling is None:  # once: the held-out set is the same for every N
            ceiling = label_ceiling(t, timers.captured["held"], SCORE_FNS[args.labeler])
        rows.append(result_row(cfg, t, n, summary, wall, timers))
        print_row(rows[-1])

    load1 = os.getloadavg()
    assert ceiling is not None  # args.ns holds at least one N
    print_summary(args.labeler, rows, ceiling)
    src1 = source_fingerprint()
    if src1 != src:
        print(f"WARNING: the lmprefs sources changed during this benchmark: now {json.dumps(src1)}")
    print("machine load before: {:.2f} {:.2f} {:.2f}; after: {:.2f} {:.2f} {:.2f}".format(*load0, *load1))
    res = {"args": vars(args), "lmprefs_source": [src, src1], "collect": col, "setup_s": setup_s,
           "label_ceiling": ceiling, "rows": rows, "load_before": load0, "load_after": load1,
           "versions": versions()}  # fmt: skip
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    print(f"results: {out / 'results.json'}")
    store.close()
    return 0


def run_config(args: argparse.Namespace) -> Config:
    """The preset with the flags applied: noiseless simulated labels, and the reward-model training flags given."""
    R_ = dataclasses.replace
    cfg = preset(args.preset)
    return R_(
        cfg,
        run=R_(cfg.run, dtype=args.dtype, threads=args.threads, device="cpu", seed=args.seed),
        labels=R_(cfg.labels, labeler=args.labeler, labeler_temperature=0.0, labeler_random_rate=0.0),
        train_reward=R_(cfg.train_reward, **given(batch_size=args.batch_size, lr=args.lr, epochs=args.epochs,
                                                   microbatch=args.microbatch)),
        lora=R_(cfg.lora, **given(rank=args.lora_rank, layers=args.lora_layers)),
    )


def versions() -> dict[str, str]:
    import platform

    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def print_header(args: argparse.Namespace, cfg: Config, out: Path, M: int, load0: tuple[float, float, float]) -> dict:
    """What runs, on what: the lines before any work. Returns the lmprefs source fingerprint it printed."""
    v = versions()
    print(f"# reward_accuracy  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  out={out}")
    print(
        f"python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, "
        f"lmprefs {getattr(lmprefs, '__version__', '?')}, cpu_count {os.cpu_count()}, threads {args.threads}"
    )
    print(
        f"preset {args.preset}: model {cfg.task.initial_model}, queries {cfg.task.query_dataset} "
        f"(query {cfg.task.query_length}, response {cfg.task.response_length}), labels {cfg.labels.type} by "
        f"{args.labeler}, train_reward batch {cfg.train_reward.batch_size} lr {cfg.train_reward.lr} epochs "
        f"{cfg.train_reward.epochs}, lora rank {cfg.lora.rank} layers {cfg.lora.layers}, "
        f"normalize_samples {cfg.train_reward.normalize_samples}, dtype {args.dtype}, seed {args.seed}"
    )
    print(f"labels N = {args.ns}, held-out H = {args.heldout}, questions needed M = {M}")
    src = source_fingerprint()
    print(f"lmprefs source (sha1 of lmprefs/**/*.py): {json.dumps(src)}")
    print("machine load before: {:.2f} {:.2f} {:.2f}".format(*load0))
    return src


def open_labels(args: argparse.Namespace, t: Task, out: Path, M: int) -> tuple[LabelStore, dict]:
    """The label store in --out-dir: a copy of --store, or M best-of-4 questions collected and labeled now. Returns it
    and what the collection reported."""
    store_path = out / "labels.sqlite"
    if store_path.exists():  # made since the flags were checked
        sys.exit(f"{store_path} exists; give a fresh --out-dir")
    if args.store:
        shutil.copyfile(args.store, store_path)
        for ext in ("-wal", "-shm"):  # an unclosed store's write-ahead log, if any
            if Path(args.store + ext).exists():
                shutil.copyfile(args.store + ext, str(store_path) + ext)
        store = open_store(store_path)
        col: dict = {"reused_store": str(args.store)}
        log(f"reusing the labels in {args.store}")
        return store, col
    store = open_store(store_path)
    log(f"collecting {M} best-of-4 questions and {args.labeler} labels ...")
    col = collect_labels(t, store, M, labeler=args.labeler)
    log(f"collected: {col}")
    print(
        f"labels: {col['labels_added']} in {col['seconds']:.0f}s (sampling {col['sample_seconds']:.0f}s, "
        f"{col['sample_seconds'] / M:.2f} s per question of 4 samples)"
    )
    return store, col


def train_one(cfg: Config, t: Task, store: LabelStore, out: Path, n: int, heldout_fraction: float,
              timers: RewardModelTimers, *, keep: bool) -> tuple[dict, float]:  # fmt: skip
    """A reward model trained on the first n labels (the held-out ones left out): its summary and wall seconds, with
    `timers` holding this run's timings and sets alone. The model itself is deleted unless `keep`."""
    R_ = dataclasses.replace
    cfg_n = R_(cfg, labels=R_(cfg.labels, num_train=n, heldout_fraction=heldout_fraction))
    t_n = dataclasses.replace(t, cfg=cfg_n)
    timers.clear()
    log(f"training a reward model on N={n} labels ({loadavg()})")
    s = time.time()
    rm, summary = train_reward_model(t_n, store, out / f"rm-{n}")
    wall = time.time() - s
    del rm
    if not keep:
        publish.remove(out / f"rm-{n}")
    return summary, wall


def label_ceiling(t: Task, held: Comparisons, score_fn: ScoreFn) -> float:
    """The labels' own ceiling: the expected held-out accuracy of a perfect scorer, ties broken at random."""
    assert held.best is not None  # best-of-4 questions
    texts = [decode(t.tok, held.samples[i]) for i in range(len(held))]
    exp_acc = []
    for i, txt in enumerate(texts):
        sc = score_fn(txt)
        top = max(sc)
        ties = [j for j, v in enumerate(sc) if v == top]
        exp_acc.append((int(held.best[i]) in ties) / len(ties))
    return sum(exp_acc) / len(exp_acc)


def fingerprint(c: Comparisons) -> str:
    """A short sha1 of a set's queries, samples and labels: which held-out set a run evaluated on."""
    h = hashlib.sha1()
    for x in (y for y in (c.queries, c.samples, c.best) if y is not None):
        h.update(x.contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def result_row(cfg: Config, t: Task, n: int, summary: dict, wall: float, timers: RewardModelTimers) -> dict:
    """The figures of the reward model trained on n labels, from its summary and what `timers` recorded."""
    timed, captured = timers.timers, timers.captured
    train, held = captured["train"], captured["held"]
    S = train.samples.shape[1]
    L = cfg.task.query_length + len(t.prefix) + len(t.suffix) + cfg.task.response_length
    epochs = cfg.train_reward.epochs
    positions = len(train) * S * L * epochs
    real = (int((train.queries >= 0).sum()) * S + int((train.samples >= 0).sum())) * epochs
    # training time: the epochs plus the one pass through the frozen bottom blocks that they reuse
    te = timed.get("train_epoch", float("nan")) + timed.get("label_prefixes", 0.0)
    acc = summary["heldout/accuracy"]
    return {
        "labels": n,
        "labels_train": summary["labels_train"],
        "labels_heldout": summary["labels_heldout"],
        "heldout_accuracy": acc,
        "heldout_accuracy_95ci": wilson(acc, summary["labels_heldout"]),
        "heldout_loss": summary.get("heldout/loss"),
        "initial_heldout_accuracy": summary.get("initial_heldout/accuracy"),
        "initial_heldout_loss": summary.get("initial_heldout/loss"),
        "heldout_fingerprint": fingerprint(held),
        "train_epoch_s": te,
        "train_positions_per_s": positions / te,
        "train_real_tokens_per_s": real / te,
        "train_s_per_label": te / len(train),
        "normalize_s": timed.get("normalize"),
        "evaluate_s": timed.get("evaluate"),
        "wall_s": wall,
        "train_epoch_cpu": captured.get("cpu"),
        "final_minibatch": summary.get("final_minibatch"),
        "load_after": os.getloadavg(),
        "rss_gib": rss_gib(),
    }


def print_row(row: dict) -> None:
    n, acc, te, wall = row["labels"], row["heldout_accuracy"], row["train_epoch_s"], row["wall_s"]
    lo, hi = row["heldout_accuracy_95ci"]
    print(
        f"N={n:5d}: held-out accuracy {100 * acc:5.1f}% (95% CI {100 * lo:.1f}-{100 * hi:.1f}; before training "
        f"{100 * row['initial_heldout_accuracy']:.1f}%), loss {row['heldout_loss']:.3f}; train_epoch "
        f"{te:.0f}s = {row['train_s_per_label']:.2f} s/label, {row['train_positions_per_s']:.0f} tokens/s "
        f"({row['train_real_tokens_per_s']:.0f} non-pad); run {wall:.0f}s (normalize {row['normalize_s']:.0f}s, "
        f"evaluate {row['evaluate_s']:.0f}s); held-out set {row['heldout_fingerprint']}; during train_epoch other "
        f"processes used {row['train_epoch_cpu']['other_cores_avg']} cores; RSS {row['rss_gib'][0]:.1f} GiB "
        f"(peak {row['rss_gib'][1]:.1f}) ({loadavg()})",
        flush=True,
    )


def print_summary(labeler: str, rows: list[dict], ceiling: float) -> None:
    """The checks (one held-out set, the label ceiling), the table of every N and the target."""
    fps = {r["heldout_fingerprint"] for r in rows}
    print()
    print(
        f"held-out set identical for every N: {'yes' if len(fps) == 1 else 'NO ' + str(fps)} "
        f"({rows[0]['labels_heldout']} labels)"
    )
    print(
        f"label ceiling (perfect {labeler} scorer, ties at random) on the held-out set: {100 * ceiling:.1f}%; "
        f"chance 25%"
    )
    print()
    print(
        "| labels | held-out acc. | 95% CI | before training | held-out loss | train tokens/s (padded / non-pad) "
        "| s/label | other cores during training |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        lo, hi = r["heldout_accuracy_95ci"]
        print(
            f"| {r['labels']} | {100 * r['heldout_accuracy']:.1f}% | {100 * lo:.1f}-{100 * hi:.1f}% | "
            f"{100 * r['initial_heldout_accuracy']:.1f}% | {r['heldout_loss']:.3f} | "
            f"{r['train_positions_per_s']:.0f} / {r['train_real_tokens_per_s']:.0f} | {r['train_s_per_label']:.2f} | "
            f"{r['train_epoch_cpu']['other_cores_avg']} |"
        )
    best = [r for r in rows if r["labels"] <= 1000]
    if best:
        b = max(best, key=lambda r: r["heldout_accuracy"])
        print(
            f"\ntarget >= 55% held-out accuracy from <= 1,000 labels: "
            f"{'MET' if b['heldout_accuracy'] >= 0.55 else 'NOT MET'} (best {100 * b['heldout_accuracy']:.1f}% at "
            f"N={b['labels']})"
        )


def rss_gib() -> tuple[float, float]:
    """(current, peak) resident memory of this process in GiB (Linux)."""
    import resource

    with open("/proc/self/statm") as f:
        cur = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return round(cur / 2**30, 2), round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def loadavg() -> str:
    return "loadavg {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


if __name__ == "__main__":
    sys.exit(run_main(main))
