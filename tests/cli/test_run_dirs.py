"""A run directory belongs to the command that made it (RUN_DIR/command.json): every other command that would write
into it refuses in one line naming the directory and its command, exit 2, writing nothing; evaluate reads runs and
writes its own. A killed quickstart continues from its own command line, and a killed evaluation is done again in
place by its own."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl

QS = ["quickstart", "--preset", "tiny", "--eval-queries", "16", "--run.save-interval", "1"]


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished tiny quickstart (qs/) and a train-dpo run (dpo/) on a label store of its own."""
    d = tmp_path_factory.mktemp("runs")
    assert main([*QS, "--run-dir", str(d / "qs")]) == 0
    assert main(["label", "tiny", "--db", str(d / "labels.sqlite"), "--n", "16"]) == 0
    assert main(["train-dpo", "tiny", "--db", str(d / "labels.sqlite"), "--run-dir", str(d / "dpo"),
                 "--dpo.batch-size", "8"]) == 0  # fmt: skip
    return d


def test_each_run_directory_records_its_command(runs):
    for name, command in (("qs", "quickstart"), ("dpo", "train-dpo")):
        assert json.loads((runs / name / "command.json").read_text()) == {"command": command}


REFUSED = [  # (argv with {qs}, {dpo}, {db} for the paths, the command that owns the directory)
    (["experiment", "compare", "tiny", "--run-dir", "{qs}"], "quickstart"),
    (["experiment", "compare", "tiny", "--run-dir", "{qs}", "--db", "{qs}/labels.sqlite"], "quickstart"),
    (["experiment", "kl-frontier", "tiny", "--run-dir", "{dpo}"], "train-dpo"),
    (["experiment", "mock-sentiment", "tiny", "--run-dir", "{qs}"], "quickstart"),
    (["evaluate", "{dpo}", "--reward", "vader", "--out", "{dpo}"], "train-dpo"),
    (["evaluate", "{qs}", "--reward", "vader", "--out", "{dpo}"], "train-dpo"),
    (["train-policy", "tiny", "--resume", "--run-dir", "{dpo}"], "train-dpo"),
    (["train-policy", "tiny", "--reward", "vader", "--run-dir", "{qs}"], "quickstart"),
    (["train-dpo", "tiny", "--resume", "--run-dir", "{qs}"], "quickstart"),
    (["train-dpo", "tiny", "--db", "{db}", "--run-dir", "{qs}"], "quickstart"),
    (["train-reward", "tiny", "--db", "{db}", "--run-dir", "{dpo}"], "train-dpo"),
    (["train-sft", "tiny", "--sft.data", "{db}", "--run-dir", "{dpo}"], "train-dpo"),
    (["quickstart", "--preset", "tiny", "--run-dir", "{dpo}"], "train-dpo"),
]


@pytest.mark.parametrize("argv,owner", REFUSED, ids=[" ".join(r[0][:2]) + f" into {r[1]}" for r in REFUSED])
def test_another_commands_run_directory_is_refused_and_left_as_it_was(runs, capsys, argv, owner):
    paths = {"qs": runs / "qs", "dpo": runs / "dpo", "db": runs / "labels.sqlite"}
    argv = [a.format(**paths) for a in argv]
    target = paths["qs" if owner == "quickstart" else "dpo"]
    gc.collect()  # a store connection an earlier test left open closes now (taking its -wal and -shm), not mid-test
    before = _tree(runs)
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and f"{target}: holds a run of `lmprefs {owner}`" in err, err
    assert _tree(runs) == before  # nothing written: not a file, not a label, not a lock


