"""lmprefs train-sft: a tiny run lowers the response loss, the output is a plain Hugging Face directory that
AutoModelForCausalLM loads, train-policy starts from it with it as the reference, and bad data is one line."""

import json
from dataclasses import replace as R

import pytest
import torch
from crash import crash_at

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.data.sft_data import SFTExample, encode_examples, read_sft_data
from lmprefs.io.jsonl import read_jsonl
from lmprefs.training.sft import mean_response_loss

PROMPTS = ["The old house at the end of the lane", "She walked home from the market", "It was a bright cold day",
           "The letter arrived on Tuesday", "Nobody knew where the road went", "The garden was full of roses",
           "He opened the window", "They met at the station"]  # fmt: skip
ARGS = ["--sft.epochs", "8", "--sft.lr", "3e-2", "--sft.batch-size", "4", "--run.save-interval", "5"]


def write_pairs(path, key="response"):
    path.write_text("".join(json.dumps({"prompt": p + ".", key: " And then it rained all night.\n"}) + "\n"
                            for p in PROMPTS))  # fmt: skip
    return path


def saved_loss(model_dir, data):
    from lmprefs.models.loading import load_lm, vocab_size

    model, tok = load_lm(str(model_dir))
    tokens, mask = encode_examples(read_sft_data(str(data)), tok, 64)
    return mean_response_loss(model, tokens, mask, vocab_size(tok), torch.device("cpu"), torch.float32, 4)


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("sft")
    assert main(["train-sft", "tiny", "--sft.data", str(write_pairs(d / "pairs.jsonl")), "--run-dir", str(d / "run"),
                 *ARGS]) == 0  # fmt: skip
    return d


def test_tiny_sft_lowers_the_response_loss_and_saves_a_loadable_hf_model(sft_run):
    from transformers import AutoModelForCausalLM

    out = sft_run / "run" / "sft_model"
    meta = json.loads((out / "lmprefs.json").read_text())
    assert meta["sft/final_loss"] < 0.5 * meta["sft/initial_loss"], meta
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))
    hf = AutoModelForCausalLM.from_pretrained(out)
    assert type(hf).__name__ == "GPT2LMHeadModel" and hf.config.activation_function == "gelu_new"  # as the source
    # the saved weights are the trained ones: their response loss is the one measured at the end of training
    assert abs(saved_loss(out, sft_run / "pairs.jsonl") - meta["sft/final_loss"]) < 1e-4
    initial = saved_loss(preset("tiny").task.initial_model, sft_run / "pairs.jsonl")
    assert abs(initial - meta["sft/initial_loss"]) < 1e-4
    rows = read_jsonl(sft_run / "run" / "metrics.jsonl")
    assert any("sft/loss" in r for r in rows) and (sft_run / "run" / "config.json").is_file()
    assert list((sft_run / "run" / "logs" / "sft").glob("events.out.tfevents.*"))


def test_loss_is_on_response_tokens_only(tiny_lm):
    _, tok = tiny_lm
    pairs = [SFTExample("a", "A long prompt that is cut here", " yes"), SFTExample("b", "", " no")]
    tokens, mask = encode_examples(pairs, tok, 6)
    r = len(tok(" yes").input_ids)
    assert mask[0].sum() == r and mask[0, : 6 - r].sum() == 0  # the prompt lost its start, not the response
    prompt = tok("A long prompt that is cut here").input_ids
    assert tokens[0, : 6 - r].tolist() == prompt[-(6 - r) :]
    assert mask[1, 0].item() is False and tokens[1, 0] == tok.eos_token_id  # an empty prompt: EOS before it


def test_lora_sft_saves_the_merged_model_and_trl_completions_are_read(tmp_path):
    from transformers import AutoModelForCausalLM

    data = write_pairs(tmp_path / "trl.jsonl", key="completion")
    assert main(["train-sft", "tiny", "--sft.data", str(data), "--run-dir", str(tmp_path / "run"), *ARGS,
                 "--lora.rank", "4", "--task.initial-model", "tiny-gpt2"]) == 0  # fmt: skip
    out = tmp_path / "run" / "sft_model"
    meta = json.loads((out / "lmprefs.json").read_text())
    # a rank-4 adapter on attention moves a random 32-dim model's loss less than full fine-tuning does
    assert meta["sft/final_loss"] < meta["sft/initial_loss"] - 0.2, meta
    assert abs(saved_loss(out, data) - meta["sft/final_loss"]) < 1e-4  # the merge is the trained adapter
    hf = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(_tiny_dir())
    keys = set(hf.state_dict())
    assert keys == set(base.state_dict())  # no adapter tensors: merged into the weights
    changed = [k for k in keys if not torch.equal(hf.state_dict()[k], base.state_dict()[k])]
    assert changed and all("attn" in k or "mlp.c_proj" in k for k in changed)  # only LoRA targets moved


