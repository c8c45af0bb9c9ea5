"""`lmprefs label` with directed selection: rounds of questions chosen by a reward-model ensemble's acquisition from
a larger pool, a run killed between rounds or mid-selection that resumes bitwise with each round logged once, random
selection that is today's labeling, and people's queue filled in acquisition order."""

from __future__ import annotations

import json
import sqlite3

import pytest
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.labels.store import LabelStore

DIRECTED = ["--labels.select", "bald", "--train-reward.ensemble", "2", "--labels.select-round", "8",
            "--labels.pool-factor", "3"]  # fmt: skip


def dump(db) -> dict:
    """Everything a run decides: the questions asked (texts, batch, score) and the answers."""
    with LabelStore(db) as store:
        c = store.connection()
        items = [store.get_item(i) for (i,) in c.execute("SELECT id FROM items ORDER BY id")]
        labels = c.execute("SELECT item_id, best FROM labels ORDER BY id").fetchall()
    return {"items": [(it.query, it.samples, it.batch, it.acquisition) for it in items], "labels": labels}


def label(tmp_path, name, *extra) -> list[str]:
    return ["label", "tiny", "--n", "20", "--db", str(tmp_path / f"{name}.sqlite"), "--run-dir",
            str(tmp_path / name), *DIRECTED, *extra]  # fmt: skip


def rounds(tmp_path, name) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / name / "rounds.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    d = tmp_path_factory.mktemp("rounds")
    assert main(label(d, "whole")) == 0
    return d, dump(d / "whole.sqlite"), rounds(d, "whole")


def test_rounds_ask_the_questions_the_ensemble_ranks_first(uninterrupted):
    d, store, rows = uninterrupted
    assert [(r["round"], r["select"], r["questions"]) for r in rows] == [(0, "random", 8), (1, "bald", 8),
                                                                         (2, "bald", 4)]  # fmt: skip
    assert [r["labels_after"] for r in rows] == [8, 16, 20] and len(store["labels"]) == 20
    by_batch = {}
    for _, _, batch, acq in store["items"]:
        by_batch.setdefault(batch, []).append(acq)
    assert by_batch["select:1:0"] == [None] * 8  # the first round is random: nothing to rank with yet
    for b in ("select:1:1", "select:1:2"):
        # asked in acquisition order: the top of the pool first
        assert all(a is not None for a in by_batch[b]) and by_batch[b] == sorted(by_batch[b], reverse=True)
    assert rows[1]["acquisition_asked"] == pytest.approx(sum(by_batch["select:1:1"]) / 8)
    assert (d / "whole" / "ensemble" / "ensemble.json").is_file()


@pytest.mark.parametrize(("point", "nth"), [("select:round", 2), ("select:sampled", 1), ("labeling:stored", 2),
                                            ("select:logged", 2)])  # fmt: skip
def test_a_killed_run_resumes_bitwise_and_logs_each_round_once(uninterrupted, tmp_path, monkeypatch, point, nth):
    _, store, rows = uninterrupted
    killed(monkeypatch, label(tmp_path, "run"), point, nth)
    assert main(label(tmp_path, "run")) == 0
    assert dump(tmp_path / "run.sqlite") == store
    assert rounds(tmp_path, "run") == rows


def test_a_rerun_into_another_run_dir_goes_on_from_the_store(uninterrupted, tmp_path, monkeypatch):
    _, store, rows = uninterrupted
    killed(monkeypatch, label(tmp_path, "run"), "select:round", 2)
    args = label(tmp_path, "run")
    args[args.index("--run-dir") + 1] = str(tmp_path / "elsewhere")
    assert main(args) == 0
    assert dump(tmp_path / "run.sqlite") == store
    assert [r["round"] for r in rounds(tmp_path, "elsewhere")] == [0, 1, 2]  # round 1's ensemble is not here
    assert rounds(tmp_path, "elsewhere")[1]["ensemble_heldout_accuracy"] is None


def test_random_selection_is_todays_labeling(tmp_path):
    base = ["label", "tiny", "--n", "12"]
    assert main([*base, "--db", str(tmp_path / "a.sqlite")]) == 0
    assert main([*base, "--db", str(tmp_path / "b.sqlite"), "--labels.pool-factor", "5",
                 "--labels.select-round", "3", "--train-reward.ensemble", "3"]) == 0  # fmt: skip
    assert dump(tmp_path / "a.sqlite") == dump(tmp_path / "b.sqlite")
    assert not any(p.name.startswith("runs") for p in tmp_path.iterdir())


def test_people_get_one_round_queued_in_acquisition_order(uninterrupted, tmp_path):
    d, _, _ = uninterrupted
    db = tmp_path / "team.sqlite"
    with sqlite3.connect(d / "whole.sqlite") as src, sqlite3.connect(db) as dst:
        src.backup(dst)  # 20 labels: enough for a first ensemble
    assert main(["label", "tiny", "--n", "6", "--db", str(db), "--labeler", "none", "--run-dir", str(tmp_path / "r"),
                 "--seed", "5", *DIRECTED]) == 0  # fmt: skip
    with LabelStore(db) as store:
        queued = store.next_item("ann")
        pending = store.search_items(state="pending", limit=100)
        assert len(pending) == 6 and all(it.acquisition is not None for it in pending)
        assert queued.acquisition == max(it.acquisition for it in pending)
        assert "2-member ensemble trained on" in store.acquisition_by()


def test_the_python_api_labels_in_rounds_into_a_run_dir(tmp_path):
    import lmprefs
    from lmprefs.errors import UserError

    cfg = lmprefs.make_config("tiny", {"train_reward.ensemble": 2, "labels.select": "spread",
                                       "labels.select_round": 6})  # fmt: skip
    with pytest.raises(UserError, match="needs run_dir="):
        lmprefs.label(cfg, tmp_path / "a.sqlite", 12)
    assert not (tmp_path / "a.sqlite").exists()
    out = lmprefs.label(cfg, tmp_path / "a.sqlite", 12, run_dir=tmp_path / "r")
    assert [(r["select"], r["questions"]) for r in out["rounds"]] == [("random", 6), ("spread", 6)]
