"""Bad values, as a fuzzing pass over every command and flag found them: empty, huge, duplicated and NaN values, a
model of the wrong kind where a language model belongs, a user's reward function that fails, data that cannot be
trained on. Each row: exit code 2, one line naming the value, nothing written (tests/refusals.py)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from refusals import assert_refused

from lmprefs.assets.models import tiny_gpt2_austen_dir

BAD_REWARDS = '''
def boom(texts):
    raise RuntimeError("kaboom")


def nan(texts):
    return [float("nan")] * len(texts)


def short(texts):
    return [1.0]


def words(texts):
    return ["high"] * len(texts)
'''


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Files the rows point at: a run of train-policy and one of train-sft as far as their directories show, a
    reward model, empty save_to_disk datasets, label and SFT files that cannot be used, and reward functions."""
    import datasets

    from lmprefs.config import preset
    from lmprefs.io.config_file import save_config

    d = tmp_path_factory.mktemp("bad-values")
    for run, model in (("run", "policy"), ("sftrun", "sft_model")):
        (d / run / model).mkdir(parents=True)
        save_config(preset("tiny"), d / run / "config.json")
        (d / run / model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    (d / "run" / "policy" / "lmprefs.json").write_text(json.dumps({"kind": "policy", "temperature": 0.7}))
    # a policy whose weights went missing after it was published
    (d / "run" / "policy" / "manifest.json").write_text(json.dumps({"files": {"model.safetensors": "0" * 64}}))
    rm = d / "rm"
    rm.mkdir()
    (rm / "lmprefs.json").write_text(json.dumps({"kind": "reward_model", "task": {}}))
    classifier = {"model_type": "gpt2", "architectures": ["GPT2ForSequenceClassification"], "num_labels": 1}
    (rm / "config.json").write_text(json.dumps(classifier))
    datasets.Dataset.from_dict({"text": []}).save_to_disk(str(d / "empty_texts"))
    datasets.Dataset.from_dict({"prompt": [], "chosen": [], "rejected": []}).save_to_disk(str(d / "empty_pairs"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": []}),
                          "test": datasets.Dataset.from_dict({"text": ["a happy ending"]})}).save_to_disk(
        str(d / "empty_split"))  # fmt: skip
    (d / "no_common.jsonl").write_text(json.dumps({"chosen": "Yes, gladly.", "rejected": "No."}) + "\n")
    nul = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a\0b"}]}
    (d / "nul_messages.jsonl").write_text(json.dumps(nul) + "\n")
    (d / "nul_pair.jsonl").write_text(json.dumps({"prompt": "q\0", "response": "a"}) + "\n")
    (d / "bad_rewards.py").write_text(BAD_REWARDS)
    (d / "empty.sqlite").write_bytes(b"")
    os.mkfifo(d / "fifo")
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "deep.jsonl").write_text('{"a": ' * 50_000 + "1" + "}" * 50_000 + "\n")
    cfg = json.loads((d / "run" / "config.json").read_text())
    cfg["lora"]["targets"] = "c_attn"  # tuple("c_attn") was its six letters
    (d / "targets_string.json").write_text(json.dumps(cfg))
    (d / "vanished").symlink_to("gone")
    return d