def _tiny_dir():
    from lmprefs.assets.models import tiny_gpt2_dir

    return tiny_gpt2_dir()


def test_train_policy_starts_from_the_sft_model_as_its_reference(sft_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from lmprefs.data.queries import QueryStream
    from lmprefs.pipeline.policy import policy_for
    from lmprefs.pipeline.task import setup_task
    from lmprefs.training.policy_run import build_run

    sft = str(sft_run / "run" / "sft_model")
    cfg = preset("tiny")
    cfg = R(cfg, task=R(cfg.task, initial_model=sft))
    t = setup_task(cfg, n_heldout=8)
    run = build_run(cfg, policy_for(t), QueryStream(t.train_queries, 1), t.device)
    saved = AutoModelForCausalLM.from_pretrained(sft).state_dict()
    ref = run.ref_lm.state_dict()
    assert all(torch.equal(ref[k], saved[k]) for k in saved)
    # end to end: the first rollout's KL from the reference is 0, since policy and reference are the SFT model
    rc = main(["train-policy", "tiny", "--reward", "vader", "--task.initial-model", sft, "--run-dir", str(tmp_path)])
    assert rc == 0 and (tmp_path / "policy" / "model.safetensors").is_file()
    first = read_jsonl(tmp_path / "metrics.jsonl")[0]
    assert abs(first["objective/kl"]) < 1e-5


def chat_model(tmp_path, template):
    """(model directory, its tokenizer): the tiny GPT-2 with a chat template of its own."""
    import shutil

    from transformers import AutoTokenizer

    model = tmp_path / "chat-model"
    shutil.copytree(_tiny_dir(), model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = template
    tok.save_pretrained(model)
    return model, tok


def write_chats(path):
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p + "."},
                                                     {"role": "assistant", "content": " And then it rained."}]}) + "\n"
                            for p in PROMPTS))  # fmt: skip
    return path


def test_sft_on_messages_rows_lowers_the_assistant_loss_through_the_models_chat_template(tmp_path):
    model, tok = chat_model(tmp_path, "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}\n{% endfor %}"
                                      "{% if add_generation_prompt %}a:{% endif %}")  # fmt: skip
    data = write_chats(tmp_path / "chat.jsonl")
    assert main(["train-sft", "tiny", "--sft.data", str(data), "--run-dir", str(tmp_path / "run"), *ARGS,
                 "--task.initial-model", str(model)]) == 0  # fmt: skip
    meta = json.loads((tmp_path / "run" / "sft_model" / "lmprefs.json").read_text())
    assert meta["chat_template"] is True and meta["sft/final_loss"] < 0.5 * meta["sft/initial_loss"], meta
    # the loss is on the assistant turns' text and the newline that closes them, not on "u:PROMPT.\n" or "a:"
    assert meta["sft/response_tokens"] == len(tok(" And then it rained.\n").input_ids) * len(PROMPTS)


