"""lmprefs: fine-tuning language models from human preferences, in PyTorch.

The Python API: the CLI's steps as functions (each imports torch and transformers only when called, so
`import lmprefs` stays cheap).

    import lmprefs

    cfg = lmprefs.make_config("tiny", {"ppo.lr": 1e-3, "lora.rank": 0})
    lmprefs.label(cfg, "labels.sqlite", n=64)                      # simulated labeler: cfg.labels.labeler
    rm = lmprefs.train_reward(cfg, "labels.sqlite", "runs/rm")     # -> {"reward_model": path, "summary": {...}}
    out = lmprefs.train_policy(cfg, "runs/ppo", reward=lambda texts: [t.count("!") for t in texts])
    print(lmprefs.sample("runs/ppo", n=2))                         # [(query, response), ...]
    print(lmprefs.score(rm["reward_model"], ["What a lovely day."]))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__version__ = "0.1.0"
__all__ = ["make_config", "label", "train_reward", "train_policy", "sample", "score", "optimal_frontier"]


def make_config(preset: str = "tiny", overrides: dict[str, Any] | None = None, *,
                config_file: str | Path | None = None):  # fmt: skip
    """A validated Config: a preset (or a saved config.json) with dotted overrides, {"ppo.lr": 1e-3}. Values are
    Python values, or strings parsed as on the command line ("None", "q_proj,v_proj")."""
    from lmprefs.runtime.resolve import resolve_config

    return resolve_config(preset, (), config_file, overrides, origin="Python API")


def label(cfg, db: str | Path, n: int, *, labeler: str | None = None, seed: int | None = None,
          run_dir: str | Path | None = None) -> dict:  # fmt: skip
    """Sample n best-of-N questions from the initial policy into the label store `db` and have the simulated
    labeler (`labeler`, default cfg.labels.labeler; "none" only queues them for people) answer them. With
    cfg.labels.select bald or spread, in rounds chosen by an ensemble (`lmprefs label`'s), saved under `run_dir`
    (required then); returns {"rounds": one row per round}."""
    from lmprefs.labels.store import check_store_path
    from lmprefs.pipeline.labeling import collect_labels, open_store
    from lmprefs.pipeline.task import setup_task

    path = check_store_path(db, must_exist=False)
    if cfg.labels.select == "random":
        return collect_labels(setup_task(cfg), open_store(db), n, labeler=labeler, seed=seed)
    from lmprefs.errors import UserError
    from lmprefs.pipeline.label_rounds import check_first_round, label_in_rounds

    if run_dir is None:
        raise UserError(f"labels.select={cfg.labels.select}: label() needs run_dir= for the rounds' ensembles")
    name = labeler or cfg.labels.labeler
    check_first_round(path, cfg, name, str(db))
    t = setup_task(cfg)
    rows = label_in_rounds(t, open_store(db), n, labeler=name, seed=cfg.run.seed if seed is None else seed,
                           run_dir=Path(run_dir))  # fmt: skip
    return {"rounds": rows}


def train_reward(cfg, labels: str | Path, run_dir: str | Path) -> dict:
    """Train a reward model from a label store (or a label file) into run_dir/reward_model; its held-out figures."""
    from lmprefs.pipeline.labeling import label_source
    from lmprefs.pipeline.reward_training import train_reward_model
    from lmprefs.pipeline.task import setup_task
    from lmprefs.runtime.runlog import RunLogger

    run_dir = Path(run_dir)
    store = label_source(str(labels))
    log = RunLogger(run_dir, cfg)
    try:
        _, summary = train_reward_model(setup_task(cfg), store, run_dir / "reward_model", log)
    finally:
        log.close()
    return {"reward_model": run_dir / "reward_model", "summary": summary}


def train_policy(cfg, run_dir: str | Path, *, reward=None, labels: str | Path | None = None,
                 resume: bool = False) -> dict:  # fmt: skip
    """PPO against `reward`: None (a reward model: cfg.rewards.trained_model, or one trained first from `labels`),
    a built-in name ("vader"), "module:function", or a callable list[str] -> list[float] on response texts
    (normalized on initial-policy samples like a reward model). Returns the last update's stats and the paths."""
    from lmprefs.pipeline.policy import run_train_policy

    run_dir = Path(run_dir)
    out = run_train_policy(cfg, run_dir, reward=reward, store_path=str(labels) if labels else None, resume=resume)
    return {"stats": out["stats"], "policy": run_dir / "policy", "reward": out.get("reward")}


def sample(source, n: int = 4, *, temperature: float | None = None, seed: int | None = None,
           split: str = "heldout") -> list[tuple[str, str]]:  # fmt: skip
    """(query, response) texts from a train-policy run directory, or from the initial model of a Config."""
    from lmprefs.io.config_file import load_config
    from lmprefs.recipes.sample import sample_texts

    if isinstance(source, str | Path):
        return sample_texts(load_config(Path(source) / "config.json"), n, Path(source) / "policy", temperature, seed,
                            split)  # fmt: skip
    return sample_texts(source, n, None, temperature, seed, split)


def score(reward_model: str | Path, texts: list, *, device: str = "auto", truncate: bool = False) -> list[float]:
    """Rewards of texts (a response, or a (query, response) pair) under a saved reward model directory (lmprefs'
    or any scalar sequence classifier, e.g. TRL's), or an ensemble directory: the members' mean."""
    from lmprefs.models.ensemble import load_reward
    from lmprefs.recipes.score import reward_model_task, score_texts
    from lmprefs.runtime.device import pick_device

    path = Path(reward_model)
    task = reward_model_task(path)
    pairs = [tuple(t) if isinstance(t, tuple | list) else ("", t) for t in texts]
    dev = pick_device(device)
    return score_texts(load_reward(path, dev).eval(), task, pairs, dev, truncate=truncate)[0]


def optimal_frontier(rewards, betas, min_ess: float = 10.0) -> list[dict]:
    """The paper's Figure 3 yardstick from your own samples: rewards [Q][M] of M samples of the initial policy for
    each of Q queries -> per beta, E*[r] and KL(pi*, rho) of pi* ~ rho exp(r/beta), averaged over queries, with
    Monte Carlo standard errors, effective sample sizes and whether to trust the point
    (lmprefs/training/frontier.py)."""
    import torch

    from lmprefs.training.frontier import frontier

    return frontier(torch.as_tensor(rewards, dtype=torch.float64), betas, min_ess)
