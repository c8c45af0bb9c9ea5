"""A run's config.json: written atomically, read back with unknown keys and bad values refused."""

from __future__ import annotations

import json
from pathlib import Path

from lmprefs.config import Config
from lmprefs.config.overrides import ConfigError, from_dict, to_dict
from lmprefs.io.atomic import atomic_write_text


def save_config(cfg: Config, path: Path) -> None:
    atomic_write_text(path, json.dumps(to_dict(cfg), indent=2) + "\n")


def load_config(path: Path) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    return from_dict(d, Config, origin=str(path))