def test_a_template_that_cannot_be_rendered_in_pieces_is_refused_before_the_run_directory(tmp_path, capsys):
    # the last turn rendered unlike earlier ones: the prefixes are not beginnings of the whole
    model, _ = chat_model(tmp_path, "{% for m in messages %}{% if loop.last %}[{{ m.content }}]{% else %}"
                                    "{{ m.content }}{% endif %}{% endfor %}")  # fmt: skip
    run = tmp_path / "run"
    rc = main(["train-sft", "tiny", "--sft.data", str(write_chats(tmp_path / "chat.jsonl")), "--run-dir", str(run),
               "--task.initial-model", str(model)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "chat.jsonl line 1: the chat template renders" in err, err
    assert "task.chat_template=false" in err and not run.exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"prompt": "a", "response": "b"}\n{"prompt": "a"}\n', "pairs.jsonl line 2: missing field 'response'"),
        ('{"prompt": "a", "response": "b"}\n{"prompt": "a", "resp\n', "pairs.jsonl line 2: invalid JSON"),
        ('{"prompt": "a", "completion": [{"role": "assistant"}]}\n', "pairs.jsonl line 1: field 'completion' is list"),
        ("\n", "pairs.jsonl: no prompt/response pairs"),
        ('{"messages": [{"role": "user", "content": "a"}]}\n', "pairs.jsonl line 1: no assistant turn in 'messages'"),
        ('{"messages": [{"role": "bot", "content": "a"}]}\n', "pairs.jsonl line 1: messages[0] has role 'bot'"),
        ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]}\n',
         "pairs.jsonl line 1: messages[1] (assistant) has no 'content'"),
    ],
)
def test_bad_sft_data_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, text, message):
    (tmp_path / "pairs.jsonl").write_text(text)
    rc = main(["train-sft", "tiny", "--sft.data", str(tmp_path / "pairs.jsonl"), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "run").exists()
    assert main(["train-sft", "tiny", "--run-dir", str(tmp_path / "run")]) == 2
    assert "--sft.data" in capsys.readouterr().err


def test_a_killed_sft_run_resumes_to_the_same_model(sft_run, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    from lmprefs.training import sft

    saves, real = [], sft._save_checkpoint

    def save_then_die(*a, **k):  # interrupted right after the second checkpoint (step 10 of 16)
        real(*a, **k)
        saves.append(a[2])
        if len(saves) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(sft, "_save_checkpoint", save_then_die)
    run = tmp_path / "run"
    args = ["train-sft", "tiny", "--sft.data", str(sft_run / "pairs.jsonl"), "--run-dir", str(run), *ARGS]
    assert main(args) == 130 and saves == [5, 10] and not (run / "sft_model").exists()
    assert main(args) == 2  # a second start without --resume would train from scratch over the checkpoint
    monkeypatch.setattr(sft, "_save_checkpoint", real)
    assert main(["train-sft", "tiny", "--run-dir", str(run), "--resume"]) == 0
    a = load_file(run / "sft_model" / "model.safetensors")
    b = load_file(sft_run / "run" / "sft_model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bitwise the uninterrupted run's
    # resumed once more, finished: nothing to train and not an error, as train-policy (docs/checkpoints.md)
    rows = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train-sft", "tiny", "--run-dir", str(run), "--resume"]) == 0
    assert "finished already: nothing to train" in capsys.readouterr().out
    assert (run / "metrics.jsonl").read_text() == rows
    losses = [(r["step"], r["sft/loss"]) for r in read_jsonl(run / "metrics.jsonl") if "sft/loss" in r]
    full = [(r["step"], r["sft/loss"]) for r in read_jsonl(sft_run / "run" / "metrics.jsonl") if "sft/loss" in r]
    assert losses == full


def test_a_sft_run_killed_after_logging_past_its_checkpoint_logs_each_step_once(sft_run, tmp_path, monkeypatch):
    from lmprefs.io import atomic

    # steps 0..11 logged; the last checkpoint holds 10 steps
    monkeypatch.setattr(atomic, "crash_hook", crash_at("sft:logged", 12, KeyboardInterrupt))
    run = tmp_path / "run"
    args = ["train-sft", "tiny", "--sft.data", str(sft_run / "pairs.jsonl"), "--run-dir", str(run), *ARGS]
    assert main(args + ["--run.log-interval", "1"]) == 130
    monkeypatch.setattr(atomic, "crash_hook", None)
    assert main(["train-sft", "tiny", "--run-dir", str(run), "--resume"]) == 0
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "sft/loss" in r]
    assert steps == list(range(16))  # steps 10 and 11 logged again by the resumed run, each once


@pytest.mark.parametrize("again", ["--resume", "the same command"])
def test_a_sft_run_killed_before_its_first_checkpoint_starts_over_and_logs_each_step_once(
    sft_run, tmp_path, monkeypatch, again
):
    from safetensors.torch import load_file

    from lmprefs.io import atomic

    # steps 0..2 logged; the first checkpoint (step 5) not written yet
    monkeypatch.setattr(atomic, "crash_hook", crash_at("sft:logged", 3, KeyboardInterrupt))
    run = tmp_path / "run"
    args = ["train-sft", "tiny", "--sft.data", str(sft_run / "pairs.jsonl"), "--run-dir", str(run), *ARGS]
    assert main(args) == 130 and not (run / "checkpoint").exists()
    monkeypatch.setattr(atomic, "crash_hook", None)
    # docs/tasks.md: after a kill, --resume continues; without a checkpoint it starts over in place, as train-policy
    # and train-dpo do; the command it was started with does too
    assert main(["train-sft", "tiny", "--run-dir", str(run), "--resume"] if again == "--resume" else args) == 0
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "sft/loss" in r]
    assert steps == list(range(16))  # steps 0..2 logged again by the run started over, each once
    a = load_file(run / "sft_model" / "model.safetensors")
    b = load_file(sft_run / "run" / "sft_model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("command", ["train-sft", "train-dpo"])
def test_resume_of_a_run_killed_before_its_config_was_written_says_to_start_without_resume(tmp_path, capsys, command):
    run = tmp_path / "run"
    run.mkdir()  # what a kill before config.json leaves: the directory, perhaps its lock
    assert main([command, "tiny", "--resume", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds no run (no config.json); start without --resume" in err, err
