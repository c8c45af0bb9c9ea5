import json
import re
import threading

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl
from lmprefs.labels.store import LabelStore
from lmprefs.pipeline import online
from lmprefs.pipeline.online import retrain_points


def test_retrain_points_are_evenly_spaced_inside_the_run():
    assert retrain_points(100, 19) == set(range(5, 100, 5))
    assert retrain_points(10, 4) == {2, 4, 6, 8}
    assert retrain_points(3, 19) <= {1, 2}


def test_online_simulated_labeler_answers_the_queue_and_reward_model_retrains(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["train-policy", "tiny", "--online", "--labeler", "vader", "--run-dir", str(run_dir),
            "--ppo.total-episodes", "96", "--labels.online-interval", "2", "--labels.online-retrains", "2",
            "--labels.online-questions", "16"]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(x) for x in (run_dir / "online.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [0, 2, 4]
    assert [r["labels"] for r in rows] == [16, 32, 48]  # every reward model saw all labels so far
    assert "| 2 | 4 | 48 |" in (run_dir / "online.md").read_text()
    store = LabelStore(run_dir / "labels.sqlite")
    assert store.table_counts()["items"] == 16 * 3  # requests before updates 1, 3 and 5; none after the last
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert metrics[-1]["online/labels"] >= 48
    # each new batch measures the reward model scoring then, before the retrain at its update takes the batch in
    agree = [(m["step"], m["online/rm_agreement_labels"]) for m in metrics if "online/rm_agreement" in m]
    assert agree == [(2, 16), (4, 16)]
    out = capsys.readouterr().out
    assert "reward models of this run" in out
    # the retrains' lines round the accuracy as online.md does (they printed 0.3571428656578064)
    assert re.findall(r"retrained at update \d+ on \d+ labels \(held-out accuracy (\S+)\)", out) == [
        "-" if r["heldout_accuracy"] is None else f"{r['heldout_accuracy']:.3f}" for r in rows[1:]]  # fmt: skip


def test_online_retrains_train_on_every_label_so_far_not_the_first_num_train(tmp_path):
    # each retrain took the first labels.num_train labels in store order: from the cap on, the same labels each time
    run_dir = tmp_path / "run"
    assert main(["train-policy", "tiny", "--online", "--labeler", "vader", "--run-dir", str(run_dir),
                 "--ppo.total-episodes", "96", "--labels.online-interval", "2", "--labels.online-retrains", "2",
                 "--labels.online-questions", "16", "--labels.num-train", "8"]) == 0  # fmt: skip
    rows = read_jsonl(run_dir / "online.jsonl")
    assert [r["labels"] for r in rows] == [16, 32, 48]
    trained = [r["labels_train"] for r in rows]
    assert trained[0] > 8 and trained[0] < trained[1] < trained[2]


def test_online_with_people_waits_for_judgments_from_the_queue(tmp_path, monkeypatch):
    """No simulated labeler: training waits until people (here a thread using the store as the web app does) answer."""
    monkeypatch.setattr(online.OnlineRewards, "poll_seconds", 0.1)
    run_dir = tmp_path / "run"
    db = run_dir / "labels.sqlite"
    run_dir.mkdir()
    stop = threading.Event()

    def person():
        store = LabelStore(db)
        while not stop.is_set():
            item = store.next_item("alice")
            if item is None:
                stop.wait(0.05)
                continue
            store.add_label(item.id, "alice", best=len(item.query) % len(item.samples), source="web")

    th = threading.Thread(target=person, daemon=True)
    th.start()
    try:
        assert main(["train-policy", "tiny", "--online", "--run-dir", str(run_dir), "--ppo.total-episodes", "32",
                     "--labels.online-questions", "16", "--labels.online-retrains", "1"]) == 0  # fmt: skip
    finally:
        stop.set()
        th.join(5)
    assert json.loads((run_dir / "run.json").read_text())["online"] is True
    assert LabelStore(db).counts_by_labeler()["alice"]["label"] >= 8


def test_retrains_with_lora_train_the_reward_adapter_and_leave_the_policy_trainable(tmp_path):
    """With LoRA the reward model and the policy are adapters on one base: a retrain must re-train the reward
    adapter from scratch and must not freeze the policy's adapter."""
    import dataclasses

    import torch

    from lmprefs.config import preset
    from lmprefs.models.lora import lora_modules
    from lmprefs.pipeline.labeling import open_store
    from lmprefs.pipeline.online import OnlineRewards
    from lmprefs.pipeline.policy import policy_for
    from lmprefs.pipeline.task import setup_task

    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, rank=4),
                              labels=dataclasses.replace(cfg.labels, online_questions=16))  # fmt: skip
    t = setup_task(cfg, n_heldout=8)
    onl = OnlineRewards(t, open_store(tmp_path / "l.sqlite"), tmp_path, "vader")
    onl.start(resume=False)
    policy = policy_for(t)
    first = [m.B["reward"].clone() for m in lora_modules(t.model)]
    onl.request(1, policy.lm, policy.adapter)
    onl.retrain(1)
    assert all(p.requires_grad for p in policy.trainable_parameters())
    second = [m.B["reward"] for m in lora_modules(t.model)]
    assert all(b.abs().sum() > 0 for b in second)
    assert not all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_agreement_is_measured_on_labels_the_scoring_reward_model_has_not_seen(tmp_path):
    """online/rm_agreement: the reward model scoring now against the labels of the questions asked since it was
    trained, once per arrival of new labels, and none after a retrain has taken them in."""
    import dataclasses

    from lmprefs.config import preset
    from lmprefs.pipeline.labeling import open_store
    from lmprefs.pipeline.online import OnlineRewards
    from lmprefs.pipeline.policy import policy_for
    from lmprefs.pipeline.task import setup_task

    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, labels=dataclasses.replace(cfg.labels, online_questions=16))
    t = setup_task(cfg, n_heldout=8)
    onl = OnlineRewards(t, open_store(tmp_path / "l.sqlite"), tmp_path, "vader")
    onl.start(resume=False)
    assert onl.agreement(0) == {}  # the first reward model trained on every label there is
    policy = policy_for(t)
    onl.request(2, policy.lm, policy.adapter)
    got = onl.agreement(2)
    assert got["online/rm_agreement_labels"] == 16 and 0 <= got["online/rm_agreement"] <= 1
    assert got["online/rm_agreement"] * 16 == round(got["online/rm_agreement"] * 16)  # a fraction of 16 questions
    assert onl.agreement(3) == {}  # no new label since
    onl.request(4, policy.lm, policy.adapter)
    assert onl.agreement(4)["online/rm_agreement_labels"] == 32  # both batches since the retrain at update 0
    onl.retrain(4)
    assert onl.agreement(4) == {}
    state = onl.state_dict()
    assert state["measured"] == [0, 32]


def test_falling_agreement_pulls_the_andon_cord(tmp_path, monkeypatch):
    """Where no true reward is known, ppo.overoptimization_stop watches the reward model's agreement with fresh
    labels: from 1 to 0 its running mean falls 0.2 below its best, past a stop of 0.1, at the second update."""
    falling = iter([1.0] + [0.0] * 9)
    monkeypatch.setattr(online.OnlineRewards, "agreement", lambda self, u: {"online/rm_agreement": next(falling)})
    run_dir = tmp_path / "run"
    rc = main(["train-policy", "tiny", "--online", "--labeler", "vader", "--run-dir", str(run_dir),
               "--ppo.total-episodes", "96", "--labels.online-questions", "16", "--labels.online-retrains", "1",
               "--ppo.overoptimization-stop", "0.1", "--ppo.score-drop-stop", "null"])  # fmt: skip
    assert rc == 3
    andon = json.loads((run_dir / "ANDON").read_text())
    assert andon["update"] == 2 and "agreement with labels it has not seen" in andon["reason"]
