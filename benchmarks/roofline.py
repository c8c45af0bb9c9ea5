#!/usr/bin/env python
"""The quickstart's roofline: seconds, FLOPs, achieved GFLOP/s and the floor time of each of its six stages.

What is measured
  A reduced `lmprefs quickstart` by default (fewer labels, PPO updates and evaluation queries, through the
  quickstart's own flags and overrides), or with --full the preset as it is, runs as a child process with its own
  progress bars; its report.json gives each stage's seconds. For each stage the script counts the matmul FLOPs of
  what the code runs (`stage_flops`, from the model's shape with lmprefs.models.flops: the frozen prefix below LoRA
  adapters run once, a best-of-N question's query run once, the KV cache, the heads, forward and backward as the
  code does them), and divides: achieved GFLOP/s, its share of this machine's matmul peak, and the floor, the time
  the stage's FLOPs take at that peak. The peak is measured after the run: a square matmul in the dtype the run
  computed in (run.dtype=auto: bf16 autocast on a CPU with native bf16 or a CUDA GPU, fp32 elsewhere), on its
  device, at its thread count, best of --peak-reps. Also the largest process's peak RSS, and the peak so far at the
  end of each stage.

  --count-flops counts each stage's FLOPs a second way, with torch's FlopCounterMode on the real run, and prints
  both (its seconds then include the counter's overhead; the sampler and PPO forward are not compiled).

    python benchmarks/roofline.py [--preset quickstart] [--labels 200] [--updates 5] [--eval-queries 64]
        [--eval-samples 2] [--full] [--peak-size N] [--peak-reps 5] [--run-dir DIR] [--count-flops] [--json FILE]
        [--section.key VALUE ...]
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _common import ArgumentParser, cpu_name, positive_int, run_main, source_fingerprint

# the matmul FLOPs of each stage, counted as the code runs it (shared with `experiment mock-sentiment --plan`)
from lmprefs.models.attention import SDPA_LIKE
from lmprefs.models.flops import ModelFacts
from lmprefs.recipes.plan import Counts, stage_flops
from lmprefs.runtime.peak import matmul_peak

HERE = Path(__file__).resolve().parent

# report.json's stage names, in the order the quickstart runs them
STAGES = ("assets and model", "evaluate initial", "sample and label", "train reward model", "PPO", "evaluate final")

# the reduced run: about a quarter of the quickstart preset's labels (800), PPO updates (20) and held-out queries (256)
REDUCED = {"labels": 200, "updates": 5, "eval_queries": 64}
EVAL_SAMPLES = 2  # the quickstart's default --eval-samples


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def parse(argv):
    from lmprefs.config.overrides import split_overrides
    from lmprefs.errors import UserError

    p = ArgumentParser(prog="roofline.py", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="quickstart", help="the quickstart's preset (default: quickstart)")
    p.add_argument("--full", action="store_true", help="the preset as it is, with the quickstart's own defaults")
    p.add_argument("--labels", type=positive_int, default=None,
                   help=f"labels.num_train (reduced: {REDUCED['labels']})")  # fmt: skip
    p.add_argument("--updates", type=positive_int, default=None,
                   help=f"PPO updates of ppo.batch_size (reduced: {REDUCED['updates']})")  # fmt: skip
    p.add_argument("--eval-queries", type=positive_int, default=None,
                   help=f"held-out queries of each evaluation (reduced: {REDUCED['eval_queries']}; --full: 256)")
    p.add_argument("--eval-samples", type=positive_int, default=EVAL_SAMPLES, help="samples per held-out query")
    p.add_argument("--peak-size", type=positive_int, default=None,
                   help="side of the square matmul that measures the peak (2048 on a CPU, 8192 on CUDA)")
    p.add_argument("--peak-reps", type=positive_int, default=5, help="timed matmuls; the best one is the peak")
    p.add_argument("--run-dir", default=None, help="keep the quickstart's run here (default: a temporary directory)")
    p.add_argument("--count-flops", action="store_true",
                   help="also count each stage's FLOPs with torch's FlopCounterMode during the run (slower)")
    p.add_argument("--json", default=None, help="also write the figures here as one JSON object")
    try:
        rest, pairs = split_overrides(list(argv))
    except UserError as e:
        p.error(str(e))
    a = p.parse_args(rest)
    sizes = [f for f in ("labels", "updates", "eval_queries") if getattr(a, f) is not None]
    if a.full and sizes:
        p.error(f"--full runs the preset as it is: drop --{sizes[0].replace('_', '-')}")
    if a.eval_queries is not None and a.eval_queries < 2:
        p.error("--eval-queries must be at least 2 (a standard error needs two queries)")
    if a.run_dir and Path(a.run_dir).exists() and any(Path(a.run_dir).iterdir()):
        p.error(f"--run-dir {a.run_dir}: not empty; name a new directory")
    if a.json and Path(a.json).is_dir():
        p.error(f"--json {a.json}: is a directory")
    if a.json and not Path(a.json).resolve().parent.is_dir():
        p.error(f"--json {a.json}: no directory {Path(a.json).parent}")
    return a, pairs


def run_overrides(a, pairs, batch_size: int) -> list[tuple[str, str]]:
    """The overrides the quickstart runs with: the reduction (unless --full), then the user's own."""
    out = []
    if not a.full:
        updates = a.updates or REDUCED["updates"]
        out += [("labels.num_train", str(a.labels or REDUCED["labels"])),
                ("ppo.total_episodes", str(updates * batch_size))]  # fmt: skip
    out += list(pairs)
    if a.count_flops:  # FlopCounterMode sees no operator inside a compiled graph
        out.append(("run.compile", "off"))
    return out


