"""Every command, a table of bad inputs: exit code 2, exactly one line on stderr naming the value, no traceback, and
nothing written. Runs in-process through `lmprefs.cli.main`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from refusals import assert_refused

from lmprefs.cli.dispatch import main


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with the files the rows point at: a text file posing as a store, a directory, a pairs file, a
    reward-model folder with a foreign tokenizer, and one with lmprefs' task metadata."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("bad-input")
    (d / "notdb.sqlite").write_text("hello, not a database\n")
    (d / "afile").write_text("x\n")
    (d / "adir").mkdir()
    (d / "texts.txt").write_text("a happy ending\n")
    (d / "pairs.jsonl").write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n")
    (d / "scores.jsonl").write_text(json.dumps({"prompt": "q", "response": "a", "score": 1.0}) + "\n")
    foreign = d / "foreign_rm"
    foreign.mkdir()
    wl = Tokenizer(WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=wl, unk_token="[UNK]").save_pretrained(foreign)
    (foreign / "reward_head.safetensors").write_bytes(b"")
    rm = d / "rm"
    rm.mkdir()
    (rm / "reward_head.safetensors").write_bytes(b"")
    task = {"query_prefix": "", "query_suffix": "", "query_length": 8, "response_length": 8}
    (rm / "lmprefs.json").write_text(json.dumps({"kind": "reward_model", "task": task}))
    for name in ("latin1.txt", "latin1.jsonl", "latin1.json"):  # Latin-1, not UTF-8: 0xe9 is 'é'
        (d / name).write_bytes(b'{"text": "caf\xe9"}\n' if name.endswith(".jsonl") else b"caf\xe9 au lait\n")
    for name in ("dir.jsonl", "dir.txt", "dir.json"):
        (d / name).mkdir()
    # a run directory as train-policy leaves it: its config.json, and policy/ with a model's own config.json
    from lmprefs.config import preset
    from lmprefs.io.config_file import save_config

    (d / "run" / "policy").mkdir(parents=True)
    save_config(preset("tiny"), d / "run" / "config.json")
    (d / "run" / "policy" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    (d / "run" / "policy" / "lmprefs.json").write_text(json.dumps({"kind": "policy", "temperature": 0.7}))
    (d / "rmrun" / "reward_model").mkdir(parents=True)  # a train-reward run, as far as its directory shows
    return d


CUDA = torch.cuda.is_available()
ROWS = [
    # (argv, text the one line must contain)
    (["sample", "--preset", "tiny", "--ppo.lr", "-1"], "ppo.lr=-1.0 must be positive"),
    (["train-policy", "tiny", "--ppo.noptepochs", "0"], "ppo.noptepochs=0"),
    (["train-reward", "tiny", "--run.threads", "-1"], "run.threads=-1"),
    (["train-reward", "tiny", "--train-reward.ensemble", "0", "--db", "pairs.jsonl", "--run-dir", "out"],
     "train_reward.ensemble=0 must be >= 1"),
    (["train-reward", "tiny", "--train-reward.ensemble", "-2", "--db", "pairs.jsonl", "--run-dir", "out"],
     "train_reward.ensemble=-2 must be >= 1"),
    (["train-policy", "tiny", "--train-reward.ensemble", "0", "--db", "pairs.jsonl", "--run-dir", "out"],
     "train_reward.ensemble=0 must be >= 1"),
    (["quickstart", "--preset", "tiny", "--train-reward.ensemble", "0", "--run-dir", "out"],
     "train_reward.ensemble=0 must be >= 1"),
    (["sample", "--preset", "tiny", "--lora.rank", "-2"], "lora.rank=-2"),
    (["train-policy", "tiny", "--lora.layers", "-1"], "lora.layers=-1"),
    (["train-policy", "tiny", "--run.parallel", "zero"], "--run.parallel 'zero': choose one of ddp, fsdp"),
    (["train-policy", "tiny", "--run.parallel", "fsdp", "--lora.rank", "4"], "does not combine with LoRA"),
    (["train-policy", "tiny", "--run.parallel", "fsdp", "--run.compile", "on"], "not combine with run.compile=on"),
    (["train-policy", "tiny", "--ppo.cliprange", "-0.5"], "ppo.cliprange=-0.5"),
    (["train-policy", "tiny", "--ppo.estimator", "reinforce"], "reinforce"),
    (["train-policy", "tiny", "--ppo.estimator", "rloo", "--ppo.rloo-k", "1"], "ppo.rloo_k=1 must be at least 2"),
    (["train-policy", "tiny", "--ppo.estimator", "rloo", "--ppo.rloo-k", "3"], "ppo.rloo_k=3 must divide"),
    (["train-policy", "tiny", "--ppo.estimator", "rloo", "--ppo.value-model", "separate"], "trains no value model"),
    (["train-policy", "tiny", "--ppo.estimator", "grpo", "--ppo.rloo-k", "1"], "ppo.rloo_k=1 must be at least 2"),
    (["train-policy", "tiny", "--ppo.estimator", "dr_grpo", "--ppo.rloo-k", "3"], "ppo.rloo_k=3 must divide"),
    (["train-policy", "tiny", "--ppo.kl-in", "loss"], "ppo.kl_in='loss' applies to ppo.estimator grpo or dr_grpo"),
    (["train-policy", "tiny", "--ppo.estimator", "rloo", "--ppo.kl-in", "reward"], "rloo takes its KL in the reward"),
    (["train-policy", "tiny", "--ppo.estimator", "grpo", "--ppo.kl-in", "both"],
     "--ppo.kl-in 'both': choose one of reward, loss"),
    (["train-policy", "tiny", "--ppo.lr", "nan"], "ppo.lr=nan"),
    (["train-policy", "tiny", "--task.chat-template", "true"], "task.chat_template=true: 'tiny-gpt2-austen' has no"),
    (["label", "tiny", "--labels.type", "best_of_one"], "unknown label type 'best_of_one'"),
    (["label", "tiny", "--labels.labeler", "nope"], "labels.labeler='nope'"),
    (["label", "tiny", "--labeler", "nope"], "'nope'"),
    (["label", "tiny", "--n", "0"], "--n 0"),
    (["label", "tiny", "--labels.pool-factor", "0.5"], "labels.pool_factor=0.5 must be >= 1"),
    (["label", "tiny", "--labels.select", "maxent"], "'maxent'"),
    (["label", "tiny", "--labels.select", "bald"], "train_reward.ensemble=1 has none"),
    (["train-policy", "tiny", "--online", "--labels.select", "spread"], "train_reward.ensemble=1 has none"),
    (["label", "tiny", "--labels.select-diversity", "2"], "labels.select_diversity=2.0 must be in [0, 1]"),
    (["label", "tiny", "--labels.select", "bald", "--train-reward.ensemble", "2", "--labeler", "none", "--db",
      "new.sqlite"], "--db new.sqlite: holds 0 best_of_4 labels, fewer than labels.select_round=64"),
    (["label", "tiny", "--labels.select", "spread", "--train-reward.ensemble", "2", "--labels.type", "ranking_3"],
     "labels.select=spread chooses among best_of_N questions, not labels.type=ranking_3"),
    (["label", "tiny", "--db", "notdb.sqlite"], "not an SQLite file"),
    (["label", "tiny", "--db", "adir"], "is a directory"),
    (["quickstart", "--preset", "tiny", "--labels.select", "bald", "--train-reward.ensemble", "2"],
     "labels.select=bald: quickstart asks random questions"),
    (["experiment", "mock-sentiment", "--preset", "tiny", "--labels.select", "spread", "--train-reward.ensemble",
      "3"], "labels.select=spread: experiment mock-sentiment asks random questions"),
    (["rank-queue", "--run-dir", "run", "--db", "missing.sqlite"], "--run-dir run: holds no reward model, not an"),
    (["rank-queue", "--run-dir", "adir", "--db", "missing.sqlite"], "--run-dir adir: holds no run (no config.json)"),
    (["rank-queue", "--run-dir", "run", "--select", "maxent"], "invalid choice: 'maxent'"),
    (["sample", "--preset", "tiny", "--run.device", "gpu"], "run.device='gpu'"),
    (["sample", "--preset", "tiny", "--n", "x"], "invalid int value: 'x'"),
    (["sample", "--preset", "tiny", "--n", "100000"],
     "--n 100000: the heldout split of task.query_dataset='bundled' has only 139 queries"),
    (["sample", "--preset", "tiny", "--n", "100000", "--best-of", "2", "--reward", "vader", "--split", "train"],
     "--n 100000: the train split of task.query_dataset='bundled' has only"),
    (["sample", "--preset", "tiny", "--task.truncate-after", "-1"], "task.truncate_after=-1"),
    (["train-reward", "tiny", "--run-dir", "afile"], "afile: is a file"),
    (["train-policy", "tiny", "--run-dir", "afile"], "afile: is a file"),
    (["train-policy", "tiny", "--run-dir", "afile/sub"], "is a file"),
    (["train-reward", "tiny", "--run-dir", "afile/sub/deeper"], "--run-dir afile/sub/deeper: afile is a file, not a"),
    (["quickstart", "--preset", "tiny", "--run-dir", "afile/a/b"], "--run-dir afile/a/b: afile is a file, not a"),
    (["evaluate", "run", "--reward", "vader", "--out", "afile/a/b"], "--out afile/a/b: afile is a file, not a"),
    (["quickstart", "--preset", "tiny", "--run-dir", "afile"], "afile: is a file"),
    (["train-reward", "tiny", "--db", "notdb.sqlite", "--run-dir", "out"], "not an SQLite file"),
    (["train-reward", "tiny", "--db", "missing.sqlite", "--run-dir", "out"], "does not exist"),
    (["train-reward", "tiny", "--db", "pairs.jsonl", "--labels.type", "best_of_2", "--run-dir", "rmrun"],
     "rmrun already holds a reward model (rmrun/reward_model); choose another --run-dir"),
    (["train-reward", "tiny", "--db", "pairs.jsonl", "--labels.type", "best_of_2", "--run-dir", "run"],
     "run already holds a run (policy); choose another --run-dir"),
    (["train-reward", "tiny", "--config", "missing.json"], "missing.json does not exist"),
    (["train-policy", "tiny", "--rewards.trained-model", "adir", "--run-dir", "out"], "not a reward-model"),
    (["train-policy", "tiny", "--rewards.trained-model", "foreign_rm", "--run-dir", "out"], "differs from the"),
    (["train-policy", "tiny", "--reward", "nope", "--run-dir", "out"], "--reward 'nope'"),
    (["train-policy", "tiny", "--reward", "no_such_module_x:f", "--run-dir", "out"], "cannot import"),
    (["train-policy", "tiny", "--reward", "os:no_such_fn", "--run-dir", "out"], "has no 'no_such_fn'"),
    (["train-policy", "tiny", "--report-to", "x"], "unrecognized arguments"),
    (["train-policy", "tiny", "--reward", "vader", "--db", "pairs.jsonl", "--run-dir", "out"],
     "--db pairs.jsonl: a label store trains a reward model, and this run trains none (--reward vader gives"),
    (["train-policy", "tiny", "--rewards.trained-model", "rm", "--db", "pairs.jsonl", "--run-dir", "out"],
     "this run trains none (rewards.trained_model=rm gives the reward)"),
    (["train-policy", "tiny", "--labeler", "vader", "--reward", "vader", "--run-dir", "out"],
     "--labeler vader: answers the questions of --online; add --online, or drop --labeler"),
    (["import-labels", "pairs.jsonl", "--format", "nope"], "'nope'"),
    (["import-labels", "pairs.jsonl", "--db", "notdb.sqlite"], "not an SQLite file"),
    (["import-labels", "pairs.jsonl", "--db", "adir"], "is a directory"),
    (["import-labels", "pairs.jsonl", "--db", "nofolder/labels.sqlite"], "nofolder does not exist"),
    (["import-labels", "pairs.jsonl", "--format", "openai", "--db", "new.sqlite"], "pairs.jsonl"),
    (["import-labels", "missing.jsonl"], "missing.jsonl does not exist"),
    (["export-labels", "adir", "--db", "notdb.sqlite"], "is a directory"),
    (["export-labels", "nofolder/out.jsonl", "--db", "notdb.sqlite"], "nofolder does not exist"),
    (["export-labels", "out.jsonl", "--db", "notdb.sqlite"], "not an SQLite file"),
    (["export-labels", "out.jsonl", "--db", "missing.sqlite"], "does not exist"),
    (["export-labels", "out.txt", "--db", "notdb.sqlite"], "cannot tell the format"),
    (["export-labels", "out.jsonl", "--format", "nope"], "'nope'"),
    (["serve", "--db", "notdb.sqlite"], "not an SQLite file"),
    (["serve", "--db", "missing.sqlite"], "does not exist"),
    (["serve", "--db", "adir"], "is a directory"),
    (["serve", "--port", "70000"], "--port 70000"),
    (["serve", "--lease-minutes", "nan"], "--lease-minutes nan: must be a positive number of minutes"),
    (["serve", "--lease-minutes", "inf"], "--lease-minutes inf: must be a positive number of minutes"),
    (["serve", "--trusted-proxy", "proxy.example"], "--trusted-proxy 'proxy.example' is not an IP address"),
    (["serve", "--trusted-proxy", "*"], "--trusted-proxy '*' is not an IP address"),
    (["labelers", "add", "bob", "--db", "adir"], "is a directory"),
    (["labelers", "add", "bob", "--db", "notdb.sqlite"], "not an SQLite file"),
    (["labelers", "add", "bob", "--db", "nofolder/x.sqlite"], "nofolder does not exist"),
    (["labelers", "list", "--db", "missing.sqlite"], "does not exist"),
    (["labelers", "frobnicate"], "invalid choice"),
    (["labelers", "add", "", "--db", "new.sqlite"], "labeler name '' must be 1-100 characters"),
    (["labelers", "add", " bob", "--db", "new.sqlite"], "labeler name ' bob' must be 1-100 characters"),
    (["score", "--reward-model", "adir", "texts.txt"], "not a reward-model directory"),
    (["score", "--reward-model", "rm", "missing.txt"], "missing.txt does not exist"),
    (["score"], "--reward-model"),
    (["score", "--reward-model", "rm", "--device", "tpu", "texts.txt"],
     "--device 'tpu': choose auto, cpu, cuda, cuda:N or mps"),
    (["presets", "nope"], "unknown preset 'nope'"),
    (["presets", "tiny", "--ppo.lr", "-1"], "ppo.lr=-1.0"),
    (["experiment", "mock-sentiment", "--labels", "x", "--run-dir", "exp"], "--labels 'x'"),
    (["experiment", "mock-sentiment", "--run-dir", "afile"], "afile: is a file"),
    (["experiment", "nope"], "invalid choice"),
    (["experiment", "kl-frontier", "tiny", "--min-ess", "nan", "--run-dir", "exp"], "--min-ess nan: must be a number"),
    (["experiment", "compare", "tiny", "--min-ess", "inf", "--run-dir", "exp"], "--min-ess inf: must be a number"),
    (["assets", "prepare", "nope"], "unknown asset 'nope'"),
    (["assets", "frobnicate"], "invalid choice"),
    (["quickstart", "--preset", "tiny", "--eval-queries", "1", "--run-dir", "qs"], "--eval-queries"),
    (["quickstart", "--preset", "tiny", "--run-dir", "run"], "run already holds a run (config.json)"),
    # files that are not UTF-8
    (["config", "tiny", "--config", "latin1.json"], "latin1.json: not UTF-8 text (byte 0xe9"),
    (["score", "--reward-model", "rm", "latin1.txt"], "latin1.txt: not UTF-8 text (byte 0xe9"),
    (["sample", "--preset", "tiny", "--task.query-dataset", "latin1.jsonl"], "latin1.jsonl: not UTF-8 text"),
    (["sample", "--preset", "tiny", "--task.query-dataset", "latin1.txt"], "latin1.txt: not UTF-8 text"),
    (["train-reward", "tiny", "--task.query-dataset", "latin1.txt", "--db", "pairs.jsonl", "--run-dir", "out"],
     "latin1.txt: not UTF-8 text"),
    (["train-sft", "tiny", "--sft.data", "latin1.jsonl", "--run-dir", "out"], "latin1.jsonl: not UTF-8 text"),
    # a directory where a file is expected, and a file where a directory is
    (["config", "tiny", "--config", "adir"], "adir: is a directory, expected a file"),
    (["train-reward", "tiny", "--config", "adir"], "adir: is a directory, expected a file"),
    (["score", "--reward-model", "rm", "adir"], "adir: is a directory, expected a file"),
    (["sample", "--preset", "tiny", "--task.query-dataset", "dir.jsonl"], "dir.jsonl: is a directory, expected a"),
    (["sample", "--preset", "tiny", "--task.query-dataset", "dir.txt"], "dir.txt: is a directory, expected a"),
    (["sample", "--preset", "tiny", "--task.query-dataset", "dir.json"], "dir.json: is a directory, expected a"),
    (["train-sft", "tiny", "--sft.data", "adir", "--run-dir", "out"], "adir: is a directory, expected a file"),
    (["experiment", "writing-prompts", "--data", "adir", "--run-dir", "exp"], "adir: is a directory, expected a"),
    (["train-reward", "tiny", "--db", "dir.jsonl", "--run-dir", "out"], "dir.jsonl: is a directory, expected a"),
    (["train-policy", "tiny", "--rewards.trained-model", "afile", "--run-dir", "out"], "afile: is a file, expected"),
    (["score", "--reward-model", "afile", "texts.txt"], "afile: is a file, expected a reward-model directory"),
    # a model directory inside a run where the run is expected
    (["sample", "run/policy"], "pass the run directory (run), not its policy/"),
    (["sample", "afile"], "afile: is a file, expected a train-policy run directory"),
    (["sample", "run", "--preset", "nope"], "--preset nope: run is a run directory with its own config"),
    (["train-policy", "tiny", "--resume", "--run-dir", "run/policy"], "pass the run directory (run), not its policy/"),
    (["train-sft", "tiny", "--resume", "--run-dir", "run/policy"], "pass the run directory (run), not its policy/"),
    (["train-policy", "tiny", "--config", "run/policy/config.json"], "pass the run directory (run), not its policy/"),
    # train-dpo: its config, its store, its label type
    (["train-dpo", "tiny", "--dpo.beta", "0"], "--dpo.beta 0: dpo.beta=0.0 must be positive"),
    (["train-dpo", "tiny", "--dpo.beta", "-0.1", "--dpo.lr", "1e-3"], "dpo.beta=-0.1 must be positive (from the"),
    (["train-dpo", "tiny", "--dpo.loss", "ranked"], "--dpo.loss 'ranked': choose one of pairwise, listwise"),
    (["train-dpo", "tiny", "--db", "missing.sqlite", "--run-dir", "out"], "--db missing.sqlite: label store does"),
    (["train-dpo", "tiny", "--db", "notdb.sqlite", "--run-dir", "out"], "not an SQLite file"),
    (["train-dpo", "tiny", "--db", "scores.jsonl", "--run-dir", "out"],
     "--db scores.jsonl: the label store holds no best-of-N or pairwise labels (only scalar_rating labels)"),
    (["train-dpo", "tiny", "--db", "pairs.jsonl", "--run-dir", "out"], "holds best_of_2 labels, not labels.type="),
    (["train-dpo", "tiny", "--db", "pairs.jsonl", "--labels.type", "scalar_compare", "--run-dir", "out"],
     "labels.type=scalar_compare (labels.scores_as=rating): train-dpo learns from preferences"),
    (["train-dpo", "tiny", "--resume"], "--resume needs --run-dir"),
    # evaluate: the run or model, the reward, the queries
    (["evaluate", "missing_run", "--reward", "vader"], "RUN_OR_MODEL missing_run does not exist"),
    (["evaluate", "afile", "--reward", "vader"], "RUN_OR_MODEL afile: is a file, expected a run or model directory"),
    (["evaluate", "adir", "--reward", "vader"], "RUN_OR_MODEL adir: neither a run directory"),
    (["evaluate", "run"], "give one of --reward NAME"),
    (["evaluate", "run", "--reward", "vader", "--preset", "tiny"],
     "--preset tiny: run is a run directory with its own config (run/config.json); drop --preset"),
    (["evaluate", "run", "--reward", "vader", "--reward-model", "rm"], "not both (--reward vader, --reward-model rm)"),
    (["evaluate", "run", "--reward", "nope"], "--reward 'nope': choose descriptiveness"),
    (["evaluate", "run", "--reward", "no_such_module_x:f"], "--reward no_such_module_x:f: cannot import"),
    (["evaluate", "run", "--reward-model", "adir"], "--reward-model adir: not a reward-model directory"),
    (["evaluate", "run", "--reward-model", "missing_rm"], "--reward-model missing_rm does not exist"),
    (["evaluate", "run", "--reward", "vader", "--eval-queries", "1"], "--eval-queries 1: must be at least 2"),
    (["evaluate", "run", "--reward", "vader", "--eval-samples", "0"], "--eval-samples 0: must be at least 1"),
    (["evaluate", "run", "--reward", "vader", "--eval-queries", "100000"],
     "--eval-queries 100000: task.query_dataset='bundled' sets aside only"),
    (["evaluate", "run", "--reward", "vader", "--queries", "missing.txt"], "--queries missing.txt does not exist"),
    (["evaluate", "run", "--reward", "vader", "--queries", "texts.txt", "--eval-queries", "5"],
     "--eval-queries 5: --queries texts.txt gives only 1 queries"),
    (["evaluate", "run", "--reward", "vader", "--queries", "texts.txt"], "--queries texts.txt gives only 1 queries;"),
    (["evaluate", "run", "--reward", "vader", "--out", "afile"], "--out afile: is a file"),
    (["evaluate", "run", "--reward", "vader", "--reference", "./missing_model"],
     "--reference ./missing_model does not exist"),
    # sampling temperatures that are not a positive finite number
    (["sample", "--preset", "tiny", "--temperature", "nan"], "--temperature nan"),
    (["sample", "--preset", "tiny", "--temperature", "inf"], "--temperature inf"),
    (["sample", "--preset", "tiny", "--temperature", "-1"], "--temperature -1"),
    (["sample", "--preset", "tiny", "--best-of", "0", "--reward", "vader"], "--best-of 0: must be at least 1"),
    (["sample", "--preset", "tiny", "--best-of", "-3", "--reward", "vader"], "--best-of -3: must be at least 1"),
    (["sample", "--preset", "tiny", "--best-of", "4"], "--best-of 4: needs a reward"),
    (["sample", "--preset", "tiny", "--reward", "vader"], "--reward vader: ranks samples only with --best-of N"),
    (["sample", "--preset", "tiny", "--best-of", "2", "--reward", "nope"], "--reward 'nope'"),
    (["sample", "--preset", "tiny", "--best-of", "2", "--reward-model", "afile"], "--reward-model"),
    (["sample", "--preset", "tiny", "--best-of", "2", "--reward-model", "foreign_rm"], "differs from the policy's"),
] + ([] if CUDA else [
    (["train-policy", "tiny", "--run.device", "cuda", "--run-dir", "out"], "CUDA is not available"),
    (["train-reward", "tiny", "--run.device", "cuda:0", "--run-dir", "out"], "CUDA is not available"),
    (["label", "tiny", "--run.device", "cuda", "--db", "new.sqlite"], "CUDA is not available"),
    (["sample", "--preset", "tiny", "--run.device", "cuda"], "CUDA is not available"),
    (["score", "--reward-model", "rm", "--device", "cuda", "texts.txt"], "CUDA is not available"),
])  # fmt: skip


@pytest.mark.parametrize("argv,needle", ROWS, ids=[" ".join(r[0]) for r in ROWS])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(argv, needle, workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    assert_refused(argv, needle, workdir, capsys)


def test_score_names_stdin_that_is_not_utf8(workdir, capsys, monkeypatch):
    import io
    import types

    monkeypatch.chdir(workdir)
    monkeypatch.setattr("sys.stdin", types.SimpleNamespace(buffer=io.BytesIO(b"ok\ncaf\xe9\n")))
    assert main(["score", "--reward-model", "rm"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("lmprefs score: error: stdin: not UTF-8 text (byte 0xe9 at offset 6, line 2); save it as "
                           "UTF-8")


def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_keeps_the_previous_one(tmp_path, capsys, monkeypatch):
    import errno

    import safetensors.torch

    from lmprefs.io.publish import verify

    real, versions = safetensors.torch.save_file, set()

    def save_file(tensors, filename, *a, **k):  # the second checkpoint meets a full disk
        tmp = next((p for p in Path(filename).parents if p.name.startswith("checkpoint.tmp-")), None)
        versions.add(tmp)
        if tmp is not None and len(versions - {None}) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(tensors, filename, *a, **k)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    run = tmp_path / "run"
    code = main(["train-policy", "tiny", "--reward", "vader", "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if "error" in line] == [
        f"lmprefs train-policy: error: cannot write {run / 'checkpoint'}: No space left on device; the previous "
        "checkpoint is kept"]  # fmt: skip
    assert os.readlink(run / "checkpoint") == "checkpoint.000001" and verify(run / "checkpoint")["update"] == 1
    assert not list(run.glob("*.tmp-*")) and not (run / "policy").exists()


def _refused(code: int) -> OSError:
    import errno

    return OSError(getattr(errno, code), os.strerror(getattr(errno, code)))


def _chained() -> RuntimeError:
    """As torch.save to a file object reports a full disk: its RuntimeError raised while handling the OSError."""
    try:
        try:
            raise _refused("ENOSPC")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
    except RuntimeError as e:
        e.__suppress_context__ = False
        return e


@pytest.mark.parametrize("make, reason", [
    (lambda: _refused("ENOSPC"), "No space left on device"),
    (lambda: _refused("EDQUOT"), "Disk quota exceeded"),
    (lambda: _refused("EROFS"), "Read-only file system"),
    (lambda: _refused("EACCES"), "Permission denied"),
    (lambda: __import__("safetensors").SafetensorError("Error while serializing: I/O error: No space left on device "
                                                       "(os error 28)"), "No space left on device"),
    (_chained, "No space left on device"),
], ids=["ENOSPC", "EDQUOT", "EROFS", "EACCES", "safetensors", "torch.save"])  # fmt: skip
def test_a_refused_write_while_publishing_names_the_directory_and_keeps_the_previous_version(tmp_path, make, reason):
    from lmprefs.errors import UserError
    from lmprefs.io.publish import publish_dir, verify

    out = tmp_path / "model"
    with publish_dir(out) as d:
        (d / "w").write_text("old")
    with pytest.raises(UserError) as e, publish_dir(out) as d:
        (d / "w").write_text("new")
        raise make()
    assert str(e.value) == f"cannot write {out}: {reason}; the previous model is kept"
    assert (out / "w").read_text() == "old" and verify(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.000001"]
    with pytest.raises(ValueError), publish_dir(out):  # any other error is a bug: it stays as it is
        raise ValueError("a bug")


def test_a_refused_text_write_names_the_file_and_keeps_it(tmp_path, monkeypatch):
    import errno

    from lmprefs.errors import UserError
    from lmprefs.io.atomic import atomic_write_text

    path = tmp_path / "run.json"
    atomic_write_text(path, "old")

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(UserError, match=f"cannot write {path}: No space left on device; the file is as it was"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]
