"""Online label collection (paper section 2.2; not in the original's release): while PPO trains, batches of
comparisons sampled from the *current* policy go to the label store's queue, judgments arrive (from the simulated
labeler, or from people through `lmprefs serve`), and the reward model is retrained from all labels so far at evenly
spaced updates, each time from the initial model with a fresh head (the paper retrained 19 times over a run).

Resumable: the checkpoint holds the reward model scoring at that update and the list of retrains so far. A resumed
run redoes the updates after its checkpoint as the killed one did them: a label batch already in the store is not
asked for again (simulated labels still missing are added), and a retrain uses only the labels of batches up to its
update, so with a simulated labeler the resumed run equals the uninterrupted one.

With directed selection (labels.select bald or spread, train_reward.ensemble >= 2) each request after the first
samples labels.pool_factor times its questions from the current policy and asks those the current ensemble's
acquisition ranks highest (pipeline/selection.py); the checkpoint's ensemble makes a resumed run choose as the
killed one did."""

from __future__ import annotations

import json
import time
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.io.jsonl import read_jsonl, truncate_jsonl
from lmprefs.labels.labelers import label_items, make_labeler
from lmprefs.labels.types import get as get_label_type
from lmprefs.models.ensemble import RewardEnsemble
from lmprefs.models.reward_model import RewardModel
from lmprefs.pipeline.labeling import collect_labels
from lmprefs.pipeline.reward_model import RewardState, reward_frame, training_labels
from lmprefs.pipeline.reward_training import train_reward_model
from lmprefs.pipeline.selection import Chooser, ensemble_scores
from lmprefs.runtime.device import compiles_forwards
from lmprefs.training.policy_run import ScoreFn
from lmprefs.training.reward import evaluate, examples_to_comparisons, tokenizer_id
from lmprefs.training.rollout import rm_score_fn


def retrain_points(n_updates: int, retrains: int) -> set[int]:
    """Updates after which the reward model is retrained: `retrains` evenly spaced points inside the run."""
    return {round(n_updates * k / (retrains + 1)) for k in range(1, retrains + 1)} - {0, n_updates}


