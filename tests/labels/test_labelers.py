"""Simulated labelers: argmax when noiseless, the Boltzmann / random-answer statistics over many draws (tolerances
from the binomial standard error), determinism given the seed, the score functions, and labeling a store's queue."""

import math
from collections import Counter

import pytest

from lmprefs.labels.labelers import ScoreLabeler, descriptiveness_score, label_items, make_labeler, vader_score
from lmprefs.labels.store import LabelStore


def numeric(texts):  # a score function whose scores are the texts themselves
    return [float(t) for t in texts]


def frequencies(labeler, samples, draws):
    counts = Counter(labeler.pick(samples) for _ in range(draws))
    return [counts[i] / draws for i in range(len(samples))]


def assert_matches(freqs, probs, draws):
    for f, p in zip(freqs, probs, strict=True):
        sigma = math.sqrt(p * (1 - p) / draws)
        assert abs(f - p) <= 5 * sigma + 1e-12, (freqs, probs)  # 5 sigma: a false alarm ~1 in 3 million


def test_noiseless_picks_argmax():
    labeler = ScoreLabeler(numeric)
    assert [labeler.pick(s) for s in (["1", "5", "2", "0"], ["-3", "-1", "-2", "-4"], ["9", "1"])] == [1, 1, 0]
    ties = frequencies(ScoreLabeler(numeric, seed=1), ["1", "3", "3", "0"], 4000)  # ties split evenly
    assert ties[0] == ties[3] == 0
    assert_matches(ties, [0, 0.5, 0.5, 0], 4000)


def test_boltzmann_choice_statistics():
    labeler = ScoreLabeler(numeric, temperature=0.5, seed=3)
    samples = ["0", "0.5", "1", "-1"]
    z = [math.exp(float(s) / 0.5) for s in samples]
    probs = [v / sum(z) for v in z]
    assert labeler.probabilities(numeric(samples)) == pytest.approx(probs)
    assert_matches(frequencies(labeler, samples, 20000), probs, 20000)


def test_random_rate_statistics():
    labeler = ScoreLabeler(numeric, random_rate=0.3, seed=4)
    probs = [0.3 / 4, 0.3 / 4, 0.7 + 0.3 / 4, 0.3 / 4]
    assert labeler.probabilities([0, 1, 2, 1]) == pytest.approx(probs)
    assert_matches(frequencies(labeler, ["0", "1", "2", "1"], 20000), probs, 20000)
    always_random = ScoreLabeler(numeric, random_rate=1.0, temperature=0.1, seed=5)
    assert_matches(frequencies(always_random, ["0", "9"], 10000), [0.5, 0.5], 10000)


def test_deterministic_given_seed():
    def run(seed):
        labeler = ScoreLabeler(numeric, temperature=1.0, random_rate=0.2, seed=seed)
        return [labeler.pick(["0", "0.3", "0.1", "0.2"]) for _ in range(200)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="temperature"):
        ScoreLabeler(numeric, temperature=-1)
    with pytest.raises(ValueError, match="random_rate"):
        ScoreLabeler(numeric, random_rate=1.5)
    with pytest.raises(ValueError, match="'sentiment'"):
        make_labeler("sentiment")


def test_answers_for_every_label_type():
    labeler = ScoreLabeler(numeric)
    assert labeler.answer("best_of_2", "q", ["1", "2"]) == {"best": 1}
    assert labeler.answer("scalar_rating", "q", ["0.5"]) == {"score": 0.5}
    assert labeler.answer("scalar_compare", "q", ["1", "3"]) == {"difference": 2.0}
    with pytest.raises(ValueError, match="needs 4 samples"):
        labeler.answer("best_of_4", "q", ["1"])
    # with_query=True scores query + response text
    seen = []
    ScoreLabeler(lambda ts: seen.extend(ts) or [0.0] * len(ts), with_query=True).pick(["a", "b"], query="Q:")
    assert seen == ["Q:a", "Q:b"]


def test_vader_score():
    pos, neg, flat = vader_score(["What a wonderful, happy day!", "This is terrible and sad.", "The door is brown."])
    assert pos > 0.5 and neg < -0.5 and flat == 0.0
    assert make_labeler("vader").pick([" and he hated it.", " and she loved it, a great joy."]) == 1


def test_descriptiveness_score_by_hand():
    # words: the(0) crimson(d) sky(0) glowed(0) softly(a) over(0) the(0) ancient(d) mysterious(s) hills(0) -> n=10
    (score,) = descriptiveness_score(["The crimson sky glowed softly over the ancient, mysterious hills."])
    assert score == pytest.approx((2 + 0.5 + 0.5) / (10 + 3))
    plain, vivid = descriptiveness_score(
        ["He went to the shop and then he went home.", "He went to the dusty shop under a pale, flickering light."]
    )
    assert plain == 0.0 and vivid > plain
    assert descriptiveness_score(["only family really"]) == [0.0]  # -ly stoplist
    assert make_labeler("descriptiveness").pick([" he left.", " the dark, misty, silent lane."]) == 1


def test_label_items_labels_the_queue(tmp_path):
    with LabelStore(tmp_path / "labels.db") as store:
        ids = [store.add_item(f"q{k}", [str(k % 4), "0.5", str(-k), "1.5"], source="sim") for k in range(6)]
        store.add_item("other", ["1", "2"], source="sim", label_type="best_of_2", batch="b")
        labeler = ScoreLabeler(numeric)
        assert label_items(store, labeler, "sim", limit=2) == 2
        assert label_items(store, labeler, "sim") == 5  # the rest, the best_of_2 item included
        assert label_items(store, labeler, "sim") == 0
        assert label_items(store, labeler, "sim", [store.get_item(ids[0])]) == 0  # already answered: passed over
        best = {e.item_id: e.best for e in store.labeled_examples("best_of_4")}
        assert best == {i: max(range(4), key=lambda j: float(store.get_item(i).samples[j])) for i in ids}
        assert [e.best for e in store.labeled_examples("best_of_2")] == [1]
        assert store.pending_count() == 0