MODEL = str(tiny_gpt2_austen_dir())  # a saved model evaluated with a preset's config: no training needed
EVAL = ["--preset", "tiny", "--eval-queries", "2", "--eval-samples", "1", "--out", "ev"]  # failed: left no ev/
ROWS = [
    # save_to_disk datasets with no rows (an IndexError inside datasets)
    (["evaluate", "run", "--reward", "vader", "--queries", "empty_texts"], "--queries empty_texts yields no queries "
                                                                          "(it holds no texts)"),
    (["evaluate", "run", "--reward", "vader", "--queries", "empty_split:train"], "yields no queries"),
    (["import-labels", "empty_pairs", "--db", "new.sqlite"], "empty_pairs: holds no rows to import"),
    # a directory that holds no language model, where one is read
    (["train-policy", "tiny", "--reward", "vader", "--task.initial-model", "sftrun", "--run-dir", "out"],
     "task.initial_model=sftrun: is a run directory, not a model; give the model it trained, sftrun/sft_model"),
    (["train-dpo", "tiny", "--task.initial-model", "rm", "--run-dir", "out"],
     "task.initial_model=rm: is a reward model (a sequence classifier that scores texts), not a language model"),
    (["sample", "--preset", "tiny", "--task.initial-model", "rm"], "task.initial_model=rm: is a reward model"),
    (["evaluate", "rm", "--reward", "vader"], "RUN_OR_MODEL rm: is a reward model"),
    (["evaluate", "run", "--reward", "vader", "--reference", "./rm"], "--reference ./rm: is a reward model"),
    (["evaluate", "run", "--reward", "vader", "--reference", "sftrun"], "--reference sftrun: is a run directory"),
    # seeds past torch's 64 bits (a traceback), and negative ones (another seed without a word)
    (["sample", "--preset", "tiny", "--seed", "99999999999999999999"], "--seed: 99999999999999999999: must be 0 to"),
    (["sample", "--preset", "tiny", "--seed", "-1"], "argument --seed: -1: must be 0 to 4294967295"),
    (["label", "tiny", "--seed", "-1", "--db", "new.sqlite"], "argument --seed: -1: must be 0 to"),
    (["sample", "--preset", "tiny", "--run.seed", "99999999999999999999"], "run.seed=99999999999999999999 must be"),
    (["sample", "--preset", "tiny", "--run.seed", "12345678901234567891"], "run.seed=12345678901234567891 must be"),
    (["train-reward", "tiny", "--labels.subset-seed", "-1"], "labels.subset_seed=-1 must be 0 to"),
    # integers past torch's int64 (an OverflowError where torch first read them), and other values no run can use
    (["sample", "--preset", "tiny", "--best-of", "99999999999999999999", "--reward", "vader"],
     "argument --best-of: 99999999999999999999: past the 64-bit integers torch computes with"),
    (["sample", "--preset", "tiny", "--run.threads", "99999999999999999999"], "run.threads=99999999999999999999 is "
                                                                               "past the 64-bit integers"),
    (["sample", "--preset", "tiny", "--lora.rank", "99999999999999999999"], "lora.rank=99999999999999999999 is past"),
    (["sample", "--preset", "tiny", "--run.threads", "100000"], "run.threads=100000: this machine has"),
    (["sample", "--preset", "tiny", "--task.truncate-token", "99999"], "task.truncate_token=99999 is outside the "
                                                                       "vocabulary of task.initial_model"),
    (["sample", "--preset", "tiny", "--task.query-dataset", "q" * 300], "File name too long: qqqq"),
    # temperatures float32 rounds to 0: every sample was end-of-text, exit 0
    (["sample", "--preset", "tiny", "--temperature", "1e-300"], "--temperature 1e-300: must be a finite number of at"),
    (["sample", "--preset", "tiny", "--task.temperature", "1e-300"], "task.temperature=1e-300 must be at least 1e-06"),
    # a user's reward function that fails
    (["evaluate", MODEL, "--reward", "bad_rewards:boom", *EVAL], "--reward bad_rewards:boom: raised RuntimeError: "
                                                                 "kaboom"),
    (["evaluate", MODEL, "--reward", "bad_rewards:nan", *EVAL], "--reward bad_rewards:nan: returned nan for text 0"),
    (["evaluate", MODEL, "--reward", "bad_rewards:short", *EVAL], "returned 1 values for 2 texts"),
    (["evaluate", MODEL, "--reward", "bad_rewards:words", *EVAL], "must return a list of floats, one per text"),
    (["train-policy", "tiny", "--reward", "bad_rewards:nan", "--run-dir", "out"], "returned nan for text 0"),
    # a published model whose files are not all there
    (["push", "run", "--repo", "me/x", "--hub-dir", "hub"], "RUN run: run/policy: model.safetensors is missing; "
                                                            "nothing was uploaded"),
    # lists: empty, with an empty item, with an item twice
    (["experiment", "compare", "tiny", "--arms", "", "--run-dir", "exp"], "argument --arms: '' is empty"),
    (["experiment", "compare", "tiny", "--arms", " ,", "--run-dir", "exp"], "--arms ' ,': item 1 is empty"),
    (["experiment", "compare", "tiny", "--arms", "ppo,ppo", "--run-dir", "exp"], "--arms 'ppo,ppo': ppo is given"),
    (["experiment", "compare", "tiny", "--dpo-betas", "", "--run-dir", "exp"], "argument --dpo-betas: '' is empty"),
    (["experiment", "compare", "tiny", "--best-of", "2,", "--run-dir", "exp"], "--best-of '2,': item 2 is empty"),
    (["experiment", "mock-sentiment", "--labels", "1,,2", "--run-dir", "exp"], "--labels '1,,2': item 2 is empty"),
    (["experiment", "mock-sentiment", "--labels", "4,4", "--run-dir", "exp"], "--labels '4,4': 4 is given twice"),
    (["config", "tiny", "--lora.targets", "c_attn,,c_proj"], "--lora.targets 'c_attn,,c_proj': item 2 is empty"),
    (["config", "tiny", "--task.stop-tokens", "5,5"], "--task.stop-tokens '5,5': 5 is given twice"),
    # an empty flag, read as its default (the hub for --hub-dir "$UNSET", a new directory for --run-dir "")
    (["push", "run", "--repo", "me/x", "--hub-dir", ""], "argument --hub-dir: '' is empty; give a value, or leave"),
    (["train-reward", "tiny", "--run-dir", ""], "argument --run-dir: '' is empty"),
    (["evaluate", "run", "--reward", "vader", "--reference", " "], "argument --reference: ' ' is empty"),
    (["label", "tiny", "--labeler", ""], "argument --labeler: '' is empty"),
    # a 0-byte file where a label store belongs (SQLite made it one), a labeler name with a control character
    (["label", "tiny", "--db", "empty.sqlite"], "--db empty.sqlite: an empty file (0 bytes), not a label store"),
    (["import-labels", "no_common.jsonl", "--db", "empty.sqlite"], "--db empty.sqlite: an empty file (0 bytes)"),
    (["labelers", "list", "--db", "empty.sqlite"], "--db empty.sqlite: an empty file (0 bytes), not a label store"),
    (["labelers", "add", "bob\x07", "--db", "new.sqlite"], "labeler name 'bob\\x07' holds a control character"),
    # links to nothing (a file that vanished), and paths too long to look up
    (["train-reward", "tiny", "--run-dir", "vanished"], "--run-dir vanished: a link to gone, which does not exist"),
    (["evaluate", "run", "--reward", "vader", "--out", "vanished"], "--out vanished: a link to gone, which does not"),
    (["score", "--reward-model", "rm", "vanished"], "vanished: a link to gone, which does not exist"),
    (["train-policy", "tiny", "--rewards.trained-model", "m" * 300, "--run-dir", "out"],
     "rewards.trained_model mmmm"),
    # JSON nested past Python's recursion limit (a RecursionError), a config's list given as one string
    (["config", "--config", "deep.json"], "deep.json: JSON nested too deeply to be a config"),
    (["import-labels", "deep.jsonl", "--db", "new.sqlite"], "deep.jsonl line 1: JSON nested too deeply to read"),
    (["train-sft", "tiny", "--sft.data", "deep.jsonl", "--run-dir", "out"], "deep.jsonl line 1: JSON nested too"),
    (["config", "--config", "targets_string.json"], "targets_string.json: lora.targets='c_attn' must be a list"),
    # a pipe where a store or a label file belongs (reading a store's header would wait for a writer)
    (["labelers", "list", "--db", "fifo"], "--db fifo: not a regular file; give a label store file (.sqlite)"),
    (["import-labels", "fifo", "--db", "new.sqlite"], "label file fifo is not a regular file"),
    (["export-labels", "out.jsonl", "--db", "d" * 300], "--db dddd"),
    (["quickstart", "--preset", "tiny", "--eval-queries", "-1"], "--eval-queries -1: must be at least 2"),
    (["quickstart", "--preset", "tiny", "--eval-samples", "0"], "--eval-samples 0: must be at least 1"),
    # settings that would not act, and two rewards at once
    (["train-policy", "tiny", "--reward", "vader", "--ppo.rloo-k", "4", "--run-dir", "out"],
     "--ppo.rloo-k 4: acts only with a group ppo.estimator (rloo, grpo"),
    (["quickstart", "--preset", "tiny", "--lora.alpha", "8", "--run-dir", "qs"], "--lora.alpha 8: acts only with"),
    (["train-policy", "tiny", "--reward", "vader", "--rewards.trained-model", "rm", "--run-dir", "out"],
     "--reward vader and rewards.trained_model=rm both give the reward; give one"),
    # conservative ensemble rewards without an ensemble, and a negative variance weight
    (["train-policy", "tiny", "--rewards.ensemble-reduce", "min", "--run-dir", "out"],
     "rewards.ensemble_reduce=min reduces a reward-model ensemble's members' scores, but train_reward.ensemble=1 "
     "trains a single reward model"),
    (["train-policy", "tiny", "--rewards.trained-model", "rm", "--rewards.ensemble-reduce", "uwo", "--run-dir", "out"],
     "rewards.ensemble_reduce=uwo reduces a reward-model ensemble's members' scores, but rewards.trained_model=rm is "
     "a single reward model"),
    (["train-policy", "tiny", "--reward", "vader", "--rewards.ensemble-reduce", "min", "--run-dir", "out"],
     "but --reward vader is a reward function"),
    (["train-dpo", "tiny", "--online", "--reward", "vader", "--rewards.ensemble-reduce", "min", "--run-dir", "out"],
     "but --reward vader is a reward function"),
    (["sample", "--preset", "tiny", "--best-of", "2", "--reward-model", "rm", "--rewards.ensemble-reduce", "min"],
     "rewards.ensemble_reduce=min reduces a reward-model ensemble's members' scores, but --reward-model rm is a "
     "single reward model"),
    (["sample", "--preset", "tiny", "--best-of", "2", "--reward", "vader", "--rewards.ensemble-reduce", "uwo"],
     "but --reward vader is a reward function"),
    (["train-policy", "tiny", "--train-reward.ensemble", "2", "--rewards.ensemble-reduce", "uwo",
      "--rewards.uwo-lambda", "-1", "--run-dir", "out"], "rewards.uwo_lambda=-1.0 must be a finite number >= 0"),
    (["sample", "--preset", "tiny", "--rewards.ensemble-reduce", "uwo", "--rewards.uwo-lambda", "nan"],
     "rewards.uwo_lambda=nan must be a finite number >= 0"),
    # label and SFT data that cannot be trained on
    (["import-labels", "no_common.jsonl", "--db", "new.sqlite"], "no_common.jsonl line 1: 'chosen' and 'rejected' "
                                                                 "have no beginning in common"),
    (["train-sft", "tiny", "--sft.data", "nul_messages.jsonl", "--run-dir", "out"],
     "nul_messages.jsonl line 1: messages[1] content holds a NUL character"),
    (["train-sft", "tiny", "--sft.data", "nul_pair.jsonl", "--run-dir", "out"], "prompt holds a NUL character"),
]  # fmt: skip


