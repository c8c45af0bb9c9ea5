"""A run directory: config.json, TensorBoard event files under the original's metric names, metrics.jsonl,
samples.jsonl, optional W&B / MLflow runs (run.report_to), and a progress bar with an ETA. Small on purpose: no
logging framework, no callbacks."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from lmprefs.config import Config
from lmprefs.config.overrides import to_dict
from lmprefs.errors import UserError
from lmprefs.io.atomic import writing
from lmprefs.io.config_file import save_config
from lmprefs.io.jsonl import read_jsonl, truncate_jsonl
from lmprefs.runtime.distributed import broadcast_object, is_main

if TYPE_CHECKING:  # imported for its type only: tensorboard loads on the first scalars of a run that reports to it
    from torch.utils.tensorboard import SummaryWriter


def default_run_dir(command: str, preset: str) -> Path:
    """runs/COMMAND-PRESET-TIME; under several ranks, rank 0's clock names it for all."""
    name = f"{command}-{preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    if "WORLD_SIZE" in os.environ:
        name = broadcast_object(name)
    return Path("runs") / name


def open_logger(run_dir: Path, cfg: Config, resume_step: int | None = None, resume_phase: str = "policy"):
    """A RunLogger on rank 0; on the other ranks one that writes nothing (they log the same reduced metrics)."""
    return RunLogger(run_dir, cfg, resume_step, resume_phase) if is_main() else NullLogger()


class NullLogger:
    """What ranks other than 0 log to."""

    def scalars(self, stats: dict[str, float], step: int, phase: str = "policy") -> None:
        pass

    def samples(self, rows: list[dict], step: int) -> None:
        pass

    def close(self) -> None:
        pass


TRACKERS = ("tensorboard", "wandb", "mlflow")
PHASES = ("reward", "policy", "sft", "dpo")


def check_trackers(names: tuple[str, ...]) -> None:
    """A UserError naming the first tracker of run.report_to whose package is missing (checked before any work)."""
    import importlib.util

    for name in names:
        if name in ("wandb", "mlflow") and importlib.util.find_spec(name) is None:
            raise UserError(f"run.report_to={','.join(names)}: the {name} package is not installed "
                            f"(pip install {name}), or drop {name} from run.report_to")  # fmt: skip


class RunLogger:
    """Owns the run directory's logs, in one layout for every command: config.json; metrics.jsonl, each row tagged
    with its phase ("reward": reward-model training, stepped by labels seen; "policy": PPO, stepped by updates;
    "sft", "dpo": supervised fine-tuning, DPO, stepped by optimizer steps); samples.jsonl; TensorBoard event files
    under logs/PHASE/ (one step axis each, the original's metric names as tags); and, when run.report_to names them,
    Weights & Biases and MLflow runs with the names prefixed by the phase ("policy/objective/kl"). `resume_step`
    drops the `resume_phase` rows written after the checkpoint being resumed, so a resumed run's metrics.jsonl reads
    as if the run had never stopped."""

    def __init__(self, run_dir: Path, cfg: Config, resume_step: int | None = None, resume_phase: str = "policy"):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.json")
        self.cfg, self.resume = cfg, resume_step is not None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        if resume_step is not None:
            truncate_jsonl(self.metrics_path, resume_step, phase=resume_phase)
            truncate_jsonl(self.samples_path, resume_step)
        self.resume_step, self.resume_phase = resume_step, resume_phase
        names = cfg.run.report_to
        check_trackers(names)
        self.writers: dict[str, SummaryWriter] = {}  # phase -> SummaryWriter, opened on the phase's first scalars
        self.wandb = self.mlflow = None
        if "wandb" in names:
            import wandb  # only when asked: it is optional and its init may reach the network (WANDB_MODE=offline)

            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "lmprefs"), name=self.run_dir.name,
                                    dir=str(self.run_dir), config=to_dict(cfg), resume="allow",
                                    id=_stable_id(self.run_dir))  # fmt: skip
            for phase in PHASES:
                self.wandb.define_metric(f"{phase}/step")
                self.wandb.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
        if "mlflow" in names:
            self.mlflow = _start_mlflow(self.run_dir, cfg, self.resume)

    def _writer(self, phase: str):
        if "tensorboard" not in self.cfg.run.report_to:
            return None
        if phase not in self.writers:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard drops the policy events past the checkpoint that an earlier process wrote
            purge = self.resume_step + 1 if self.resume_step is not None and phase == self.resume_phase else None
            logs = self.run_dir / "logs" / phase
            # the hyperparameters once per phase: written by the first process to log it, which a resumed run is
            # when the killed one never got this far (a kill while the reward model trained: logs/policy is empty).
            # Purges keep text, so where an earlier process wrote them they stay
            first = not self.resume or not any(logs.glob("events.out.tfevents.*"))
            w = SummaryWriter(str(logs), purge_step=purge)
            if first:
                w.add_text("hyperparameters", "|key|value|\n|-|-|\n" + "\n".join(
                    f"|{s}.{k}|{v}|" for s, sub in to_dict(self.cfg).items() for k, v in sub.items()))  # fmt: skip
            self.writers[phase] = w
        return self.writers[phase]

    def scalars(self, stats: dict[str, float], step: int, phase: str = "policy") -> None:
        assert phase in PHASES, phase
        w = self._writer(phase)
        for k, v in stats.items():
            if w is not None:
                w.add_scalar(k, v, step)
        with writing(self.metrics_path), open(self.metrics_path, "a") as f:
            f.write(json.dumps({"phase": phase, "step": step, **{k: _finite(v) for k, v in stats.items()}}) + "\n")
        named = {f"{phase}/{k}": float(v) for k, v in stats.items() if math.isfinite(float(v))}
        if self.wandb is not None:
            self.wandb.log(named | {f"{phase}/step": step})
        if self.mlflow is not None:
            self.mlflow.log_metrics(named, step=step)

    def samples(self, rows: list[dict], step: int) -> None:
        with writing(self.samples_path), open(self.samples_path, "a") as f:
            for r in rows:
                f.write(json.dumps({"step": step, **r}) + "\n")

    def close(self) -> None:
        for w in self.writers.values():
            w.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.mlflow is not None:
            self.mlflow.end_run()


