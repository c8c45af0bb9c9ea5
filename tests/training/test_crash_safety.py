"""Crash safety of train-policy runs: each test stops the run at an exact point by injecting the failure,
never by timing: LMPREFS_CRASH_AT=POINT[@K] ends a child process with status 9 there, as kill -9 would, or (faster,
in this process) the same hook raises Killed, which no lmprefs code catches."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl

# no truncation filter: with the tiny model nearly every response would get the penalty score instead of the reward
TINY = ["train-policy", "tiny", "--run.log-interval", "100", "--task.truncate-token", "none"]
VADER = TINY + ["--reward", "vader", "--ppo.total-episodes", str(16 * 4)]


def crashed(args: list[str], point: str) -> subprocess.CompletedProcess:
    """Run `lmprefs ARGS` in a child process that dies at `point`; asserts that it did."""
    env = {**os.environ, "LMPREFS_CRASH_AT": point}
    r = subprocess.run([sys.executable, "-m", "lmprefs", *args], env=env, capture_output=True, text=True)
    assert r.returncode == 9, f"the run did not die at {point} (rc {r.returncode}): {r.stderr[-1500:]}"
    return r


def killed_in_process(monkeypatch, args: list[str], point: str) -> None:
    """Run `lmprefs ARGS` here, stopping it by an exception at the K-th arrival at `point` (POINT[@K])."""
    name, _, nth = point.partition("@")
    killed(monkeypatch, args, name, int(nth or 1))


def metrics(run_dir):
    """metrics.jsonl without the wall-clock columns."""
    return [{k: v for k, v in r.items() if k not in ("elapsed/fps", "elapsed/time")}
            for r in read_jsonl(run_dir / "metrics.jsonl")]  # fmt: skip


def policy_tensors(run_dir):
    from safetensors.torch import load_file

    d = run_dir / "policy"
    head = load_file(d / "value_head.safetensors")
    return load_file(d / "model.safetensors") | {f"vh.{k}": v for k, v in head.items()}


def assert_same_run(a, b):
    assert metrics(a) == metrics(b)
    x, y = policy_tensors(a), policy_tensors(b)
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(scope="module")
def vader_run(tmp_path_factory):
    """An uninterrupted 4-update run against VADER, saving every update."""
    d = tmp_path_factory.mktemp("full") / "run"
    assert main(VADER + ["--run-dir", str(d)]) == 0
    return d


# -- 1. the checkpoint swap is atomic at every instant -------------------------------------------------------------


@pytest.mark.parametrize("point", ["written", "renamed", "switched"])
def test_a_directory_write_killed_at_any_step_leaves_a_complete_directory(tmp_path, point):
    from lmprefs.models.artifacts import atomic_dir

    out = tmp_path / "checkpoint"
    with atomic_dir(out) as d:
        (d / "a.txt").write_text("old")
    pid = os.fork()
    if pid == 0:  # the child writes a second version and dies inside the swap
        os.environ["LMPREFS_CRASH_AT"] = f"publish:checkpoint:{point}"
        try:
            with atomic_dir(out) as d:
                (d / "a.txt").write_text("new")
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    assert (out / "a.txt").read_text() == ("new" if point == "switched" else "old")  # never no directory
    from lmprefs.io.publish import latest_good

    good, _ = latest_good(out)
    assert (good / "a.txt").read_text() == ("old" if point == "written" else "new")
    with atomic_dir(out) as d:  # the next write cleans up after the killed one
        (d / "a.txt").write_text("third")
    assert (out / "a.txt").read_text() == "third"
    assert not list(tmp_path.glob("checkpoint.tmp-*"))


def test_a_run_killed_between_the_checkpoint_renames_resumes_exactly(tmp_path, vader_run, capsys):
    d = tmp_path / "run"
    crashed(VADER + ["--run-dir", str(d)], "publish:checkpoint:renamed@3")  # update 3's version is on disk, unlinked
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert f"resuming {d} at update 3/4" in capsys.readouterr().out
    assert_same_run(d, vader_run)


# -- 2. damaged checkpoints are refused, or passed over for the previous good one ----------------------------------


def test_damaged_checkpoints_fall_back_to_the_previous_one_or_are_refused(tmp_path, vader_run, capsys):
    from lmprefs.io.publish import versions

    d = tmp_path / "run"
    shutil.copytree(vader_run, d, symlinks=True)
    newest, previous = versions(d / "checkpoint")
    assert json.loads((previous / "manifest.json").read_text())["update"] == 3
    state = newest / "state.pt"
    state.write_bytes(state.read_bytes()[:100])  # truncated
    capsys.readouterr()
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert "passing over a damaged version" in capsys.readouterr().out
    assert_same_run(d, vader_run)  # update 4 redone from update 3's checkpoint
    newest, previous = versions(d / "checkpoint")
    shutil.copy(previous / "state.pt", newest / "state.pt")  # one update's state with another's weights
    (previous / "policy" / "model.safetensors").write_bytes(b"\0" * 64)  # and zeroed weights
    capsys.readouterr()
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no usable checkpoint" in err and "sha256" in err and len(err.splitlines()) == 1


# -- 3. NaN is never saved; resuming after an andon stop needs a change ---------------------------------------------


def test_nan_parameters_are_never_saved_and_resume_after_andon_needs_a_change(tmp_path, monkeypatch, capsys):
    from lmprefs.training import policy as policy_mod

    real = policy_mod.ppo_update
    calls = []

    def poisoned(*args, **kw):  # the 3rd update leaves NaN in the parameters (its own stats are still finite)
        out = real(*args, **kw)
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                for p in args[1].param_groups[0]["params"]:
                    p.fill_(float("nan"))
        return out

    monkeypatch.setattr(policy_mod, "ppo_update", poisoned)
    d = tmp_path / "run"
    assert main(VADER + ["--run-dir", str(d)]) == 3
    assert "update 2" in capsys.readouterr().err
    assert json.loads((d / "checkpoint" / "manifest.json").read_text())["update"] == 2  # the last good one
    assert json.loads((d / "ANDON").read_text())["update"] == 3
    monkeypatch.setattr(policy_mod, "ppo_update", real)
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 2
    assert "non-finite parameter" in capsys.readouterr().err
    assert main(["train-policy", "tiny", "--resume", "--continue-after-andon", "--run-dir", str(d)]) == 2
    assert "needs a change" in capsys.readouterr().err
    assert main(["train-policy", "tiny", "--resume", "--continue-after-andon", "--run-dir", str(d),
                 "--ppo.lr", "5e-5"]) == 0  # fmt: skip
    meta = json.loads((d / "run.json").read_text())
    assert meta["continued_after_andon"][0]["changes"] == ["ppo.lr 0.003 -> 5e-05"]
    assert meta["continued_after_andon"][0]["resumed_at"] == 2 and not (d / "ANDON").exists()
    assert all(torch.isfinite(v).all() for v in policy_tensors(d).values())
    assert [r["step"] for r in read_jsonl(d / "metrics.jsonl")] == [1, 2, 3, 4]


# -- 4. online runs resume exactly ----------------------------------------------------------------------------------


def test_an_online_run_killed_after_a_label_request_and_retrain_resumes_exactly(tmp_path, monkeypatch):
    args = TINY + ["--online", "--labeler", "vader", "--ppo.total-episodes", str(16 * 6), "--run.save-interval", "2",
                   "--labels.online-interval", "2", "--labels.online-retrains", "1",
                   "--labels.online-questions", "16"]  # fmt: skip
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(args + ["--run-dir", str(full)]) == 0
    # requests after updates 2 and 4, a retrain after 3, checkpoints at 2, 4, 6. Killed after update 4 is logged,
    # before its checkpoint: the redo from update 2 must retrain at 3 without the batch asked for at 4, and must
    # not ask for 4 again
    killed_in_process(monkeypatch, args + ["--run-dir", str(d)], "train:logged@4")
    assert json.loads((d / "run.json").read_text())["store"] == str((d / "labels.sqlite").resolve())
    monkeypatch.chdir(tmp_path)  # the recorded store path does not depend on where --resume runs
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert_same_run(d, full)
    assert (d / "online.jsonl").read_text() == (full / "online.jsonl").read_text()
    assert [r["online/reward_model"] for r in read_jsonl(d / "metrics.jsonl")] == [0, 0, 0, 1, 1, 1]
    from lmprefs.labels.store import LabelStore

    a, b = LabelStore(full / "labels.sqlite"), LabelStore(d / "labels.sqlite")
    assert a.table_counts() == b.table_counts()


# -- 5. the reward model trained in the same run (LoRA or full fine-tuning) resumes bitwise -------------------------


@pytest.mark.parametrize("lora", [["--lora.rank", "4"], [], ["--lora.rank", "4", "--train-reward.ensemble", "2"]],
                         ids=["lora", "full", "lora-ensemble"])  # fmt: skip
def test_a_run_with_its_own_reward_model_resumes_bitwise(tmp_path, monkeypatch, lora):
    db = tmp_path / "labels.sqlite"
    assert main(["label", "tiny", "--db", str(db), "--n", "40"]) == 0
    args = TINY + ["--db", str(db), *lora, "--ppo.total-episodes", str(16 * 4)]
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(args + ["--run-dir", str(full)]) == 0
    killed_in_process(monkeypatch, args + ["--run-dir", str(d)], "train:saved@2")
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    # scored by the very reward model the uninterrupted run scored with, not by reward_model/, the export with the
    # gain and constant folded into its head and final norm (equal scores up to rounding only)
    assert_same_run(d, full)


def test_a_conservative_ensemble_run_logs_its_members_and_resumes_its_alarm_bitwise(tmp_path, monkeypatch):
    """rewards.ensemble_reduce min against a two-member ensemble trained in the run, with the over-optimization
    cord watching the members' disagreement (a stop too wide to pull): killed after its second checkpoint, the
    resumed run logs what the uninterrupted one does, each step once, and its checkpoint holds the same alarm state,
    the running mean and lowest running mean of objective/score_members_std."""
    from lmprefs.training.policy_checkpoint import find_checkpoint

    db = tmp_path / "labels.sqlite"
    assert main(["label", "tiny", "--db", str(db), "--n", "40"]) == 0
    args = TINY + ["--db", str(db), "--lora.rank", "4", "--train-reward.ensemble", "2", "--rewards.ensemble-reduce",
                   "min", "--ppo.overoptimization-stop", "100", "--ppo.total-episodes", str(16 * 4)]  # fmt: skip
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(args + ["--run-dir", str(full)]) == 0
    killed_in_process(monkeypatch, args + ["--run-dir", str(d)], "train:saved@2")
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert_same_run(d, full)
    rows = [r for r in read_jsonl(full / "metrics.jsonl") if r.get("phase") == "policy"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    std = [r["objective/score_members_std"] for r in rows]
    assert all(x > 0 for x in std) and all(r["objective/score"] <= r["objective/score_members_mean"] for r in rows)
    for r in rows:  # under min the reward is at most each member's own mean score, which is logged too
        own = [r["objective/score_member_0"], r["objective/score_member_1"]]
        assert r["objective/score"] <= min(own) + 1e-6 and abs(sum(own) / 2 - r["objective/score_members_mean"]) < 1e-5
    ema, lowest = None, float("inf")  # the cord's smoothing (training/policy.py running_mean)
    for x in std:
        ema = x if ema is None else 0.8 * ema + 0.2 * x
        lowest = min(lowest, ema)
    for run in (full, d):
        found = find_checkpoint(run)
        assert found is not None
        state = torch.load(found[0] / "state.pt", weights_only=True)
        assert state["watched"]["objective/score_members_std"] == [ema, lowest]


# -- 6. logs after resume -------------------------------------------------------------------------------------------


def test_resumed_logs_have_each_step_once_even_if_killed_while_truncating(tmp_path, vader_run, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d = tmp_path / "run"
    killed_in_process(monkeypatch, VADER + ["--run-dir", str(d), "--run.save-interval", "2"], "train:logged@3")
    rows = (d / "metrics.jsonl").read_text()
    assert len(rows.splitlines()) == 3
    killed_in_process(monkeypatch, ["train-policy", "tiny", "--resume", "--run-dir", str(d)],
                      "atomic-write:metrics.jsonl")  # fmt: skip
    assert (d / "metrics.jsonl").read_text() == rows  # a kill while truncating loses nothing
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert metrics(d) == metrics(vader_run)
    ea = EventAccumulator(str(d / "logs" / "policy"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("objective/kl")] == [1, 2, 3, 4]


def test_a_begun_run_is_not_restarted_over_itself_and_resume_before_any_checkpoint_starts_over(
    tmp_path, vader_run, capsys, monkeypatch
):
    d = tmp_path / "run"
    killed_in_process(monkeypatch, VADER + ["--run-dir", str(d), "--run.save-interval", "100"], "train:logged@1")
    assert not (d / "checkpoint").exists() and len(read_jsonl(d / "metrics.jsonl")) == 1
    capsys.readouterr()
    assert main(VADER + ["--run-dir", str(d)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert "starting the run over" in capsys.readouterr().out
    assert metrics(d) == metrics(vader_run)


# -- 7. resume refuses what changes the math ------------------------------------------------------------------------


def test_resume_refuses_what_would_change_the_math_and_names_it(tmp_path, vader_run, capsys):
    d = tmp_path / "run"
    shutil.copytree(vader_run, d, symlinks=True)
    resume = ["train-policy", "tiny", "--resume", "--run-dir", str(d)]
    other_cfg = tmp_path / "other.json"
    cfg = json.loads((d / "config.json").read_text())
    other_cfg.write_text(json.dumps({**cfg, "ppo": {**cfg["ppo"], "lr": 0.5}}))
    for extra, words in [(["--reward", "descriptiveness"], "--reward vader, not descriptiveness"),
                         (["--ppo.lr", "0.5"], "ppo.lr 0.003 -> 0.5"),
                         (["--config", str(other_cfg)], "ppo.lr 0.003 -> 0.5")]:  # fmt: skip
        capsys.readouterr()
        assert main(resume + extra) == 2, extra
        assert words in capsys.readouterr().err, extra
    assert main(["train-policy", "quickstart", "--resume", "--run-dir", str(d)]) == 2
    assert "preset tiny, not quickstart" in capsys.readouterr().err
    (d / "config.json").write_text(json.dumps({**cfg, "rewards": {**cfg["rewards"], "kl_coef": 0.3}}))  # hand-edited
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert "config.json differs from the config its checkpoint was trained with" in err and "rewards.kl_coef" in err
    (d / "config.json").write_text(json.dumps(cfg))
    assert main(resume + ["--run.log-interval", "5"]) == 0  # how often it logs is not math


# -- 8. one process per run directory -------------------------------------------------------------------------------


def test_a_second_process_on_a_run_directory_is_refused_and_told_who_holds_it(tmp_path, capsys):
    d = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from lmprefs.io.locks import run_lock\n"
                               f"with run_lock({str(d)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(VADER + ["--run-dir", str(d)]) == 2
        err = capsys.readouterr().err
        assert f"in use by pid {holder.pid} on " in err and " since " in err
    finally:
        holder.kill()
        holder.wait()
    from lmprefs.io.locks import run_lock

    with run_lock(d):  # a killed holder leaves no lock behind
        pass


# -- 8. a run killed before its first checkpoint, at any point, can be resumed -------------------------------------


def test_a_run_killed_while_its_reward_model_trains_resumes_and_logs_each_step_once(tmp_path, monkeypatch):
    db = tmp_path / "labels.sqlite"
    assert main(["label", "tiny", "--db", str(db), "--n", "40"]) == 0
    args = TINY + ["--db", str(db), "--ppo.total-episodes", str(16 * 2), "--run.log-interval", "1"]
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(args + ["--run-dir", str(full)]) == 0
    killed_in_process(monkeypatch, args + ["--run-dir", str(d)], "reward:logged@2")
    assert [r["phase"] for r in read_jsonl(d / "metrics.jsonl")] == ["reward", "reward"]
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert_same_run(d, full)  # the reward model trained again from its start, its rows logged once
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def events(run, phase):
        ea = EventAccumulator(str(run / "logs" / phase))
        ea.Reload()
        tags = ea.Tags()
        return {t: [e.step for e in ea.Scalars(t)] for t in tags["scalars"]} | {
            t: [e.step for e in ea.Tensors(t)] for t in tags["tensors"]}  # the hyperparameters' text

    for phase in ("reward", "policy"):  # logs/policy holds the hyperparameters though the killed run never began it
        assert events(d, phase) == events(full, phase)


def test_a_run_killed_at_its_first_writes_starts_again_and_leaves_no_temporary_files(tmp_path, vader_run):
    d = tmp_path / "run"
    crashed(VADER + ["--run-dir", str(d)], "atomic-write:run.json")
    assert (d / "config.json").is_file() and not (d / "run.json").exists() and list(d.glob("run.json.tmp-*"))
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 2  # how it was started is unknown
    assert main(VADER + ["--run-dir", str(d)]) == 0  # but nothing was trained: it starts again in place
    assert metrics(d) == metrics(vader_run) and not list(d.rglob("*.tmp-*"))


def test_a_finished_run_resumed_trains_nothing_and_publishes_nothing_again(tmp_path, vader_run, capsys):
    from lmprefs.io.publish import versions

    d = tmp_path / "run"
    shutil.copytree(vader_run, d, symlinks=True)
    before = versions(d / "policy")
    capsys.readouterr()
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "finished all 4 updates already" in out and "nan" not in out
    assert versions(d / "policy") == before and metrics(d) == metrics(vader_run)


def test_a_checkpoint_whose_state_is_of_another_update_is_set_aside_for_the_previous_one(tmp_path, vader_run, capsys):
    from lmprefs.io.publish import sha256_file, versions

    d = tmp_path / "run"
    shutil.copytree(vader_run, d, symlinks=True)
    newest, previous = versions(d / "checkpoint")
    shutil.copy(previous / "state.pt", newest / "state.pt")  # update 3's state beside update 4's manifest...
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["files"]["state.pt"] = sha256_file(newest / "state.pt")  # ...which lists it as its own
    (newest / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert "passing over a damaged version" in capsys.readouterr().out
    assert newest.with_name(newest.name + ".damaged").is_dir()
    assert_same_run(d, vader_run)  # update 4 redone from update 3's checkpoint
