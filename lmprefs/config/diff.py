"""Two configs compared: what a resumed run may change (logging, saving, threads) and what changes its math."""

from __future__ import annotations

import hashlib
import json

from lmprefs.config.overrides import to_dict
from lmprefs.config.schema import Config

# keys that change how often things are written or how many threads run, never the numbers a run computes
NOT_MATH = ("run.log_interval", "run.save_interval", "run.threads", "run.save_dir", "lora.merged_reward_model")
# keys added to a section after configs were saved without them, and the value those configs computed with
ADDED_KEYS = {"task.chat_template": "false"}


def flat_config(cfg) -> dict:
    """{"section.key": value} of a Config, as JSON has it (tuples are lists), so it compares with a saved one."""

    return json.loads(json.dumps({f"{s}.{k}": v for s, sub in to_dict(cfg).items() for k, v in sub.items()}))


def config_meta(cfg) -> dict:
    """What a checkpoint's manifest records of its config: every value, and a fingerprint of those that change
    the math."""
    flat = flat_config(cfg)
    math_part = {k: v for k, v in flat.items() if k not in NOT_MATH}
    digest = hashlib.sha256(json.dumps(math_part, sort_keys=True).encode()).hexdigest()
    return {"config": flat, "fingerprint": digest}


def math_changes(old: dict, new: dict) -> list[str]:
    """'key old -> new' for each value that changes the math between two flat configs. A key that `old` lacks was
    added to lmprefs after it was saved (a checkpoint of an earlier version): the run computed as that key's value
    in ADDED_KEYS says, or else as its default does (a new option starts at what the code did before it), so only
    a value other than that is a change."""
    keys = sorted((set(old) | set(new)) - set(NOT_MATH))
    if old:
        defaults = flat_config(Config())
        old = {**{k: ADDED_KEYS.get(k, defaults.get(k)) for k in new if k not in old}, **old}
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]
