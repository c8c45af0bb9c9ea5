"""The config a command runs: a preset or a saved config.json, with overrides, checked against this machine
(a tracker that is not installed, a CUDA device where there is none) before any work starts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lmprefs.config import PRESETS, Config, preset
from lmprefs.config.overrides import ConfigError, all_keys, apply_overrides, set_value
from lmprefs.io.config_file import load_config
from lmprefs.io.inputs import lm_dir
from lmprefs.runtime.device import pick_device
from lmprefs.runtime.runlog import check_trackers


def resolve_config(preset_name: str, pairs=(), config_file: str | Path | None = None,
                   values: dict[str, Any] | None = None, origin: str = "command line") -> Config:  # fmt: skip
    """The config a command (or the Python API) runs with: the preset called `preset_name`, or a saved config.json,
    with the dotted text overrides `pairs` ([("ppo.lr", "2e-5")]) and then `values` ({"ppo.lr": 2e-5}: Python
    values, or strings parsed as on the command line) applied and validated, and checked against this machine
    (the trackers of run.report_to installed, CUDA present when run.device asks for it), so that a bad value is one
    line before any file is opened or model loaded."""

    if config_file:
        cfg = load_config(Path(config_file))
    else:
        try:
            cfg = preset(preset_name)
        except KeyError:
            raise ConfigError(f"unknown preset {preset_name!r}; presets: {', '.join(PRESETS)}") from None
    cfg = apply_overrides(cfg, list(pairs), origin)
    keys = all_keys()
    for k, v in (values or {}).items():
        if isinstance(v, str) or k.replace("-", "_") not in keys:  # strings parse as text; unknown keys: named
            cfg = apply_overrides(cfg, [(k, str(v))], origin)
        else:
            cfg = set_value(cfg, k, tuple(v) if isinstance(v, list) else v, origin)
    check_runnable(cfg)
    return cfg


def check_runnable(cfg: Config) -> None:
    """A UserError when this machine cannot run cfg: a tracker of run.report_to not installed, a CUDA device asked
    for where there is none, more run.threads than it has CPUs, or a task.initial_model directory that holds no
    language model (a run, a reward model); checked before any work, so an hour of training never ends in it."""

    check_trackers(cfg.run.report_to)
    lm_dir(cfg.task.initial_model, "task.initial_model=")  # a run or a reward model loads as no language model
    cpus = os.cpu_count()
    if cpus and cfg.run.threads > cpus:  # torch starts every one of them (or overflows past 32 bits)
        raise ConfigError(f"run.threads={cfg.run.threads}: this machine has {cpus} CPUs; 0 uses torch's default")
    if cfg.run.device.startswith("cuda"):
        pick_device(cfg.run.device, "run.device")
