"""A reward-model ensemble killed while a member trains resumes with the members that finished: they are loaded from
where they were staged, not trained again, and the published ensemble, metrics.jsonl and TensorBoard logs are those
of a run never killed."""

import json

import pytest
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.io.jsonl import read_jsonl
from lmprefs.models.ensemble import member_seed
from lmprefs.pipeline import reward_model as rm_mod

SEED = preset("tiny").run.seed
TINY = ["train-reward", "tiny", "--train-reward.ensemble", "3", "--run.log-interval", "1"]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("labels") / "labels.sqlite"
    assert main(["label", "tiny", "--db", str(path), "--n", "40"]) == 0
    return path


def counted(monkeypatch) -> list[int]:
    """The seeds of the members train_epoch trains from now on."""
    calls: list[int] = []
    real = rm_mod.train_epoch
    monkeypatch.setattr(rm_mod, "train_epoch", lambda *a, **k: calls.append(k["seed"]) or real(*a, **k))
    return calls


def _no_clock(x):
    """JSON without its wall-clock figures (seconds, elapsed/time), which no two runs share."""
    if isinstance(x, dict):
        return {k: _no_clock(v) for k, v in x.items() if k not in ("seconds", "elapsed/time")}
    return [_no_clock(v) for v in x] if isinstance(x, list) else x


def published(d) -> dict:
    """Every file of a published reward-model directory: bytes, and JSON without its clock figures (the manifest's
    sha256 of those files differs with them, so it is left out)."""
    out = {}
    for f in sorted(p for p in (d / "reward_model").resolve().rglob("*") if p.is_file()):
        name = str(f.relative_to((d / "reward_model").resolve()))
        if name == "manifest.json" or name.endswith("README.md"):
            continue
        out[name] = _no_clock(json.loads(f.read_text())) if f.suffix == ".json" else f.read_bytes()
    return out


def rows(d) -> list[dict]:
    return [_no_clock(r) for r in read_jsonl(d / "metrics.jsonl")]


def events(d) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(d / "logs" / "reward"))
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"] if t != "elapsed/time"}


@pytest.mark.parametrize("extra", [["--lora.rank", "4", "--lora.layers", "1"], ["--train-reward.bootstrap", "true"]],
                         ids=["lora", "full-bootstrap"])  # fmt: skip
def test_an_ensemble_killed_while_member_2_trains_keeps_members_0_and_1(tmp_path, db, monkeypatch, extra):
    args = TINY + ["--db", str(db), *extra]
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(args + ["--run-dir", str(full)]) == 0
    assert not (tmp_path / "full" / "reward_model.members").exists()  # staging goes once the ensemble is published
    # the first row member 2 logs while it trains
    first_of_2 = 1 + sum(1 for r in read_jsonl(full / "metrics.jsonl")
                         if r.get("train_reward/member", 9) < 2 and "train_reward/lr" in r)  # fmt: skip
    killed(monkeypatch, args + ["--run-dir", str(d)], "reward:logged", first_of_2)
    assert not (d / "reward_model").exists() and (d / "reward_model.members" / "member-1").is_dir()
    calls = counted(monkeypatch)
    assert main(args + ["--run-dir", str(d)]) == 0
    assert calls == [member_seed(SEED, 2)]  # members 0 and 1 were loaded, not trained again
    assert published(d) == published(full)  # weights bitwise, ensemble.json and each member's lmprefs.json
    assert rows(d) == rows(full)  # each row once, in order
    assert events(d) == events(full)
    assert not (d / "reward_model.members").exists()


def test_staged_members_of_another_config_or_damaged_are_trained_again(tmp_path, db, monkeypatch):
    args = TINY + ["--db", str(db), "--lora.rank", "4", "--lora.layers", "1"]
    d = tmp_path / "killed"
    killed(monkeypatch, args + ["--run-dir", str(d)], "publish:member-1:switched")
    calls = counted(monkeypatch)
    other = args + ["--train-reward.lr", "1e-4"]
    killed(monkeypatch, other + ["--run-dir", str(d)], "publish:member-0:switched")
    assert calls == [member_seed(SEED, 0)]  # member 0 of the first config was not taken for this one
    (d / "reward_model.members" / "member-0" / "weights.pt").write_bytes(b"damaged")
    calls.clear()
    assert main(other + ["--run-dir", str(d)]) == 0
    assert calls == [member_seed(SEED, k) for k in range(3)]  # the damaged member 0 and the others' member 1: trained
    full = tmp_path / "full"
    assert main(other + ["--run-dir", str(full)]) == 0
    assert published(d) == published(full) and rows(d) == rows(full)
