"""A run directory: config.json, TensorBoard event files under the original's metric names, metrics.jsonl,
samples.jsonl, and a progress bar with an ETA. Small on purpose: no logging framework, no callbacks."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from lmprefs.config import Config
from lmprefs.overrides import save_config, to_dict


def default_run_dir(command: str, preset: str) -> Path:
    """runs/COMMAND-PRESET-TIME; under several ranks, rank 0's clock names it for all."""
    name = f"{command}-{preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    if "WORLD_SIZE" in os.environ:
        from lmprefs.distributed import broadcast_object

        name = broadcast_object(name)
    return Path("runs") / name


def open_logger(run_dir: Path, cfg: Config, subdir: str = "", resume_step: int | None = None):
    """A RunLogger on rank 0; on the other ranks one that writes nothing (they log the same reduced metrics)."""
    from lmprefs.distributed import is_main

    return RunLogger(run_dir, cfg, subdir, resume_step) if is_main() else NullLogger()


class NullLogger:
    """What ranks other than 0 log to."""

    def scalars(self, stats: dict[str, float], step: int) -> None:
        pass

    def samples(self, rows: list[dict], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class RunLogger:
    """Owns the run directory's logs. `resume_step` drops metric rows written after the checkpoint being resumed,
    so a resumed run's metrics.jsonl reads as if the run had never stopped."""

    def __init__(self, run_dir: Path, cfg: Config, subdir: str = "", resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.json")
        self.dir = self.run_dir / subdir if subdir else self.run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        if resume_step is not None:
            for p in (self.metrics_path, self.samples_path):
                truncate_jsonl(p, resume_step)
        # purge_step: TensorBoard drops the events of steps after the checkpoint that an earlier process wrote
        self.writer = SummaryWriter(str(self.dir), purge_step=None if resume_step is None else resume_step + 1)
        if resume_step is None:
            table = "|key|value|\n|-|-|\n" + "\n".join(
                f"|{s}.{k}|{v}|" for s, sub in to_dict(cfg).items() for k, v in sub.items()
            )
            self.writer.add_text("hyperparameters", table)

    def scalars(self, stats: dict[str, float], step: int) -> None:
        for k, v in stats.items():
            self.writer.add_scalar(k, v, step)
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps({"step": step, **{k: _finite(v) for k, v in stats.items()}}) + "\n")

    def samples(self, rows: list[dict], step: int) -> None:
        with open(self.samples_path, "a") as f:
            for r in rows:
                f.write(json.dumps({"step": step, **r}) + "\n")

    def close(self) -> None:
        self.writer.close()


def _finite(v: float):
    v = float(v)
    return v if math.isfinite(v) else str(v)


def truncate_jsonl(path: Path, last_step: int, key: str = "step") -> None:
    """Drop the rows whose `key` is past last_step, by writing a new file and swapping it in (a kill meanwhile
    leaves the old file whole). A torn last line (killed mid-append) is dropped too."""
    from lmprefs.overrides import atomic_write_text

    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)[key] <= last_step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write_text(path, "".join(line + "\n" for line in keep))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def progress(total: int, desc: str, initial: int = 0):
    """A tqdm bar with an ETA on stderr; quiet when stderr is not a terminal except for periodic lines; shown by
    rank 0 only when several ranks run."""
    from tqdm import tqdm

    quiet = os.environ.get("RANK", "0") != "0"
    return tqdm(total=total, desc=desc, initial=initial, file=sys.stderr, dynamic_ncols=True, disable=quiet,
                mininterval=1.0 if sys.stderr.isatty() else 10.0, unit="it", smoothing=0.1)  # fmt: skip
