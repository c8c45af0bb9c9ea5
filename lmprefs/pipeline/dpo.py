"""`lmprefs train-dpo` end to end: the store's preference labels split as the reward model's are, the policy (a copy
of the initial model, or a LoRA adapter on it) and its frozen reference, DPO with checkpoints, and the policy saved
as train-policy saves its own (`lmprefs sample RUN_DIR` reads it)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import cast

import torch
from torch import nn

from lmprefs.config import Config
from lmprefs.data.chat import task_frame, template_lengths
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.io.config_file import save_config
from lmprefs.io.locks import run_lock
from lmprefs.models.artifacts import save_policy
from lmprefs.models.loading import load_lm, max_positions
from lmprefs.models.lora import add_adapter
from lmprefs.models.model_card import CardInfo
from lmprefs.models.policy import Policy
from lmprefs.pipeline.labeling import label_source
from lmprefs.pipeline.reward_model import TrainingLabels, training_labels
from lmprefs.pipeline.task import Task, note_chat_template
from lmprefs.runtime.device import setup_torch
from lmprefs.runtime.runlog import RunLogger, check_trackers
from lmprefs.training.dpo_train import checkpoint_step, train_dpo

RUN_FILE = "run.json"  # the label store a run trains on, which --resume reuses


def dpo_task(cfg: Config) -> Task:
    """The initial model, its tokenizer and the task's query framing, without the task's queries: DPO reads the
    store's, so a query dataset that is not on this machine (a hub dataset, offline) is never loaded."""
    device, dtype = setup_torch(cfg.run)
    torch.manual_seed(cfg.run.seed)
    model, tok = load_lm(cfg.task.initial_model, device)
    prefix, suffix = task_frame(cfg.task, tok)
    total = len(prefix) + cfg.task.query_length + len(suffix) + cfg.task.response_length
    if total > max_positions(model):
        raise UserError(f"task.query_length={cfg.task.query_length} + prefix/suffix + task.response_length="
                        f"{cfg.task.response_length} = {total} tokens exceeds the model's context of "
                        f"{max_positions(model)}")  # fmt: skip
    none = torch.zeros(0, cfg.task.query_length, dtype=torch.long)
    note_chat_template(cfg, tok)
    return Task(cfg, device, dtype, model, tok, none, none, prefix, suffix, template_lengths(cfg.task, tok))


def dpo_labels(t: Task, store, source: str) -> TrainingLabels:
    """The store's preference labels, split into training and held-out labels as the reward model's are
    (labels.heldout_by, labels.num_train, labelers under labels.min_gold_accuracy dropped). Refuses, naming the
    value, a label type that states no preference and a store that holds no best-of-N (best_of_2: pairwise)
    labels."""
    lab = t.cfg.labels
    if lab.type == "scalar_compare" or (lab.type == "scalar_rating" and lab.scores_as == "rating"):
        raise UserError(f"labels.type={lab.type} (labels.scores_as={lab.scores_as}): train-dpo learns from "
                        "preferences, best_of_N labels (best_of_2 for pairs), or per-response scores compared within "
                        "a prompt: --labels.type scalar_rating --labels.scores-as comparisons")  # fmt: skip
    held = store.label_types()
    if not any(k.startswith("best_of_") or (k == "scalar_rating" == lab.type) for k in held):
        what = f"only {', '.join(held)} labels" if held else "no labels at all"
        fix = ("compare its per-response scores within each prompt with --labels.type scalar_rating "
               "--labels.scores-as comparisons, or add" if "scalar_rating" in held else "add")  # fmt: skip
        raise UserError(f"{source}: the label store holds no best-of-N or pairwise labels ({what}), which train-dpo "
                        f"learns from; {fix} some with `lmprefs label` or `lmprefs import-labels FILE`")  # fmt: skip
    return training_labels(t, store)


