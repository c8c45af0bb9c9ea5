"""A run's config.json: written atomically, read back with unknown keys and bad values refused."""

from __future__ import annotations

import json
from pathlib import Path

from lmprefs.config import Config
from lmprefs.config.overrides import ConfigError, from_dict, to_dict
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.io.inputs import read_text

# Fields added after earlier versions saved their runs, with the value that reproduces what such a run did: a
# config.json without them is read as its run was computed, not with today's default.
EARLIER_DEFAULTS = {("task", "crop_local_files"): True}


def save_config(cfg: Config, path: Path) -> None:
    atomic_write_text(path, json.dumps(to_dict(cfg), indent=2) + "\n")


def load_config(path: Path) -> Config:
    path = Path(path)
    try:
        text = read_text(path, "config file")
    except UserError as e:
        raise ConfigError(str(e)) from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply to be a config") from None
    if isinstance(d, dict) and ("model_type" in d or "architectures" in d):
        raise ConfigError(f"{path}: the config.json of a saved model, not of an lmprefs run{_run_hint(path.parent)}")
    if isinstance(d, dict):
        for (section, key), value in EARLIER_DEFAULTS.items():
            if isinstance(d.get(section), dict) and key not in d[section]:
                d[section][key] = value
    return from_dict(d, Config, origin=str(path))


def _run_hint(model_dir: Path) -> str:
    """'; pass the run directory (RUN), not its policy/' when model_dir is a model saved inside a run (RUN/policy,
    RUN/checkpoint/policy, RUN/sft/sft_model), else ''."""
    for run in list(model_dir.parents)[:3]:
        try:
            d = json.loads((run / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and "task" in d and "ppo" in d:
            return f"; pass the run directory ({run}), not its {model_dir.relative_to(run)}/"
    return ""