@pytest.mark.parametrize("inside", ["{dpo}/policy", "{qs}/reward_model/ev", "{qs}/new"])
def test_an_out_inside_another_runs_directory_is_refused_and_left_as_it_was(runs, capsys, inside):
    out = inside.format(qs=runs / "qs", dpo=runs / "dpo")
    gc.collect()
    before = _tree(runs)
    assert main(["evaluate", str(runs / "qs"), "--reward", "vader", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    run = Path(out).parent if out.endswith(("policy", "new")) else Path(out).parent.parent
    owner = "train-dpo" if run.name == "dpo" else "quickstart"
    assert err == f"lmprefs evaluate: error: --out {out}: inside {run}, a run directory of `lmprefs {owner}`; " \
                  "choose a --out outside it"  # fmt: skip
    assert _tree(runs) == before


def test_a_directory_of_an_earlier_lmprefs_is_told_by_what_it_holds(runs, tmp_path, capsys):
    old = tmp_path / "dpo"
    shutil.copytree(runs / "dpo", old, symlinks=True)
    (old / "command.json").unlink()
    assert main(["evaluate", str(runs / "qs"), "--reward", "vader", "--out", str(old)]) == 2
    assert f"{old}: holds a run of `lmprefs train-dpo`" in capsys.readouterr().err
    assert not (old / "command.json").exists()
    assert main(["train-dpo", "tiny", "--resume", "--run-dir", str(old)]) == 0  # its own command takes it
    assert "finished already" in capsys.readouterr().out


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_an_evaluation_killed_before_its_report_is_done_again_by_its_command_line(runs, tmp_path, monkeypatch,
                                                                                   capsys):  # fmt: skip
    out = tmp_path / "ev"
    args = ["evaluate", str(runs / "qs"), "--reward", "vader", "--eval-queries", "8", "--out", str(out)]
    killed(monkeypatch, args, "atomic-write:report.md")
    assert (out / "results.json").is_file() and not (out / "report.md").exists()
    stale = out / f"samples.jsonl.tmp-{_dead_pid()}-x1y2z3"  # a kill -9 leaves its writer's temporary behind
    stale.write_text("half a line")
    first = json.loads((out / "results.json").read_text())
    capsys.readouterr()
    before = _tree(out)
    other = [*args[:4], "--eval-queries", "6", "--out", str(out)]  # another evaluation would mix into its files
    assert main(other) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {out}: holds an evaluation begun by `lmprefs evaluate " \
        f"{runs / 'qs'} --reward vader --eval-queries 8 --eval-samples 2 --out {out}`, which stopped before " \
        "report.md; rerun that command line" in err, err  # fmt: skip
    assert _tree(out) == before
    assert main(args) == 0
    assert "evaluating again in place" in capsys.readouterr().out
    for f in ("report.md", "samples.jsonl", "evaluation.png"):
        assert (out / f).is_file(), f
    assert not list(out.glob("*.tmp-*"))
    assert json.loads((out / "results.json").read_text()) == first  # the same evaluation, done again
    assert json.loads((out / "command.json").read_text())["command"] == "evaluate"
    assert main(args) == 2  # finished: refused


def _policy_rows(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("elapsed/")} for r in read_jsonl(run_dir / "metrics.jsonl")
            if r["phase"] == "policy"]  # fmt: skip


def test_a_quickstart_killed_in_ppo_continues_from_its_command_line_as_if_never_stopped(runs, tmp_path, monkeypatch):
    run = tmp_path / "qs"
    killed(monkeypatch, [*QS, "--run-dir", str(run)], "train:saved")  # after its first PPO checkpoint
    assert not (run / "report.md").exists()
    assert main([*QS, "--run-dir", str(run)]) == 0
    done, whole = json.loads((run / "report.json").read_text()), json.loads((runs / "qs" / "report.json").read_text())
    for d in (done, whole):
        d.pop("stages")
    assert done == whole  # the same reward model, PPO and evaluations, bitwise
    assert _policy_rows(run) == _policy_rows(runs / "qs")  # each update logged once
    assert (run / "report.md").read_text().split("| stage |")[0] == \
        (runs / "qs" / "report.md").read_text().split("| stage |")[0]  # fmt: skip


def test_a_quickstart_killed_before_it_recorded_its_labels_asks_no_question_twice(runs, tmp_path, monkeypatch):
    """Killed between the labeling pass and results.json's record of it: the rerun samples the same questions, which
    the store already holds (keyed), and labels none twice; the run ends as an uninterrupted one."""
    from lmprefs.labels.store import LabelStore

    run = tmp_path / "qs"
    # the 4th write of results.json: after the flags, the initial evaluation and its time, the labels' record
    killed(monkeypatch, [*QS, "--run-dir", str(run)], "atomic-write:results.json", 4)
    assert "labels" not in json.loads((run / "results.json").read_text())
    held = LabelStore(run / "labels.sqlite").table_counts()
    assert main([*QS, "--run-dir", str(run)]) == 0
    counts = [LabelStore(d / "labels.sqlite").table_counts() for d in (run, runs / "qs")]
    assert counts == [held, held]
    done, whole = json.loads((run / "report.json").read_text()), json.loads((runs / "qs" / "report.json").read_text())
    assert {k: v for k, v in done.items() if k != "stages"} == {k: v for k, v in whole.items() if k != "stages"}


def test_a_quickstart_killed_while_training_its_reward_model_finishes(runs, tmp_path, monkeypatch, capsys):
    run = tmp_path / "qs"
    killed(monkeypatch, [*QS, "--run-dir", str(run)], "reward:logged")
    assert "resuming" not in capsys.readouterr().out
    killed(monkeypatch, [*QS, "--run-dir", str(run)], "train:logged")  # the rerun gets past the reward model
    assert f"resuming {run}" in capsys.readouterr().out
    assert main([*QS, "--run-dir", str(run)]) == 0

    def steps(d: Path) -> list[tuple[str, int]]:
        return [(r["phase"], r["step"]) for r in read_jsonl(d / "metrics.jsonl")]

    assert steps(run) == steps(runs / "qs")  # each step logged once, as by a run never stopped
    assert (run / "report.md").is_file()


def test_a_quickstart_begun_with_other_settings_is_not_continued_with_them(tmp_path, monkeypatch, capsys):
    run = tmp_path / "qs"
    killed(monkeypatch, [*QS, "--run-dir", str(run)], "reward:logged")
    capsys.readouterr()
    assert main([*QS, "--run-dir", str(run), "--ppo.lr", "1e-3"]) == 2
    assert "begun with another config: ppo.lr" in capsys.readouterr().err
    assert main([*QS[:-4], "--eval-queries", "8", "--run.save-interval", "1", "--run-dir", str(run)]) == 2
    assert "begun with --eval-queries 16, not 8" in capsys.readouterr().err
    # without --eval-queries (its default: up to 256) it continues with the 16 it began with
    assert main([*QS[:-4], "--run.save-interval", "1", "--run-dir", str(run)]) == 0
    assert json.loads((run / "report.json").read_text())["true_reward_after"]["n_queries"] == 16


# --- what a refused or failed command leaves behind, and what it says ---------------------------------------------


@pytest.mark.parametrize("argv,said", [
    (["train-policy", "tiny", "--reward", "nope"], "--reward 'nope'"),
    (["quickstart", "--preset", "tiny", "--task.query-dataset", "nope.txt"], "task.query_dataset='nope.txt'"),
    (["quickstart", "--preset", "tiny", "--task.query-dataset", "nope.txt", "--run-dir", "qs"], "nope.txt"),
])  # fmt: skip
def test_a_refused_start_leaves_no_folder(tmp_path, monkeypatch, capsys, argv, said):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # not the run directory, not an empty runs/


@pytest.mark.parametrize("argv", [["label", "tiny", "--n", "2"], ["train-reward", "tiny", "--run-dir", "out"],
                                  ["import-labels", "pairs.jsonl"]])  # fmt: skip
def test_an_empty_file_is_not_turned_into_a_label_store(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.sqlite").touch()
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n")
    assert main([*argv, "--db", "empty.sqlite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--db empty.sqlite: an empty file (0 bytes), not a label store; delete it, or give another "
                        "path (a store is made where none exists)"), err  # fmt: skip
    assert (tmp_path / "empty.sqlite").stat().st_size == 0 and not (tmp_path / "out").exists()


def test_push_says_what_a_directory_is_when_it_holds_no_policy_to_push(runs, tmp_path, capsys):
    sft = tmp_path / "sft"
    (sft / "sft_model").mkdir(parents=True)
    shutil.copy(runs / "qs" / "config.json", sft / "config.json")
    (sft / "command.json").write_text(json.dumps({"command": "train-sft"}))
    for argv, said in (([str(sft)], f"RUN {sft}: a run of `lmprefs train-sft`, which trains no policy that push "
                                    "uploads (the policy of a train-policy, train-dpo or quickstart run)"),
                       ([str(runs / "qs" / "policy")], f"RUN {runs / 'qs' / 'policy'}: a model inside the run "
                        f"{runs / 'qs'}; push the run directory: lmprefs push {runs / 'qs'} --repo m")):  # fmt: skip
        assert main(["push", *argv, "--repo", "m", "--hub-dir", str(tmp_path / "hub")]) == 2
        assert capsys.readouterr().err.strip().endswith(said)


def test_a_store_locked_by_another_process_says_so(tmp_path):
    import sqlite3

    from lmprefs.errors import UserError
    from lmprefs.labels.store import LabelStore

    LabelStore(tmp_path / "labels.sqlite").close()
    holder = sqlite3.connect(tmp_path / "labels.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(UserError, match="in use by another process that holds it locked"):
            LabelStore(tmp_path / "labels.sqlite", busy_timeout=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