def _start_mlflow(run_dir: Path, cfg: Config, resume: bool):
    """The mlflow module with a run started. Without MLFLOW_TRACKING_URI the store is RUN_DIR/mlflow.db (SQLite):
    mlflow 3 refuses a file store (./mlruns) unless MLFLOW_ALLOW_FILE_STORE is set. A store mlflow refuses (a
    tracking URI it cannot use) is one line naming it."""
    import mlflow  # only when asked: it is optional

    uri = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        if not uri:
            mlflow.set_tracking_uri(f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
        mlflow.start_run(run_name=run_dir.name)
    except Exception as e:
        if type(e).__name__ != "MlflowException":
            raise
        first = (str(e).strip().splitlines() or [""])[0][:300]
        where = f"MLFLOW_TRACKING_URI={uri}" if uri else f"the store {run_dir / 'mlflow.db'}"
        raise UserError(f"run.report_to=mlflow: mlflow refuses {where} ({first})") from None
    if not resume:
        mlflow.log_params({f"{s}.{k}": v for s, sub in to_dict(cfg).items() for k, v in sub.items()})
    return mlflow


def _stable_id(run_dir: Path) -> str:
    """The same tracker run id for a run directory across resumes."""
    import hashlib

    return hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]


def _finite(v: float):
    v = float(v)
    return v if math.isfinite(v) else str(v)


def read_metrics(path: Path, phase: str = "policy") -> list[dict]:
    """The metrics.jsonl rows of one phase."""
    return [r for r in read_jsonl(path) if r.get("phase", "policy") == phase]


def progress(total: int, desc: str, initial: int = 0):
    """A tqdm bar with an ETA on stderr; quiet when stderr is not a terminal except for periodic lines; shown by
    rank 0 only when several ranks run."""
    from tqdm import tqdm

    quiet = os.environ.get("RANK", "0") != "0"
    bar = tqdm(total=total, desc=desc, initial=initial, file=sys.stderr, dynamic_ncols=True, disable=quiet,
               mininterval=1.0 if sys.stderr.isatty() else 10.0, unit="it", smoothing=0.1)  # fmt: skip
    _bars.add(bar)
    return bar


_bars: weakref.WeakSet = weakref.WeakSet()


def close_progress() -> None:
    """Close the bars still open: a command that ends in an error mid-bar prints its line on a line of its own."""
    for bar in list(_bars):
        bar.close()