def dpo_policy(t: Task) -> tuple[Policy, object | None]:
    """(the policy to train, its frozen reference): with LoRA a 'policy' adapter on the initial model, whose base
    with adapters off is the reference (None: no second copy); else a copy of the initial model, the initial model
    itself the reference."""
    cfg, model = t.cfg, cast(nn.Module, t.model)
    if cfg.lora.rank > 0:
        add_adapter(model, cfg.lora, "policy", seed=cfg.run.seed + 3)  # the seed train-policy's adapter starts from
        return Policy(model, t.tok, cfg.task.temperature, adapter="policy").to(t.device), None
    policy = Policy(copy.deepcopy(model), t.tok, cfg.task.temperature).to(t.device)
    return policy, model.requires_grad_(False).eval()


def run_train_dpo(cfg: Config, run_dir: Path, *, store_path: str | None = None, resume: bool = False) -> dict:
    """Train a policy with DPO on the labels of `store_path` (else labels.source, else labels.sqlite) into
    run_dir/policy; resume: continue run_dir from its checkpoint, on the store it started with (from step 0 when
    it was stopped before its first checkpoint). Every input is checked before anything is written. Returns the
    summary."""
    run_dir = Path(run_dir)
    if (run_dir / "policy").exists():
        raise UserError(f"{run_dir} already holds a trained policy; choose another --run-dir")
    if resume:
        store_path = _resumed_store(run_dir, store_path)
    elif (run_dir / "checkpoint").exists() or (run_dir / RUN_FILE).exists():
        raise UserError(f"{run_dir} already holds a train-dpo run; pass --resume to continue it, or another --run-dir")
    source = store_path or cfg.labels.source or "labels.sqlite"
    store = label_source(source)
    t = dpo_task(cfg)
    labels = dpo_labels(t, store, f"--db {source}")
    policy, ref_lm = dpo_policy(t)
    check_trackers(cfg.run.report_to)  # a tracker's missing package, before the run directory is made
    with run_lock(run_dir, "train-dpo"):
        done = checkpoint_step(run_dir) if resume else None
        if not resume:  # config.json first, as train-policy writes them: --resume reads it, and a run.json (which
            # a start without --resume refuses) implies it, so a kill between the two never leaves a run neither starts
            save_config(cfg, run_dir / "config.json")
            atomic_write_text(run_dir / RUN_FILE, json.dumps({"store": str(Path(source).resolve())}))
        elif done is None:
            print(f"{run_dir} has no checkpoint yet: starting the run over from step 0", flush=True)
        # a run started over drops every row it logged (-1); a resumed one those after its checkpoint
        again = None if not resume else -1 if done is None else done - 1
        log = RunLogger(run_dir, cfg, resume_step=again, resume_phase="dpo")
        try:
            summary = train_dpo(cfg, policy, labels.train, labels.held, t.ctx, ref_lm=ref_lm, log=log,
                                run_dir=run_dir, resume=done is not None)  # fmt: skip
        finally:
            log.close()
        results = {k.replace("heldout/", "held-out "): v for k, v in summary.items()
                   if k.startswith("heldout/") and isinstance(v, float)}  # fmt: skip
        counts = {"for training": summary["dpo/labels_train"]} if "dpo/labels_train" in summary else {}
        # with LoRA: the adapter in peft's format and the merged model
        save_policy(policy, run_dir / "policy", card=CardInfo("dpo", cfg, results, counts))
    return summary | {"heldout/split": labels.split}


def _resumed_store(run_dir: Path, given: str | None) -> str:
    """The store the run started on (its run.json); another --db is refused."""
    if not (run_dir / RUN_FILE).is_file():
        raise UserError(f"--resume: {run_dir} holds no train-dpo run (no {RUN_FILE}); start it without --resume")
    meta = json.loads((run_dir / RUN_FILE).read_text())
    if meta.get("online"):
        raise UserError(f"--resume: the run in {run_dir} is an online DPO run; resume it with --online")
    started = meta["store"]
    if given is not None and str(Path(given).resolve()) != started:
        raise UserError(f"--resume: the run in {run_dir} trains on --db {started}, not {given}; resuming cannot "
                        "change what it computes (start a new --run-dir)")  # fmt: skip
    return started
