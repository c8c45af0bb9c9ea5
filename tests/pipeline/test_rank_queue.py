"""`lmprefs rank-queue`: a reward-model ensemble scores a store's pending questions, the scores are the acquisition
of the ensemble's member scores, gold questions and drift anchors keep none, and the queue serves the rest in that
order."""

from __future__ import annotations

import pytest
import torch

from lmprefs.cli.dispatch import main
from lmprefs.labels.acquisition import bald
from lmprefs.labels.store import LabelStore


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    d = tmp_path_factory.mktemp("rank")
    db, run = str(d / "labels.sqlite"), str(d / "rm")
    assert main(["label", "tiny", "--n", "24", "--db", db]) == 0
    assert main(["train-reward", "tiny", "--db", db, "--run-dir", run, "--train-reward.ensemble", "3"]) == 0
    assert main(["label", "tiny", "--n", "10", "--db", db, "--labeler", "none", "--seed", "9"]) == 0
    with LabelStore(db) as store:
        pending = [it.id for it in store.search_items(state="pending", limit=100)][::-1]
        store.set_gold(pending[0], 1)
        store.set_anchor(pending[1])
    assert main(["rank-queue", "--db", db, "--run-dir", run]) == 0
    return db, run, pending


def test_pending_items_get_the_ensembles_bald_and_are_served_by_it(ranked):
    db, run, pending = ranked
    from lmprefs.io.config_file import load_config
    from lmprefs.models.ensemble import load_reward_ensemble
    from lmprefs.pipeline.selection import ensemble_scores
    from lmprefs.pipeline.task import setup_task
    from lmprefs.training.reward import question_tensors, tokenizer_id

    t = setup_task(load_config(f"{run}/config.json"))
    with LabelStore(db) as store:
        items = {i: store.get_item(i) for i in pending}
        assert items[pending[0]].acquisition is None and items[pending[1]].acquisition is None  # gold, anchor
        rest = pending[2:]
        assert all(items[i].acquisition is not None for i in rest)
        questions = [q for q in store.rankable_items("best_of_4", tokenizer=tokenizer_id(t.tok)) if q.item_id in rest]
        served = [store.next_item("ann").id]
        assert "3-member ensemble" in store.acquisition_by()
    # the stored score is BALD of the members' scores, recomputed here from the saved ensemble
    ens = load_reward_ensemble(f"{run}/reward_model").eval()
    q, s = question_tensors(questions, t.tok, t.cfg.task)
    expect = bald(ensemble_scores(ens, t.ctx)(q, s))
    got = torch.tensor([items[x.item_id].acquisition for x in questions], dtype=torch.float64)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-9)
    assert served[0] == max(rest, key=lambda i: (items[i].acquisition, -i))


def test_a_single_reward_model_is_refused(ranked, tmp_path, capsys):
    db, _, _ = ranked
    run = str(tmp_path / "one")
    assert main(["train-reward", "tiny", "--db", db, "--run-dir", run]) == 0
    capsys.readouterr()
    before = open(db, "rb").read()
    assert main(["rank-queue", "--db", db, "--run-dir", run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds one reward model, not an ensemble" in err[0]
    assert open(db, "rb").read() == before