def check_model(name: str) -> None:
    """A model the FLOP count cannot describe is refused before the run; one whose config cannot be read here (a
    missing asset, a hub name offline) is left to the quickstart, which says why in one line."""
    from lmprefs.assets.models import resolve_model
    from lmprefs.errors import UserError

    given = Path(name).expanduser()
    try:  # a directory's config is read as it is: the count needs no weights
        config = json.loads(((given if (given / "config.json").is_file() else Path(resolve_model(name))) /
                             "config.json").read_text())  # fmt: skip
    except Exception:
        return
    try:
        ModelFacts.from_config(config)
    except ValueError as e:
        raise UserError(f"task.initial_model={name}: {e}") from None


def fmt_row(cells, widths) -> str:
    pairs = enumerate(zip(cells, widths, strict=True))
    return "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in pairs)


def main(argv=None) -> int:
    a, pairs = parse(sys.argv[1:] if argv is None else argv)
    import lmprefs
    from lmprefs.runtime.resolve import resolve_config

    # a bad preset or override: one line, before anything runs (the batch size may be an override too)
    overrides = run_overrides(a, pairs, resolve_config(a.preset, pairs).ppo.batch_size)
    cfg = resolve_config(a.preset, overrides)
    check_model(cfg.task.initial_model)
    eval_queries = a.eval_queries or (256 if a.full else REDUCED["eval_queries"])
    qs_argv = ["--preset", a.preset, "--eval-queries", str(eval_queries), "--eval-samples", str(a.eval_samples),
               *[x for k, v in overrides for x in (f"--{k.replace('_', '-')}", v)]]  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="roofline-") as tmp:
        run_dir = Path(a.run_dir) if a.run_dir else Path(tmp) / "run"
        record_path = Path(tmp) / "record.json"
        child = [sys.executable, str(HERE / "_roofline_child.py"), str(record_path),
                 *(["--count"] if a.count_flops else []), "--run-dir", str(run_dir), *qs_argv]  # fmt: skip
        # the child imports this lmprefs, not another checkout's installed one
        root = str(Path(lmprefs.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        load_before = os.getloadavg()
        print(f"roofline: lmprefs quickstart {' '.join(qs_argv)}", flush=True)
        t0 = time.time()
        try:
            code = subprocess.run(child, env=env).returncode
        except KeyboardInterrupt:  # the child got the same interrupt and says where it stopped
            print("roofline.py: interrupted", file=sys.stderr)
            return 130
        wall = time.time() - t0
        rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if code == 2:  # the quickstart's own one-line error (a missing asset, a run directory in use) is above
            return 2
        if code != 0 or not (run_dir / "report.json").is_file() or not record_path.is_file():
            print(f"roofline.py: error: the quickstart run failed (exit {code}); its messages are above",
                  file=sys.stderr)  # fmt: skip
            return 1
        report = json.loads((run_dir / "report.json").read_text())
        record = json.loads(record_path.read_text())
    load_after = os.getloadavg()
    return finish(a, cfg, report, record, qs_argv=qs_argv, wall=wall, rss_kib=rss_kib,
                  loads=(load_before, load_after))  # fmt: skip


def finish(a, cfg, report, record, *, qs_argv, wall, rss_kib, loads) -> int:
    """The table (and --json) from the run's report.json and the child's record."""
    device, dtype, threads = record["device"], record["dtype"], record["threads"]
    facts, counts = flop_inputs(a, cfg, report, record)
    parts = stage_flops(cfg, facts, counts)
    size = a.peak_size or (8192 if device.startswith("cuda") else 2048)
    print(f"roofline: measuring the matmul peak ({dtype}, {size}x{size}, best of {a.peak_reps})", flush=True)
    peak = matmul_peak(device, dtype, threads, size, a.peak_reps)  # GFLOP/s
    counted = record.get("counted")
    rows = stage_rows(report, record, parts, peak)
    total = total_row(rows, peak, rss_kib, counted)

    size_note = "full preset" if a.full else (
        f"reduced: {cfg.labels.num_train} labels, {cfg.ppo.num_updates} PPO updates of {cfg.ppo.batch_size}")
    print(f"\nroofline of lmprefs quickstart --preset {a.preset} ({size_note}; {counts.eval_queries} held-out queries "
          f"x {a.eval_samples} samples)")  # fmt: skip
    route = ", fp32 linear layers through oneDNN" if record.get("fp32_linear") == "onednn" else ""
    print(f"machine: {device_name(device)}, {threads} threads, {dtype}{route}; matmul peak "
          f"{peak:.1f} GFLOP/s ({dtype} {size}x{size}, best of {a.peak_reps}); load average "
          f"{loads[0][0]:.2f} before, {loads[1][0]:.2f} after")  # fmt: skip
    print_table([*rows, total], counted=counted is not None)
    rss_mib = total["peak_rss_mib"]
    print(f"peak RSS of the run: {rss_mib:.0f} MiB (its largest process; by stage: the peak so far at the stage's "
          f"end); the whole child process took {wall:.1f} s")
    print("\nFLOPs by part (analytic):")
    for r in rows:
        for part, g in r["parts_gflop"].items():
            print(f"  {r['stage'] + ': ' + part:<44s} {g:12.3f} GFLOP  floor {g / peak:9.3f} s")
    if counted is not None:
        print("(--count-flops: seconds include FlopCounterMode's overhead)")

    if a.json:
        res = {"bench": "roofline", "preset": a.preset, "full": a.full, "quickstart_argv": qs_argv,
               "device": device, "dtype": dtype, "threads": threads, "machine": device_name(device),
               "fp32_linear": record.get("fp32_linear"),
               "peak": {"gflop_per_s": peak, "size": size, "reps": a.peak_reps, "dtype": dtype},
               "model": asdict(facts), "counts": counts._asdict(), "stages": rows, "total": total,
               "peak_rss_mib": rss_mib, "child_wall_s": wall, "loadavg_before": loads[0], "loadavg_after": loads[1],
               "lmprefs_source": source_fingerprint(), "count_flops": counted is not None}  # fmt: skip
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def flop_inputs(a, cfg, report, record) -> tuple[ModelFacts, Counts]:
    """What the FLOP count needs: the model's shape (from the config the child recorded) and the run's sizes."""
    from lmprefs.errors import UserError

    try:
        facts = ModelFacts.from_config(record["model_config"], cuda=record["device"].startswith("cuda"))
    except ValueError as e:
        raise UserError(str(e)) from None
    fig = report["figures"]
    counts = Counts(
        q_len=record["prefix"] + record["query_length"] + record["suffix"], train_queries=record["train_queries"],
        eval_queries=report["true_reward_before"]["n_queries"], eval_samples=a.eval_samples,
        questions=math.ceil(cfg.labels.num_train / (1 - cfg.labels.heldout_fraction)),
        labels_train=fig["rm_train"], labels_heldout=fig["rm_heldout"], updates=cfg.ppo.num_updates,
        shared_queries=record["attention"] in SDPA_LIKE,
    )  # fmt: skip
    return facts, counts


def stage_rows(report, record, parts: dict[str, dict[str, int]], peak: float) -> list[dict]:
    """A row of figures per stage: its seconds (report.json), FLOPs and their parts, against the peak; with the
    child's FlopCounterMode counts where it took them."""
    counted = record.get("counted")
    rows = []
    for stage in STAGES:
        seconds, flops = float(report["stages"][stage]), sum(parts[stage].values())
        row: dict[str, Any] = {"stage": stage, "seconds": seconds, "flops": flops, "gflop": flops / 1e9,
               "gflop_per_s": flops / 1e9 / seconds if seconds > 0 else 0.0, "peak_gflop_per_s": peak,
               "floor_s": flops / 1e9 / peak,
               "parts_gflop": {k: v / 1e9 for k, v in parts[stage].items()}}  # fmt: skip
        row["pct_of_peak"] = 100 * row["gflop_per_s"] / peak
        row["peak_rss_mib"] = record.get("peak_rss_mib", {}).get(stage)  # the process's peak so far, at its end
        if counted is not None:
            c = counted.get(stage, 0)
            row |= {"counted_flops": c, "counted_gflop": c / 1e9}
            row["analytic_over_counted"] = flops / c if c else (1.0 if flops == 0 else math.inf)
        rows.append(row)
    return rows


def total_row(rows: list[dict], peak: float, rss_kib: int, counted: dict | None) -> dict:
    """The stages' sum, with the largest process's peak RSS of the whole run."""
    secs, flops = sum(r["seconds"] for r in rows), sum(r["flops"] for r in rows)
    gflop = flops / 1e9
    total = {"stage": "total", "seconds": secs, "flops": flops, "gflop": gflop,
             "gflop_per_s": gflop / secs if secs > 0 else 0.0, "peak_gflop_per_s": peak,
             "floor_s": gflop / peak}  # fmt: skip
    total["pct_of_peak"] = 100 * total["gflop_per_s"] / peak
    total["peak_rss_mib"] = rss_kib / 1024
    if counted is not None:
        c = sum(counted.values())
        total |= {"counted_flops": c, "counted_gflop": c / 1e9,
                  "analytic_over_counted": flops / c if c else math.inf}  # fmt: skip
    return total


def print_table(rows: list[dict], *, counted: bool) -> None:
    head = ["stage", "seconds", "GFLOP", "GFLOP/s", "peak GFLOP/s", "% of peak", "floor s", "peak RSS MiB"]
    if counted:
        head += ["counted GFLOP", "analytic/counted"]
    widths = [max(len(h), 18) if i == 0 else max(len(h), 9) for i, h in enumerate(head)]
    print(fmt_row(head, widths))
    for r in rows:
        cells = [r["stage"], f"{r['seconds']:.2f}", f"{r['gflop']:.2f}", f"{r['gflop_per_s']:.2f}",
                 f"{r['peak_gflop_per_s']:.1f}", f"{r['pct_of_peak']:.1f}", f"{r['floor_s']:.2f}",
                 "" if r.get("peak_rss_mib") is None else f"{r['peak_rss_mib']:.0f}"]  # fmt: skip
        if counted:
            cells += [f"{r['counted_gflop']:.2f}", f"{r['analytic_over_counted']:.4f}"]
        print(fmt_row(cells, widths))


if __name__ == "__main__":
    sys.exit(run_main(main))