@pytest.mark.parametrize("argv,needle", ROWS, ids=[" ".join(r[0]).replace(MODEL, "MODEL")[:150] for r in ROWS])
def test_a_bad_value_exits_2_with_one_line_and_writes_nothing(argv, needle, workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir))  # bad_rewards
    monkeypatch.delitem(sys.modules, "bad_rewards", raising=False)  # this workdir's, not one another test imported
    assert_refused(argv, needle, workdir, capsys)


def test_an_override_is_inert_only_where_the_config_keeps_it_from_acting():
    from lmprefs.config import preset
    from lmprefs.config.overrides import apply_overrides
    from lmprefs.config.validate import inert_overrides

    pairs = [("ppo.rloo-k", "4"), ("lora.alpha", "8")]
    assert len(inert_overrides(apply_overrides(preset("tiny"), pairs), pairs)) == 2
    for estimator in ("rloo", "grpo"):
        on = [*pairs, ("ppo.estimator", estimator), ("lora.rank", "4")]
        assert inert_overrides(apply_overrides(preset("tiny"), on), on) == []


def test_a_store_locked_by_another_process_says_so(tmp_path):
    import sqlite3

    from lmprefs.errors import UserError
    from lmprefs.labels.store import LabelStore

    path = tmp_path / "labels.sqlite"
    LabelStore(path).close()
    other = sqlite3.connect(path, isolation_level=None)  # another writer, mid-transaction
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(UserError, match=r"in use by another process that holds it locked \(waited 0.2s\)"):
            LabelStore(path, busy_timeout=0.2)
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_quickstart_refuses_more_eval_queries_than_the_task_sets_aside(tmp_path, capsys):
    """Evaluated on the 139 there were, without a word; (the empty --run-dir a refused quickstart leaves is the
    run directory's business, tested with it)."""
    from lmprefs.cli.dispatch import main

    assert main(["quickstart", "--preset", "tiny", "--eval-queries", "100000", "--run-dir", str(tmp_path / "q")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lmprefs quickstart: error: --eval-queries 100000: task.query_dataset='bundled' sets aside only "
                   "139 held-out queries"]  # fmt: skip


def test_quickstart_without_eval_queries_takes_all_the_held_out_queries_of_a_small_task(tmp_path, capsys):
    """The default is up to 256: a task that sets aside fewer (the tiny preset's 139, the summarize demo's 149) is
    evaluated on all of them, where a default of 256 was refused before anything ran."""
    from lmprefs.cli.dispatch import main

    assert main(["quickstart", "--preset", "tiny", "--plan", "--run-dir", str(tmp_path / "q")]) == 0
    assert ", 139 held-out queries x 2 samples," in capsys.readouterr().out
    assert main(["quickstart", "--preset", "tiny", "--plan", "--eval-queries", "139"]) == 0
    assert main(["quickstart", "--preset", "tiny", "--plan", "--eval-queries", "140"]) == 2
    assert not (tmp_path / "q").exists()


def test_a_lora_rank_past_the_layers_width_is_one_line_not_an_allocation():
    from lmprefs.config import LoraConfig
    from lmprefs.errors import UserError
    from lmprefs.models.loading import load_lm
    from lmprefs.models.lora import add_adapter

    model, _ = load_lm("tiny-gpt2-austen")
    with pytest.raises(UserError, match=r"lora.rank=1000000000 exceeds the width of the layers it adapts \(\d+\)"):
        add_adapter(model, LoraConfig(rank=10**9), "policy")


def test_a_lora_rank_past_the_layers_width_is_refused_before_the_run_directory_is_made(tmp_path, monkeypatch, capsys):
    """Refused where the model loads, not where the adapter is added: by then the run directory held its config."""
    from lmprefs.cli.dispatch import main

    monkeypatch.chdir(tmp_path)
    pairs = "".join(json.dumps({"prompt": f"q{i}", "chosen": "a good one", "rejected": "a bad one"}) + "\n"
                    for i in range(8))  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text(pairs)
    assert main(["import-labels", "pairs.jsonl", "--db", "pairs.sqlite"]) == 0
    capsys.readouterr()
    argv = ["train-reward", "tiny", "--db", "pairs.sqlite", "--labels.type", "best_of_2", "--lora.rank", "64"]
    assert main([*argv, "--run-dir", "out"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "lmprefs train-reward: error: lora.rank=64 exceeds the width of the layers it adapts (32); a rank " \
                  "is a few to a few dozen"  # fmt: skip
    assert not (tmp_path / "out").exists()