class OnlineRewards:
    """The current reward model behind a stable `score` function, plus the queue and retrain schedule.

    `labeler` names a simulated labeler that answers each batch at once; None leaves the batches to people.
    """

    def __init__(self, t, store, run_dir: Path, labeler: str | None, log=None):
        self.t, self.store, self.run_dir, self.labeler, self.log = t, store, Path(run_dir), labeler, log
        self.cfg = t.cfg
        self.history_path = self.run_dir / "online.jsonl"
        self._score: ScoreFn | None = None
        self.rm: RewardModel | RewardEnsemble | None = None  # the reward model (or ensemble) scoring now
        self.retrains: list[list[int]] = []  # [update, labels] of each reward model so far
        self.measured: list[int] = [-1, 0]  # [reward model's update, labels] the last agreement was measured on

    def state_dict(self) -> dict:
        return {"retrains": self.retrains, "reward": RewardState(self.rm).state_dict(), "measured": self.measured}

    def load_state_dict(self, s: dict) -> None:
        """Make the checkpoint's reward model the current one, and forget the history rows written after it."""

        RewardState(self.rm).load_state_dict(s["reward"])
        self.retrains = [list(r) for r in s["retrains"]]
        self.measured = list(s.get("measured", [-1, 0]))
        truncate_jsonl(self.history_path, self.retrains[-1][0] if self.retrains else -1, key="update")

    def score(self, queries, responses, prefix=None):
        return self._score(queries, responses, prefix)

    def labels_so_far(self) -> int:
        return len(self.store.labeled_examples(self.cfg.labels.type))

    def items_after(self, update: int, until: float = float("inf")) -> set[int]:
        """Items of the batches asked for after `update` (present when a resumed run redoes updates), up to `until`."""
        return {i for i, b in self.store.item_batches("online:").items() if update < int(b.split(":", 1)[1]) <= until}

    def labels_until(self, update: int) -> int:
        later = self.items_after(update)
        return sum(e.item_id not in later for e in self.store.labeled_examples(self.cfg.labels.type))

    def request(self, update: int, model=None, adapter: str | None = None) -> dict:
        """Queue a batch of questions from the current policy and, when simulated, answer it. A batch already in
        the store (a resumed run redoing this update) is not asked for again; simulated answers it lacks are added."""

        cfg, batch, seed = self.cfg, f"online:{update}", self.cfg.run.seed + 1000 + update
        n = min(cfg.labels.online_questions, len(self.t.train_queries))
        have = self.store.item_count(batch=batch)
        if have >= n:
            added = 0
            if self.labeler:
                sim = make_labeler(self.labeler, cfg.labels.labeler_temperature, cfg.labels.labeler_random_rate, seed)
                added = label_items(self.store, sim, self.labeler, batch=batch)
            return {"items": 0, "labels_added": added, "labeler": self.labeler or "none", "repeated": True}
        return collect_labels(self.t, self.store, n, labeler=self.labeler or "none", source=batch, batch=batch,
                              seed=seed, model=model, adapter=adapter, choose=self.chooser())  # fmt: skip

    def chooser(self) -> Chooser | None:
        """With directed selection (labels.select), the current ensemble's choice among the policy's candidates;
        None for random questions, and for the first request, which comes before any reward model."""
        if self.cfg.labels.select == "random" or not isinstance(self.rm, RewardEnsemble):
            return None
        return Chooser(self.cfg.labels, ensemble_scores(self.rm, self.t.ctx),
                       f"{self.cfg.labels.select} of the online ensemble {len(self.retrains) - 1} "
                       f"({self.run_dir / 'reward_model'})")  # fmt: skip

    def agreement(self, update: int) -> dict:
        """How often the scoring reward model picks what the labelers picked on the questions asked since it was
        trained, up to `update`: samples of the policy as it has moved, and labels it has not seen. A policy that
        exploits its reward model drives this down while the score still rises (Gao et al. 2022), so it is the
        andon cord's over-optimization signal where no true reward is known (ppo.overoptimization_stop). {} when
        no such label has arrived since the last measurement."""
        since = self.retrains[-1][0] if self.retrains else -1
        unseen = self.items_after(since, update)
        tok, lt = self.t.tok, get_label_type(self.cfg.labels.type)
        examples = [e for e in self.store.labeled_examples(self.cfg.labels.type, tokenizer=tokenizer_id(tok))
                    if e.item_id in unseen]  # fmt: skip
        if not examples or self.measured == [since, len(examples)] or self.rm is None:
            return {}
        self.measured = [since, len(examples)]
        out = evaluate(self.rm, examples_to_comparisons(examples, tok, self.cfg.task), lt, self.t.ctx)
        if "heldout/accuracy" not in out:
            return {}
        return {"online/rm_agreement": out["heldout/accuracy"], "online/rm_agreement_labels": len(examples)}

    poll_seconds = 5.0

    def wait_for_labels(self, minimum: int) -> None:
        """Block until the store holds `minimum` labels (people answer through the web app)."""
        have = self.labels_so_far()
        while have < minimum:
            print(f"waiting for judgments: {have}/{minimum} in {self.store.path} (lmprefs serve --db "
                  f"{self.store.path})", flush=True)  # fmt: skip
            time.sleep(self.poll_seconds)
            have = self.labels_so_far()

    def retrain(self, update: int) -> dict:
        # all labels so far, as the paper's online runs: labels.num_train sizes an offline reward model's data, and
        # taking its first labels in store order trained every later retrain on the same early batches
        exclude = self.items_after(update)
        labels = training_labels(self.t, self.store, exclude, every_label=True)
        rm, summary = train_reward_model(self.t, self.store, self.run_dir / "reward_model", self.log, exclude,
                                         labels)  # fmt: skip
        self.rm = rm.freeze()
        self._score = rm_score_fn(rm, compiles_forwards(self.cfg.run.compile, self.t.device))
        row = {"update": update, "labels": summary["labels_train"] + summary["labels_heldout"],
               "labels_train": summary["labels_train"],
               "heldout_accuracy": summary.get("heldout/accuracy")}  # fmt: skip
        self.retrains.append([update, row["labels"]])
        with open(self.history_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def start(self, resume: bool) -> None:
        """The first reward model: from the labels already in the store, after asking for a first batch from the
        initial policy when there are too few. resume: from a checkpoint, which holds the reward model."""

        if resume:  # an empty reward model of the right shape; the checkpoint's state fills it (load_state_dict)
            self.rm = reward_frame(self.t).eval().freeze()
            self._score = rm_score_fn(self.rm, compiles_forwards(self.cfg.run.compile, self.t.device))
            return
        truncate_jsonl(self.history_path, -1, key="update")  # a run starting over forgets its earlier reward models
        need = max(8, self.cfg.labels.online_questions // 2)
        if self.labels_until(0) < need:
            self.request(0)
            if self.labeler is None:
                self.wait_for_labels(need)
        self.retrain(0)

    def on_update(self, run, stats: dict) -> None:
        u, cfg = run.update, self.cfg
        stats["online/reward_model"] = len(self.retrains) - 1  # which reward model (online.md's row) scored update u
        if u % cfg.labels.online_interval == 0 and u < cfg.ppo.num_updates:
            self.request(u, run.policy.lm, run.policy.adapter)
        stats |= self.agreement(u)  # before a retrain takes these labels in
        if u in retrain_points(cfg.ppo.num_updates, cfg.labels.online_retrains):
            row = self.retrain(u)
            acc = row["heldout_accuracy"]  # None without held-out labels, as online.md's table shows it
            print(f"reward model retrained at update {u} on {row['labels_train']} labels "
                  f"(held-out accuracy {'-' if acc is None else f'{acc:.3f}'})", flush=True)  # fmt: skip
        stats["online/labels"] = self.labels_until(u)
        stats["online/pending"] = self.store.pending_count()


def online_summary(run_dir: Path) -> str:
    """How many labels each reward model of the run saw, as a markdown table (written to online.md)."""
    path = Path(run_dir) / "online.jsonl"
    if not path.exists():
        raise UserError(f"{run_dir} has no online.jsonl")
    rows = read_jsonl(path)
    lines = ["| reward model | after update | labels (train + held out) | trained on | held-out accuracy |",
             "|---|---|---|---|---|"]  # fmt: skip
    for i, r in enumerate(rows):
        acc = r["heldout_accuracy"]
        lines.append(f"| {i} | {r['update']} | {r['labels']} | {r['labels_train']} | "
                     f"{'-' if acc is None else f'{acc:.3f}'} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (Path(run_dir) / "online.md").write_text("# Online reward models\n\n" + text)
    return text
