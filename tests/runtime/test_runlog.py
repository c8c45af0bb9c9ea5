"""One run-directory layout for every command and the optional trackers (run.report_to)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import types

import pytest

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.io.jsonl import read_jsonl
from lmprefs.runtime.runlog import RunLogger, read_metrics

R = dataclasses.replace


def _fake(name: str, calls: list) -> types.ModuleType:
    """A stand-in tracker module that records its calls (wandb and mlflow are optional and not installed here)."""
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def rec(fn):
        return lambda *a, **k: calls.append((f"{name}.{fn}", a, k)) or run

    run = types.SimpleNamespace(**{fn: rec(fn) for fn in ("define_metric", "log", "finish")})
    for fn in ("init", "set_tracking_uri", "start_run", "log_params", "log_metrics", "end_run"):
        setattr(mod, fn, rec(fn))
    return mod


def test_phases_share_one_layout_and_trackers_get_the_same_names(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(__import__("sys").modules, "wandb", _fake("wandb", calls))
    monkeypatch.setitem(__import__("sys").modules, "mlflow", _fake("mlflow", calls))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = preset("tiny")
    cfg = R(cfg, run=R(cfg.run, report_to=("tensorboard", "wandb", "mlflow")))
    log = RunLogger(tmp_path, cfg)
    log.scalars({"train_reward/minibatch/loss": 1.2}, 8, phase="reward")
    log.scalars({"objective/kl": 0.5, "objective/score": float("nan")}, 1)
    log.scalars({"objective/kl": 0.7}, 2)
    log.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(r["phase"], r["step"]) for r in rows] == [("reward", 8), ("policy", 1), ("policy", 2)]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    assert any((tmp_path / "logs" / "reward").glob("events.out.tfevents.*"))
    assert any((tmp_path / "logs" / "policy").glob("events.out.tfevents.*"))
    logged = [a[0] for n, a, _ in calls if n == "wandb.log"]
    assert logged[0] == {"reward/train_reward/minibatch/loss": 1.2, "reward/step": 8}
    assert logged[1] == {"policy/objective/kl": 0.5, "policy/step": 1}  # NaN is left out, as TensorBoard shows it
    mlflow_logged = [(a[0], k["step"]) for n, a, k in calls if n == "mlflow.log_metrics"]
    assert mlflow_logged[2] == ({"policy/objective/kl": 0.7}, 2)
    uri = [a[0] for n, a, _ in calls if n == "mlflow.set_tracking_uri"]
    assert uri == [f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"]  # in the run unless MLFLOW_TRACKING_URI is set
    assert {n for n, _, _ in calls} >= {"wandb.init", "wandb.finish", "mlflow.start_run", "mlflow.end_run"}

    # resuming at update 1 drops the later policy rows and keeps the reward model's (its steps count labels)
    RunLogger(tmp_path, R(cfg, run=R(cfg.run, report_to=())), resume_step=1).close()
    assert [(r["phase"], r["step"]) for r in read_jsonl(tmp_path / "metrics.jsonl")] == [("reward", 8), ("policy", 1)]


def test_mlflow_logs_to_an_sqlite_store_in_the_run_directory(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = preset("tiny")
    log = RunLogger(tmp_path / "run", R(cfg, run=R(cfg.run, report_to=("mlflow",))))
    log.scalars({"objective/kl": 0.5}, 1)
    log.close()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [m.value for m in client.get_metric_history(run.info.run_id, "policy/objective/kl")] == [0.5]
    assert run.data.params["ppo.lr"] == str(cfg.ppo.lr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing beside the run directory


def test_a_tracking_uri_mlflow_refuses_is_one_line(tmp_path, monkeypatch, capsys):
    calls: list = []
    fake = _fake("mlflow", calls)

    class MlflowException(Exception):
        pass

    def refuse(**kw):
        raise MlflowException("The filesystem tracking backend (e.g., './mlruns') is in maintenance mode\nmore")

    fake.start_run = refuse
    monkeypatch.setitem(__import__("sys").modules, "mlflow", fake)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "./mlruns")
    args = ["train-reward", "tiny", "--run.report-to", "mlflow", "--db", "x.jsonl", "--labels.type", "best_of_2",
            "--run-dir", str(tmp_path / "r")]  # fmt: skip
    (tmp_path / "x.jsonl").write_text("".join(f'{{"prompt": "q{i}", "chosen": "a", "rejected": "b"}}\n'
                                              for i in range(8)))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lmprefs train-reward: error: run.report_to=mlflow: mlflow refuses MLFLOW_TRACKING_URI=./mlruns "
                   "(The filesystem tracking backend (e.g., './mlruns') is in maintenance mode)"], err


def test_missing_tracker_is_one_line_before_any_work(tmp_path, capsys):
    pytest.importorskip("lmprefs")  # (wandb itself must be absent for this test)
    if __import__("importlib.util").util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    args = ["train-reward", "tiny", "--run.report-to", "tensorboard,wandb", "--run-dir", str(tmp_path / "r")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "pip install wandb" in err and len(err.splitlines()) == 1 and not (tmp_path / "r").exists()
    assert main(["train-reward", "tiny", "--run.report-to", "comet"]) == 2
    assert "'comet' is not tensorboard, wandb or mlflow" in capsys.readouterr().err


def test_train_reward_logs_in_the_same_layout_as_train_policy(tmp_path, capsys):
    db = tmp_path / "l.sqlite"
    assert main(["label", "tiny", "--db", str(db), "--n", "24"]) == 0
    assert main(["train-reward", "tiny", "--db", str(db), "--run-dir", str(tmp_path / "r")]) == 0
    rows = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert rows and {r["phase"] for r in rows} == {"reward"}
    assert any((tmp_path / "r" / "logs" / "reward").glob("events.out.tfevents.*"))
    assert not (tmp_path / "r" / "reward_model_logs").exists()
    assert json.loads((tmp_path / "r" / "config.json").read_text())["run"]["report_to"] == ["tensorboard"]
