"""Saved policies and reward models carry a model card (README.md, Hugging Face's front matter) that names their
base and results and whose loading snippets work; adapters name their base portably, never by a local path."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from lmprefs.config import LoraConfig
from lmprefs.models.artifacts import load_policy, load_reward_model, save_policy, save_reward_model
from lmprefs.models.loading import load_lm
from lmprefs.models.lora import add_adapter, lora_modules, using
from lmprefs.models.model_card import HERE, CardInfo, card_text
from lmprefs.models.policy import Policy
from lmprefs.models.reward_model import RewardModel
from lmprefs.runtime.resolve import resolve_config


def front_matter(text: str) -> dict:
    assert text.startswith("---\n"), text[:80]
    return yaml.safe_load(text.split("---\n")[1])


def randomized(lm, name: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(lm):
            m.B[name].normal_(0, 0.5, generator=g)


@pytest.fixture()
def saved(tmp_path):
    """A LoRA policy (adapter + merged model) and a LoRA reward model (adapter only) saved with cards."""
    lm, tok = load_lm("tiny-gpt2")
    add_adapter(lm, LoraConfig(rank=2, alpha=4.0), "policy", seed=1)
    add_adapter(lm, LoraConfig(rank=2, alpha=4.0), "reward", seed=2)
    randomized(lm, "policy", 3)
    randomized(lm, "reward", 4)
    cfg = resolve_config("tiny", [("lora.rank", "2")])
    save_policy(Policy(lm, tok, 0.7, adapter="policy"), tmp_path / "policy",
                card=CardInfo("ppo", cfg, {"true reward, last batch": 0.125}))  # fmt: skip
    rm = RewardModel(lm, tok, adapter="reward", seed=0).eval()
    card = CardInfo("reward-model", cfg, {"held-out accuracy": 0.625}, {"for training": 48, "labelers": ["vader"]})
    save_reward_model(rm, tmp_path / "rm", merged=False, card=card)
    return lm, rm, tmp_path


def test_both_directories_carry_a_card_with_the_base_the_data_and_the_results(saved):
    _, _, d = saved
    pol, rm = (d / "policy" / "README.md").read_text(), (d / "rm" / "README.md").read_text()
    fp, fr = front_matter(pol), front_matter(rm)
    assert fp["library_name"] == "transformers" and fp["pipeline_tag"] == "text-generation"
    assert {"rlhf", "ppo", "lora"} <= set(fp["tags"]) and fp["license"] == "mit"
    assert fr["library_name"] == "peft" and {"reward-model", "rlhf"} <= set(fr["tags"])
    for text in (pol, rm):
        assert "`tiny-gpt2`" in text and "lmprefs assets prepare tiny-gpt2" in text  # the base
        assert "| `task.query_dataset` | `\"bundled\"` |" in text and "| `lora.rank` | `2` |" in text
        assert "## How to load" in text and str(d) not in text  # no path of this machine
    assert "| true reward, last batch | 0.1250 |" in pol and "| held-out accuracy | 0.6250 |" in rm
    assert "48 for training" in rm and "- labels: `best_of_4`" in rm and "- labelers: `vader`" in rm
    assert "- labels:" not in pol  # a policy's reward may be a function of the text: no labels
    for sub in ("policy", "rm"):  # written with the rest of the directory: in its manifest
        assert "README.md" in json.loads((d / sub / "manifest.json").read_text())["files"]


def test_an_asset_converted_from_the_hub_names_it_as_base_model(tmp_path):
    text = card_text(tmp_path, "smollm2-135m", CardInfo("dpo"))
    fm = front_matter(text)
    assert fm["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and fm["license"] == "apache-2.0"
    assert "dpo" in fm["tags"] and "`smollm2-135m`, an lmprefs offline asset" in text
    assert "base_model" not in front_matter(card_text(tmp_path, "tiny-gpt2", CardInfo("ppo")))


def test_the_cards_peft_snippets_load_the_adapters_as_trained(saved):
    """What the card tells a peft user to run gives lmprefs' logits and rewards, with the asset's directory as the
    base (the snippets' os.path.expanduser("~/.cache/lmprefs/NAME") is $LMPREFS_CACHE/NAME here)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from lmprefs.assets.models import resolve_model

    lm, rm, d = saved
    base_dir = resolve_model("tiny-gpt2")
    ids = torch.randint(0, 50257, (2, 8), generator=torch.Generator().manual_seed(0))
    assert 'PeftModel.from_pretrained(base, "path/to/this/model", subfolder="adapter")' in (
        d / "policy" / "README.md").read_text()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(d / "policy"),
                                      subfolder="adapter").eval()  # fmt: skip
    with torch.no_grad(), using(lm, "policy"):
        assert torch.allclose(model(ids).logits, lm(ids).logits, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(d / "rm")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    seq = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=1, pad_token_id=pad)
    seq = PeftModel.from_pretrained(seq, str(d / "rm")).merge_and_unload().eval()
    assert HERE in (d / "rm" / "README.md").read_text()
    with torch.no_grad():
        assert torch.allclose(seq(input_ids=ids).logits[:, 0], rm(ids[:, :4], ids[:, 4:]), atol=1e-4)


