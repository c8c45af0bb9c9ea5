"""Quality control in the label store and at training time: the statistics behind the admin page (Wilson interval,
Cohen's and Fleiss' kappa), the schema migration that lets a store written before quality control open and work, and
dropping or weighting labelers by their gold accuracy when a reward model is trained."""

from __future__ import annotations

import sqlite3

import pytest

from lmprefs.labels.quality import cohen_kappa, fleiss_kappa, select_labelers, wilson
from lmprefs.labels.store import LabelStore, schema


def test_wilson_and_kappas_match_known_values():
    lo, hi = wilson(8, 10)
    assert (round(lo, 3), round(hi, 3)) == (0.490, 0.943)  # Wilson (1927) / Newcombe (1998) table: 0.4902-0.9433
    assert wilson(0, 0) is None and wilson(0, 5)[0] == 0 and wilson(5, 5)[1] == 1
    # Cohen: 50 items, 20 both yes, 15 both no, 5 yes/no, 10 no/yes -> kappa 0.4 (the Wikipedia example)
    pairs = [(1, 1)] * 20 + [(0, 0)] * 15 + [(1, 0)] * 5 + [(0, 1)] * 10
    assert cohen_kappa(pairs) == pytest.approx(0.4)
    assert cohen_kappa([(0, 0), (0, 0)]) is None  # chance agreement is 1: nothing to correct
    # Fleiss: the Wikipedia example (10 items, 14 raters, 5 categories) -> 0.210
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]  # fmt: skip
    items = [[c for c, n in enumerate(row) for _ in range(n)] for row in table]
    assert fleiss_kappa(items) == pytest.approx(0.210, abs=5e-4)
    assert fleiss_kappa([[1]]) is None


# -- the store: an old store opens, and training can drop or weight labelers ------------------------------------


def test_a_version_1_store_is_migrated_and_keeps_its_labels(tmp_path):
    path = tmp_path / "v1.sqlite"
    conn = sqlite3.connect(path)  # what the code before quality control wrote: the version-1 schema
    conn.executescript(schema.SCHEMA)
    conn.executescript(
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "INSERT INTO queries VALUES (1, 'q', 'h', 0);"
        + "".join(f"INSERT INTO samples VALUES ({j}, 1, 's{j}', 'h{j}', 0);" for j in range(1, 5))
        + "INSERT INTO items (id, ident, query_id, label_type, num_samples, source, created)"
        " VALUES (1, 'i1', 1, 'best_of_4', 4, 't', 0), (2, 'i2', 1, 'best_of_4', 4, 'u', 0);"
        + "".join(f"INSERT INTO item_samples VALUES ({i}, {j - 1}, {j});" for i in (1, 2) for j in range(1, 5))
        + "INSERT INTO labelers (id, name, created) VALUES (1, 'old', 0);"
        "INSERT INTO labels (item_id, labeler_id, kind, best, created) VALUES (1, 1, 'label', 2, 0);"
        "INSERT INTO labels (item_id, labeler_id, kind, created) VALUES (2, 1, 'flag', 0);"
    )
    conn.commit()
    conn.close()
    with LabelStore(path) as store:
        version = store.connection().execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == (str(schema.SCHEMA_VERSION),) and len(store.store_id) == 32
        assert [(e.item_id, e.best, e.labeler) for e in store.labeled_examples()] == [(1, 2, "old")]
        assert store.get_item(2).hold == "flagged"  # flagged before: held now
        store.add_label(1, "new", best=0, shown=[3, 2, 1, 0], seconds=4.5)
        store_id = store.store_id
    with LabelStore(path) as store:  # a second open changes nothing
        assert store.store_id == store_id and store.table_counts()["labels"] == 3


def test_training_drops_labelers_under_the_gold_threshold(tmp_path):
    with LabelStore(tmp_path / "labels.sqlite") as store:
        ids = [store.add_item(f"Query {i}.", [f" s{i}.{j}" for j in range(4)], source="t") for i in range(10)]
        for i in ids[:4]:
            store.set_gold(i, 0)
        for i in ids:
            store.add_label(i, "good", best=0)
            store.add_label(i, "bad", best=1 if i in ids[:4] else 0)
            store.add_label(i, "half", best=1 if i in ids[:2] else 0)
        store.add_label(ids[5], "unrated", best=3, source="import")
        store.add_item("Other type.", ["a", "b"], source="t", label_type="best_of_2")
        examples = store.labeled_examples()
        kept, report = select_labelers(examples, store, 0.5)
        assert {e.labeler for e in kept} == {"good", "half", "unrated"} and len(kept) == 21
        assert report == {  # weight: chance-corrected gold accuracy, (acc - 1/4) / (3/4)
            "bad": {"labels": 0, "gold": [0, 4], "dropped": True, "weight": 0.0},
            "good": {"labels": 10, "gold": [4, 4], "dropped": False, "weight": 1.0},
            "half": {"labels": 10, "gold": [2, 4], "dropped": False, "weight": 0.3333},
            "unrated": {"labels": 1, "gold": None, "dropped": False, "weight": 1.0},
        }
        assert len(select_labelers(examples, store, 0.0)[0]) == 31


def test_weighted_loss_ignores_weight_zero_labels():
    import torch

    from lmprefs.labels.types import get as get_label_type

    lt = get_label_type("best_of_4")
    rewards = torch.randn(4, 4, requires_grad=True)
    best = torch.tensor([0, 1, 2, 3])
    out = lt.loss(rewards, {"best": best, "weight": torch.tensor([2.0, 2.0, 0.0, 0.0])})
    out["loss"].backward()
    assert rewards.grad[2:].abs().sum() == 0 and rewards.grad[:2].abs().sum() > 0
    plain = lt.loss(rewards.detach()[:2], {"best": best[:2]})
    assert out["loss"].item() == pytest.approx(plain["loss"].item())  # mean(w * l) with mean(w) = 1
    assert out["error"].item() == pytest.approx(lt.loss(rewards.detach(), {"best": best})["error"].item())


def test_train_reward_drops_and_weights_labelers_by_gold(tmp_path, capsys):
    from lmprefs.cli.dispatch import main

    db = tmp_path / "l.sqlite"
    assert main(["label", "tiny", "--db", str(db), "--n", "24", "--labeler", "vader"]) == 0
    with LabelStore(db) as store:
        examples = store.labeled_examples()
        for e in examples[:6]:  # vader's answers are right on these gold questions; "bad" gets them all wrong
            store.set_gold(e.item_id, e.best)
            store.add_label(e.item_id, "bad", best=(e.best + 1) % 4)
        for e in examples[6:12]:
            store.add_label(e.item_id, "bad", best=e.best)
        for e in examples[12:18]:
            store.add_label(e.item_id, "rookie", best=e.best)
    capsys.readouterr()
    args = ["train-reward", "tiny", "--db", str(db), "--run-dir", str(tmp_path / "r")]
    assert main([*args, "--labels.min-gold-accuracy", "0.5", "--labels.weight-by-gold", "true"]) == 0
    out = capsys.readouterr().out
    assert "labels per labeler (before the held-out split): bad dropped (gold 0/6), rookie 6 (no gold answers, " \
           "weight 1.00), vader 24 (gold 6/6, weight 1.00)" in out  # fmt: skip
    assert main([*args, "--labels.min-gold-accuracy", "1.5"]) == 2
    assert "labels.min_gold_accuracy=1.5" in capsys.readouterr().err
