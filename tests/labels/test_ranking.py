"""Full rankings (ranking_K): the label type's name, the store (a repeated or missing option refused with nothing
stored; the top choice kept as `best`; a version-3 store upgraded in place), the exports (the whole order in
comparisons JSONL, the top choice as best-of-K in openai files, every implied pair in TRL pairs), the Plackett-Luce
loss (its first position is best_of_K's loss; the same numbers as the DPO module's), and the simulated labeler."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch

from lmprefs.config import label_type_shape
from lmprefs.labels.formats import export_file, import_file
from lmprefs.labels.labelers import ScoreLabeler
from lmprefs.labels.store import LabelStore, schema
from lmprefs.labels.types import PickBest, Ranking, get, plackett_luce
from lmprefs.training.dpo import plackett_luce_losses


def test_ranking_types_are_named_like_best_of_n():
    assert label_type_shape("ranking_4") == ("ranking", 4) and get("ranking_9") == Ranking(9)
    for bad in ("ranking_1", "ranking_10", "ranking_"):
        with pytest.raises(ValueError, match="'ranking_K' \\(K 2 to 9\\)"):
            label_type_shape(bad)


@pytest.fixture
def store(tmp_path):
    with LabelStore(tmp_path / "r.sqlite") as s:
        yield s


def test_the_store_keeps_the_order_and_refuses_a_repeated_or_missing_option(store):
    item = store.add_item("q", ["a", "b", "c", "d"], source="t", label_type="ranking_4")
    before = store.table_counts()
    for bad, why in (([2, 2, 0, 1], "option 2 more than once"), ([2, 0, 1], "leaves out option 3"),
                     ([0, 1, 2, 4], "option 4, outside 0..3"), (None, "needs ranking")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            store.add_label(item, "ann", ranking=bad)
    with pytest.raises(ValueError, match="not the ranking's top choice"):
        store.add_label(item, "ann", ranking=[2, 0, 1, 3], best=0)
    assert store.table_counts() == before
    store.add_label(item, "ann", ranking=[2, 0, 3, 1])
    (ex,) = store.labeled_examples("ranking_4")
    assert (ex.ranking, ex.best) == ([2, 0, 3, 1], 2)  # the top choice doubles as best: gold and agreement read it
    store.set_gold(item, 2)
    assert store.gold_accuracy() == {"ann": (1, 1)}
    assert store.answers_since(0)[0].ranking == [2, 0, 3, 1]


def test_a_version_3_store_is_upgraded_in_place(tmp_path):
    path = tmp_path / "v3.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(schema.SCHEMA)
    for version in (2, 3):
        for sql in schema.MIGRATIONS[version]:
            conn.execute(sql)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    conn.commit()
    conn.close()
    with LabelStore(path) as s:
        assert s.connection().execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(schema.SCHEMA_VERSION),
        )
        item = s.add_item("q", ["a", "b"], source="t", label_type="ranking_2")
        s.add_label(item, "ann", ranking=[1, 0])
        assert s.labeled_examples("ranking_2")[0].ranking == [1, 0]


def test_exports_carry_the_order_the_top_choice_and_every_implied_pair(store, tmp_path):
    item = store.add_item("q", ["a", "b", "c"], source="t", label_type="ranking_3")
    store.add_label(item, "ann", ranking=[1, 2, 0])
    out = tmp_path / "c.jsonl"
    export_file(store, out, format="comparisons")
    row = json.loads(out.read_text())
    assert row == {"query": "q", "samples": ["a", "b", "c"], "ranking": [1, 2, 0], "labeler": "ann"}
    export_file(store, tmp_path / "p.jsonl", format="pairs", label_type="ranking_3")
    pairs = [(r["chosen"], r["rejected"]) for r in map(json.loads, (tmp_path / "p.jsonl").read_text().splitlines())]
    assert pairs == [("b", "c"), ("b", "a"), ("c", "a")]  # K(K-1)/2
    ids = {"q": [80], "a": [64], "b": [65], "c": [66]}
    export_file(store, tmp_path / "o.json", format="openai", label_type="ranking_3", tokenizer=FakeTok(ids))
    (row,) = json.loads((tmp_path / "o.json").read_text())
    assert row["best"] == 1 and "ranking" not in row and row["sample1"] == [65]
    with LabelStore(tmp_path / "again.sqlite") as again:  # the comparisons file imports back as the same ranking
        import_file(again, out)
        assert again.labeled_examples("ranking_3")[0].ranking == [1, 2, 0]


class FakeTok:
    def __init__(self, ids):
        self.ids = ids

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self.ids[text]}


def test_plackett_luce_top_1_is_best_of_n_and_matches_the_dpo_module():
    rewards = torch.tensor([[0.3, -1.2, 2.0, 0.5], [1.0, 1.0, -0.5, 0.0]])
    ranking = torch.tensor([[2, 0, 3, 1], [1, 3, 0, 2]])
    best = ranking[:, 0]
    top_1 = plackett_luce(rewards, ranking[:, :1]).mean()
    assert torch.allclose(top_1, PickBest(4).loss(rewards, {"best": best})["loss"])
    assert torch.allclose(plackett_luce(rewards, ranking), plackett_luce_losses(rewards, ranking))
    # by hand, the second row: softmax choices among what is left, position after position
    r = rewards[1]
    by_hand = sum(torch.logsumexp(r[left], 0) - r[left[0]] for left in ([1, 3, 0, 2], [3, 0, 2], [0, 2], [2]))
    out = Ranking(4).loss(rewards, {"ranking": ranking})
    assert torch.allclose(plackett_luce(rewards, ranking)[1], by_hand)
    assert out["accuracy"] == 0.5  # row 0's best reward is its top choice; row 1's ties go to option 0


def test_the_simulated_labeler_ranks_by_score_with_plackett_luce_noise():
    score = {"a": 0.1, "b": 0.9, "c": 0.5}.get
    exact = ScoreLabeler(lambda ts: [score(t) for t in ts])
    assert exact.answer("ranking_3", "", ["a", "b", "c"]) == {"ranking": [1, 2, 0]}
    noisy = ScoreLabeler(lambda ts: [score(t) for t in ts], temperature=0.3, seed=1)
    draws = [tuple(noisy.rank(["a", "b", "c"])) for _ in range(300)]
    assert all(sorted(d) == [0, 1, 2] for d in draws) and len(set(draws)) > 2
    assert draws.count((1, 2, 0)) == max(draws.count(d) for d in set(draws))  # the score order is the likeliest