def test_a_local_base_is_named_without_its_path_and_still_loads_offline(tmp_path, monkeypatch):
    """A base given as a directory: the adapter names the directory, not /abs/path/to/it; lmprefs loads it back
    from another working directory through lmprefs.json's record; an asset given by its cache path is the asset."""
    from lmprefs.assets.models import resolve_model
    from lmprefs.models.lora import save_peft_adapter

    lm, tok = load_lm("tiny-gpt2")
    lm.save_pretrained(tmp_path / "my-sft-model")
    tok.save_pretrained(tmp_path / "my-sft-model")
    lm, tok = load_lm(str(tmp_path / "my-sft-model"))
    add_adapter(lm, LoraConfig(rank=2, alpha=4.0), "policy", seed=1)
    randomized(lm, "policy", 5)
    save_policy(Policy(lm, tok, 0.7, adapter="policy"), tmp_path / "policy", merged=False)
    adapter_cfg = (tmp_path / "policy" / "adapter" / "adapter_config.json").read_text()
    assert json.loads(adapter_cfg)["base_model_name_or_path"] == "my-sft-model" and str(tmp_path) not in adapter_cfg
    assert str(tmp_path) not in (tmp_path / "policy" / "README.md").read_text()
    monkeypatch.chdir(tmp_path / "policy")  # nothing named my-sft-model here: the record finds it
    ids = torch.randint(0, 50257, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), using(lm, "policy"):
        assert torch.allclose(load_policy(tmp_path / "policy").lm(ids).logits, lm(ids).logits, atol=1e-5)

    lm, _ = load_lm(resolve_model("tiny-gpt2"))  # the asset's cache directory, given as a path
    add_adapter(lm, LoraConfig(rank=2, alpha=4.0), "reward", seed=1)
    save_peft_adapter(lm, "reward", tmp_path / "by-path")
    assert json.loads((tmp_path / "by-path" / "adapter_config.json").read_text())["base_model_name_or_path"] == (
        "tiny-gpt2")


def test_a_reward_model_adapter_loads_offline_in_lmprefs(saved, monkeypatch, tmp_path_factory):
    _, rm, d = saved
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    ids = torch.randint(0, 50257, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(load_reward_model(d / "rm").eval()(ids[:, :4], ids[:, 4:]), rm(ids[:, :4], ids[:, 4:]),
                              atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("chat", [False, True], ids=["raw-text", "chat-template"])
def test_the_reward_cards_snippet_scores_as_lmprefs_score(tmp_path, capsys, chat):
    """The card's code, run as written with plain transformers, gives `lmprefs score`'s rewards: the texts in the
    frame the model was trained with (the chat turn where a template framed the queries, the task's prefix and
    suffix), where `rm(**tok(query + response))` is another score."""
    import copy
    import dataclasses
    import re
    import shutil

    from lmprefs.assets.models import tiny_gpt2_austen_dir
    from lmprefs.assets.tokenizers import load_tokenizer
    from lmprefs.cli.dispatch import main
    from lmprefs.config import preset
    from lmprefs.data.chat import saved_task

    model = tmp_path / "base"
    shutil.copytree(tiny_gpt2_austen_dir(), model)
    if chat:  # SmolLM2-Instruct's template without its system turn; no new tokens, so the embeddings stay
        tok = copy.deepcopy(load_tokenizer(model))
        tok.chat_template = (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip
        tok.save_pretrained(model)
    lm, tok = load_lm(str(model))
    task = dataclasses.replace(preset("tiny").task, initial_model=str(model), query_prefix="Story: ",
                               query_suffix="\n\nNext:", chat_template="true" if chat else "false")  # fmt: skip
    rm = RewardModel(lm, tok, seed=0).eval()
    with torch.no_grad():
        rm.head.linear.weight.normal_(0, 1, generator=torch.Generator().manual_seed(1))
        rm.gain.fill_(3.0)
        rm.bias.fill_(-0.5)
    saved = saved_task(task, tok)
    assert saved["chat_template"] == chat and ("chat_frame" in saved) == chat
    save_reward_model(rm, tmp_path / "rm", extra={"task": saved}, card=CardInfo("reward-model"))

    card = (tmp_path / "rm" / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", card, re.S)
    scope: dict = {}
    exec(code.replace(HERE, str(tmp_path / "rm")).replace("print(", "(lambda *a: a)("), scope)  # as written
    pairs = [("It was a fine morning", " and the sun was out."), ("She said", " nothing at all, and left.")]
    plain = [scope["reward"](q, r) for q, r in pairs]
    (tmp_path / "texts.txt").write_text("".join(f"{q}\t{r}\n" for q, r in pairs))
    capsys.readouterr()
    assert main(["score", "--reward-model", str(tmp_path / "rm"), str(tmp_path / "texts.txt")]) == 0
    scored = [float(line.split("\t")[0]) for line in capsys.readouterr().out.splitlines()]
    assert plain == pytest.approx(scored, abs=2e-4)
    # the snippet the card gave before: the query and response without their frame score otherwise
    seq, tk = scope["rm"], scope["tok"]
    with torch.no_grad():
        bare = [seq(**tk(q + r, return_tensors="pt")).logits[0, 0].item() for q, r in pairs]
    assert bare != pytest.approx(scored, abs=1e-2)


def test_score_prints_its_scores_and_nothing_of_transformers(tmp_path):
    """`lmprefs score` in a process of its own (transformers' bars are switched off per process): stdout one score
    per text, stderr empty, where transformers' loading bar came first."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    lm, tok = load_lm("tiny-gpt2-austen")
    save_reward_model(RewardModel(lm, tok, seed=0).eval(), tmp_path / "rm")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "lmprefs", "score", "--reward-model", str(tmp_path / "rm")],
                       input="It was a fine morning.\nShe said nothing.\n", capture_output=True, text=True, env=env,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    assert [line.split("\t")[1] for line in r.stdout.splitlines()] == ["It was a fine morning.", "She said nothing."]
