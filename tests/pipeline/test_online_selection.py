"""train-policy --online with directed selection: each request after the first asks the questions the current
ensemble ranks highest among the policy's candidates, and a run killed in the loop resumes bitwise."""

from __future__ import annotations

import pytest
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl
from lmprefs.labels.store import LabelStore

ARGS = ["train-policy", "tiny", "--run.log-interval", "100", "--task.truncate-token", "none", "--online",
        "--labeler", "vader", "--ppo.total-episodes", str(16 * 6), "--run.save-interval", "2",
        "--labels.online-interval", "2", "--labels.online-retrains", "1", "--labels.online-questions", "8",
        "--labels.select", "spread", "--train-reward.ensemble", "2", "--labels.pool-factor", "3"]  # fmt: skip


def dump(run_dir) -> dict:
    with LabelStore(run_dir / "labels.sqlite") as store:
        c = store.connection()
        items = [store.get_item(i) for (i,) in c.execute("SELECT id FROM items ORDER BY id")]
        labels = c.execute("SELECT item_id, best FROM labels ORDER BY id").fetchall()
    return {"items": [(it.query, it.samples, it.batch, it.acquisition) for it in items], "labels": labels}


def metrics(run_dir):
    return [{k: v for k, v in r.items() if k not in ("elapsed/fps", "elapsed/time")}
            for r in read_jsonl(run_dir / "metrics.jsonl")]  # fmt: skip


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    d = tmp_path_factory.mktemp("online") / "full"
    assert main([*ARGS, "--run-dir", str(d)]) == 0
    return d


def test_requests_after_the_first_ask_the_ensembles_choice(full):
    store = dump(full)
    by_batch: dict = {}
    for _, _, batch, acq in store["items"]:
        by_batch.setdefault(batch, []).append(acq)
    assert sorted(by_batch) == ["online:0", "online:2", "online:4"]
    assert by_batch["online:0"] == [None] * 8  # before any reward model: as sampled
    for b in ("online:2", "online:4"):
        assert len(by_batch[b]) == 8 and by_batch[b] == sorted(by_batch[b], reverse=True)
    assert len(store["labels"]) == 24


@pytest.mark.parametrize(("point", "nth"), [("train:logged", 4), ("select:sampled", 2)])
def test_an_online_run_killed_in_the_loop_resumes_bitwise(full, tmp_path, monkeypatch, point, nth):
    # after the request at update 4, before its checkpoint; or in that request, between sampling and choosing
    d = tmp_path / "killed"
    killed(monkeypatch, [*ARGS, "--run-dir", str(d)], point, nth)
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert dump(d) == dump(full)
    assert metrics(d) == metrics(full)
    assert (d / "online.jsonl").read_text() == (full / "online.jsonl").read_text()
