"""`lmprefs label` with directed selection (labels.select bald or spread): questions asked in rounds of
labels.select_round. Before each round a reward-model ensemble (train_reward.ensemble members) is trained on every
label of labels.type in the store, a pool of labels.pool_factor times the round's questions is sampled from the
initial policy as `lmprefs label` samples them, and the round asks the ones the ensemble's acquisition ranks
highest. A store with fewer labels than one round starts with a round of random questions; with no simulated
labeler (people answer in the web app) the command is one round, queued in acquisition order.

The store is the state: round r is the store's batch `select:SEED:r`, written in one transaction with its
acquisition scores, so a killed run started again with the same command finds the rounds already asked, adds the
simulated answers a round lacks, and goes on from the first round missing, bitwise as the uninterrupted run (on
the CPU, whose sums are deterministic). Each round's row of RUN_DIR/rounds.jsonl is written once, from what the
store and the round's ensemble (RUN_DIR/ensemble, replaced only when the next round trains) hold."""

from __future__ import annotations

import json
import math
from collections.abc import Set as AbstractSet
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.io.atomic import crash_point
from lmprefs.io.jsonl import read_jsonl, truncate_jsonl
from lmprefs.labels.labelers import label_items, make_labeler
from lmprefs.labels.store import LabelStore
from lmprefs.models.ensemble import RewardEnsemble, is_ensemble_dir, read_manifest
from lmprefs.pipeline.labeling import collect_labels
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.selection import Chooser, ensemble_scores
from lmprefs.pipeline.task import Task


def round_batch(seed: int, r: int) -> str:
    """The store's batch of round r of a run with seed `seed`."""
    return f"select:{seed}:{r}"


def round_seed(seed: int, r: int) -> int:
    """The seed round r samples its candidates with (the queries' order and the samples)."""
    return seed + 7919 * r


def labels_of_type(store, label_type: str, exclude: AbstractSet[int] = frozenset()) -> int:
    """Labels of `label_type` in the store, not counting those on `exclude`d items."""
    return sum(e.item_id not in exclude for e in store.labeled_examples(label_type))


def check_first_round(db: Path, cfg, labeler: str, shown: str) -> None:
    """Refuse directed selection that has nothing to train its first ensemble on: people answer (labeler none), so
    no random round can come first, and the store at `db` (`shown` as the user gave it; it may not exist yet) holds
    fewer labels than labels.select_round. Opens an existing store only to count; creates none."""
    if cfg.labels.select == "random" or labeler != "none":
        return
    have = 0
    if Path(db).exists():
        with LabelStore(db) as store:
            have = labels_of_type(store, cfg.labels.type)
    if have < cfg.labels.select_round:
        raise UserError(f"--db {shown}: holds {have} {cfg.labels.type} labels, fewer than labels.select_round="
                        f"{cfg.labels.select_round} that labels.select={cfg.labels.select} trains its first ensemble "
                        "on; label a first round (a simulated --labeler, the web app, or import-labels), or lower "
                        "labels.select_round")  # fmt: skip


def label_in_rounds(t: Task, store, n: int, *, labeler: str, seed: int, run_dir: Path) -> list[dict]:
    """Ask `n` questions in rounds (see the module docstring). -> the rows of rounds.jsonl, one per round."""
    cfg = t.cfg
    R = n if labeler == "none" else cfg.labels.select_round
    sizes = [min(R, n - k * R) for k in range(math.ceil(n / R))]
    run_dir.mkdir(parents=True, exist_ok=True)
    history = run_dir / "rounds.jsonl"
    batches = [round_batch(seed, r) for r in range(len(sizes))]
    asked = [store.item_count(batch=b) > 0 for b in batches]  # a round's items are written at once
    # rows of rounds the store holds stay (a torn last line goes): each round is logged once
    truncate_jsonl(history, max([-1, *(r for r, a in enumerate(asked) if a)]), key="round")
    logged = {row["round"] for row in read_jsonl(history)} if history.exists() else set()
    later = {i for i, b in store.item_batches(f"select:{seed}:").items() if b in batches}
    first_random = labels_of_type(store, cfg.labels.type, later) < cfg.labels.select_round and labeler != "none"
    rows = []
    for r, size in enumerate(sizes):
        directed = not (r == 0 and first_random)
        if not asked[r]:
            chooser = None
            if directed:
                crash_point("select:round")
                chooser = trained_chooser(t, store, run_dir / "ensemble")
            collect_labels(t, store, size, labeler=labeler, seed=round_seed(seed, r), batch=batches[r],
                           choose=chooser)  # fmt: skip
        elif labeler != "none":  # asked by a killed run: the answers it had no time to add
            sim = make_labeler(labeler, cfg.labels.labeler_temperature, cfg.labels.labeler_random_rate,
                               round_seed(seed, r))  # fmt: skip
            label_items(store, sim, labeler, batch=batches[r])
        row = round_row(store, cfg, r, batches, directed, run_dir)
        if r not in logged:
            with open(history, "a") as f:
                f.write(json.dumps(row) + "\n")
            crash_point("select:logged")
        rows.append(row)
        print(f"round {r}: {row['questions']} {row['select']} questions of {cfg.labels.type}"
              + (f" (mean acquisition {row['acquisition_asked']:.4f})" if directed else "")
              + f"; {row['labels_after']} labels in the store", flush=True)  # fmt: skip
    return rows


def trained_chooser(t: Task, store, out_dir: Path) -> Chooser:
    """An ensemble trained on every label of labels.type in the store (saved to out_dir), choosing by labels.select."""
    ens, summary = train_reward_model(t, store, out_dir)
    assert isinstance(ens, RewardEnsemble)  # directed selection is validated to come with train_reward.ensemble >= 2
    return Chooser(t.cfg.labels, ensemble_scores(ens.eval(), t.ctx), f"{t.cfg.labels.select} of a {len(ens)}-member "
                   f"ensemble trained on {summary['labels_train']} labels ({out_dir})")  # fmt: skip


def round_row(store, cfg, r: int, batches: list[str], directed: bool, run_dir: Path) -> dict:
    """Round r's row of rounds.jsonl, from the store (its items, their scores, the labels before and after it) and
    the ensemble that chose it."""
    mine = [i for i, b in store.item_batches(batches[r]).items() if b == batches[r]]
    later = {i for i, b in store.item_batches(batches[0].rsplit(":", 1)[0] + ":").items() if b in batches[r:]}
    after = {i for i, b in store.item_batches(batches[0].rsplit(":", 1)[0] + ":").items() if b in batches[r + 1 :]}
    row = {"round": r, "select": cfg.labels.select if directed else "random", "questions": len(mine),
           "labels_before": labels_of_type(store, cfg.labels.type, later),
           "labels_after": labels_of_type(store, cfg.labels.type, after)}  # fmt: skip
    if directed:
        scores = [store.get_item(i).acquisition for i in mine]
        row["acquisition_asked"] = sum(scores) / len(scores) if scores else 0.0
        # the round's ensemble is the one in run_dir, unless this run_dir is not the one the round was asked from
        have = is_ensemble_dir(run_dir / "ensemble")
        summary = read_manifest(run_dir / "ensemble").get("summary", {}) if have else {}
        row["ensemble_heldout_accuracy"] = summary.get("heldout/accuracy")
    return row
