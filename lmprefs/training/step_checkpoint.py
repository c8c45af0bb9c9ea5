"""The checkpoint of a trainer that is a list of parameters and one optimizer stepped in a fixed order (train-sft,
train-dpo): written atomically every run.save_interval steps, and loaded only by a run whose config computes the
same (config.diff.math_changes). PPO's checkpoint holds more (generators, the KL controller, the query stream):
training.policy_checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from lmprefs.config import Config
from lmprefs.config.diff import config_meta, math_changes
from lmprefs.errors import UserError
from lmprefs.io.publish import latest_good
from lmprefs.models.artifacts import atomic_dir


def save_step_checkpoint(run_dir: Path, cfg: Config, step: int, params, opt, state: dict, meta: dict) -> None:
    """RUN_DIR/checkpoint at `step`: the parameters, the optimizer and the trainer's own `state` (plain types and
    tensors), with `meta` beside the config in its manifest."""
    full = {"step": step, "params": [p.detach().cpu() for p in params], "optimizer": opt.state_dict(), **state}
    with atomic_dir(Path(run_dir) / "checkpoint", {"step": step, **meta, **config_meta(cfg)}, keep=1) as tmp:
        torch.save(full, tmp / "state.pt")


def load_step_checkpoint(run_dir: Path, cfg: Config, params, opt, what: str) -> tuple[dict, dict]:
    """(state, manifest) of RUN_DIR's last good checkpoint, its parameters and optimizer state loaded into `params`
    and `opt`; one line naming the run (`what`: the trainer) when there is none or its config computed otherwise."""
    found = latest_good(Path(run_dir) / "checkpoint")
    if found is None:
        raise UserError(f"{run_dir} has no {what} checkpoint to resume")
    path, manifest = found
    changed = math_changes(manifest.get("config", {}), config_meta(cfg)["config"])
    if changed:
        raise UserError(f"{run_dir}: the checkpoint was trained with another config ({'; '.join(changed[:3])})")
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    with torch.no_grad():
        for p, v in zip(params, state["params"], strict=True):
            p.copy_(v)
    opt.load_state_dict(state["optimizer"])
    return state, manifest
