"""The model card (README.md) of a saved policy or reward model: Hugging Face's YAML front matter (library_name,
base_model, license, tags) and what a reader of the hub page needs: the base, the data, the key settings, the
results the run knows when it saves, and how to load the directory with transformers, peft and lmprefs.

Snippets name the directory as HERE; `lmprefs push` puts the repo's name in its place."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from lmprefs.assets.models import ASSET_HUB_IDS, MODEL_ASSETS
from lmprefs.assets.tokenizers import load_tokenizer
from lmprefs.config.diff import flat_config
from lmprefs.data.chat import chat_frame, scoring_pieces
from lmprefs.models.loading import base_of

HERE = "path/to/this/model"
# licenses of the bases lmprefs knows, for the card's front matter (a fine-tune inherits its base's terms)
BASE_LICENSES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "apache-2.0", "HuggingFaceTB/SmolLM2-135M": "apache-2.0",
                 "gpt2": "mit", "openai-community/gpt2": "mit", "tiny-gpt2": "mit", "tiny-gpt2-austen": "mit"}
COMMON_KEYS = ("task.initial_model", "task.query_dataset", "task.query_length", "task.response_length",
               "task.temperature", "lora.rank", "run.seed")
METHOD_KEYS = {
    "ppo": ("ppo.total_episodes", "ppo.batch_size", "ppo.lr", "ppo.noptepochs", "ppo.estimator", "rewards.kl_coef",
            "rewards.kl_target", "rewards.trained_model"),
    "rloo": ("ppo.total_episodes", "ppo.batch_size", "ppo.lr", "ppo.rloo_k", "ppo.rloo_ratio", "rewards.kl_coef",
             "rewards.kl_target", "rewards.trained_model"),
    "grpo": ("ppo.total_episodes", "ppo.batch_size", "ppo.lr", "ppo.rloo_k", "ppo.kl_in", "rewards.kl_coef",
             "rewards.kl_target", "rewards.trained_model"),
    "dpo": ("labels.type", "dpo.loss", "dpo.beta", "dpo.lr", "dpo.batch_size", "dpo.epochs"),
    "reward-model": ("labels.type", "labels.labeler", "labels.num_train", "labels.heldout_fraction",
                     "train_reward.lr", "train_reward.batch_size", "train_reward.epochs"),
}
METHOD_TEXT = {
    "ppo": "A policy fine-tuned with PPO against a reward model learned from preferences, with a KL penalty",
    "dpo": "A policy fine-tuned directly on preference labels with DPO (the base is the reference)",
    "reward-model": "A reward model trained on preference labels (a scalar score of query + response)",
    "rlhf": "A policy fine-tuned from preferences",
    "rloo": "A policy fine-tuned with RLOO against a reward model learned from preferences, with a KL penalty",
    "grpo": "A policy fine-tuned with GRPO against a reward model learned from preferences, with a KL term",
    "dr_grpo": "A policy fine-tuned with Dr. GRPO against a reward model learned from preferences, with a KL term",
    "reinforce_pp_baseline": "A policy fine-tuned with REINFORCE++-baseline against a reward model learned from "
                             "preferences, with a KL penalty",
}
METHOD_KEYS["dr_grpo"] = METHOD_KEYS["grpo"]
METHOD_KEYS["reinforce_pp_baseline"] = METHOD_KEYS["rloo"]


@dataclass(frozen=True)
class CardInfo:
    """What the run knows when it saves: how it trained (`method`: ppo, dpo, reward-model), its config, its
    results ({"held-out accuracy": 0.71}), and its labels ({"type": ..., "train": n, "held out": m})."""

    method: str
    cfg: object | None = None
    results: dict[str, float] = field(default_factory=dict)
    labels: dict = field(default_factory=dict)


def write_card(out: Path, lm, info: CardInfo) -> None:
    """README.md in `out`, a directory save_policy or save_reward_model has just filled (its files decide the
    loading snippets); `lm` is the trained model, whose base the card names."""
    (Path(out) / "README.md").write_text(card_text(Path(out), base_of(lm)[0], info))


def card_text(out: Path, base: str, info: CardInfo) -> str:
    rm = info.method == "reward-model"
    adapter_only = not (out / "config.json").is_file()
    hub = ASSET_HUB_IDS.get(base, base if base not in MODEL_ASSETS and "/" in base else None)
    front = ["---", f"library_name: {'peft' if adapter_only else 'transformers'}"]
    if hub:
        front.append(f"base_model: {hub}")
    lic = BASE_LICENSES.get(hub or base)
    if lic:
        front.append(f"license: {lic}")
    tags = ["lmprefs", "rlhf", info.method] + (["text-classification"] if rm else []) + (
        ["lora", "peft"] if adapter_only or (out / "adapter").is_dir() else [])
    front += ["tags:", *[f"- {t}" for t in dict.fromkeys(tags)],
              f"pipeline_tag: {'text-classification' if rm else 'text-generation'}", "---", ""]
    kind = "Reward model" if rm else f"Policy ({info.method})"
    about = (f"{METHOD_TEXT.get(info.method, info.method)}, trained with lmprefs, a PyTorch reproduction of "
             "[OpenAI's lm-human-preferences](https://github.com/openai/lm-human-preferences) (Ziegler et al. 2019, "
             "*Fine-Tuning Language Models from Human Preferences*).")
    lines = [*front, f"# {kind} from lmprefs", "", about, "", "## Base model", "",
             _base_text(base, hub), ""]
    lines += _data(info) + _settings(info) + _results(info) + _loading(out, base, hub, rm, adapter_only)
    return "\n".join(lines) + "\n"


def _base_text(base: str, hub: str | None) -> str:
    if base in MODEL_ASSETS:
        src = (f"; converted from [{hub}](https://huggingface.co/{hub}) (its weights as lmprefs' offline asset "
               "holds them, which may differ from the hub's in the last bits)") if hub else ""
        return (f"`{base}`, an lmprefs offline asset{src}. `lmprefs assets prepare {base}` builds it into "
                f"`$LMPREFS_CACHE/{base}` (default `~/.cache/lmprefs/{base}`), a Hugging Face model directory.")
    if hub:
        return f"[{hub}](https://huggingface.co/{hub})"
    return f"`{base}`: a local model directory (not on the hub); load adapters onto your copy of it."


def _data(info: CardInfo) -> list[str]:
    flat = flat_config(info.cfg) if info.cfg is not None else {}
    rows = []
    if flat:
        rows.append(f"- queries: `{flat['task.query_dataset']}`, {flat['task.query_length']} tokens, responses "
                    f"{flat['task.response_length']} tokens")
        if info.method in ("dpo", "reward-model"):  # a policy's reward may be a function: no labels then
            rows.append(f"- labels: `{flat['labels.type']}`")
    counts = {k: v for k, v in info.labels.items() if k != "labelers"}
    if counts:
        rows.append("- label count: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    if info.labels.get("labelers"):  # the store's: people, or a simulated labeler
        rows.append("- labelers: " + ", ".join(f"`{n}`" for n in info.labels["labelers"]))
    return ["## Data", "", *rows, ""] if rows else []


def _settings(info: CardInfo) -> list[str]:
    if info.cfg is None:
        return []
    flat = flat_config(info.cfg)
    keys = [k for k in (*COMMON_KEYS, *METHOD_KEYS.get(info.method, ())) if k in flat]
    return ["## Training settings", "", "The key settings (the whole config is the run directory's `config.json`):",
            "", "| key | value |", "|---|---|", *[f"| `{k}` | `{json.dumps(flat[k])}` |" for k in keys], ""]


def _results(info: CardInfo) -> list[str]:
    if not info.results:
        return []
    return ["## Results", "", "| metric | value |", "|---|---|",
            *[f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in info.results.items()], ""]


def _loading(out: Path, base: str, hub: str | None, rm: bool, adapter_only: bool) -> list[str]:
    # an asset's own directory even where it came from the hub: the adapters were trained on the asset's weights
    base_dir = (f'os.path.expanduser("~/.cache/lmprefs/{base}")' if base in MODEL_ASSETS
                else f'"{hub}"' if hub else f'"path/to/{base}"')  # fmt: skip
    adapter = adapter_only or (out / "adapter").is_dir()
    code = ["## How to load", "", "```python", *(["import os", ""] if adapter and "os.path" in base_dir else [])]
    code += [*(["import torch"] if rm else []), *(["from peft import PeftModel"] if adapter else []),
             f"from transformers import {'AutoModelForSequenceClassification' if rm else 'AutoModelForCausalLM'}, "
             "AutoTokenizer", "",
             f'tok = AutoTokenizer.from_pretrained("{HERE}")']
    if rm:
        return code + _reward_snippet(out, base_dir, adapter_only)
    code += [f'model = AutoModelForCausalLM.from_pretrained("{HERE}")',
             "# generation_config.json samples as training did: the training temperature, top_k=0",
             'out = model.generate(**tok("It was a fine morning", return_tensors="pt"), max_new_tokens=24)']
    if adapter:
        code += ["", "# or the LoRA adapter on the base it was trained on",
                 f"base = AutoModelForCausalLM.from_pretrained({base_dir})",
                 f'model = PeftModel.from_pretrained(base, "{HERE}", subfolder="adapter")']
    return code + ["```", "", "With lmprefs: `lmprefs evaluate DIR --reward NAME` (beside its base), or "
                   "`lmprefs.models.artifacts.load_policy(DIR)` (the policy with its value head).", ""]


def _reward_snippet(out: Path, base_dir: str, adapter_only: bool) -> list[str]:
    """The reward model's loading code after the tokenizer: the classifier, then `reward(query, response)` framing
    the texts exactly as training did (lmprefs.json's task: the chat turn, query_prefix and query_suffix, each piece
    tokenized on its own, as `lmprefs score` does), plus the constant a final norm without a bias cannot hold."""
    meta = json.loads((out / "lmprefs.json").read_text()) if (out / "lmprefs.json").is_file() else {}
    config = json.loads((out / "config.json").read_text()) if (out / "config.json").is_file() else {}
    task = meta.get("task") or {}
    if task.get("chat_template") and not task.get("chat_frame"):
        task = {**task, "chat_frame": list(chat_frame(load_tokenizer(out)))}
    before, after = scoring_pieces(task)
    pieces = ", ".join([*(repr(p) for p in before if p), "query", *(repr(p) for p in after if p), "response"])
    if adapter_only:
        code = ["pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id",
                f"base = AutoModelForSequenceClassification.from_pretrained({base_dir}, num_labels=1, "
                "pad_token_id=pad, dtype=torch.float32)",
                f'rm = PeftModel.from_pretrained(base, "{HERE}").merge_and_unload()']
        const = f" + {meta['score_bias']!r}" if meta.get("score_bias") is not None else ""
    else:
        code = [f'rm = AutoModelForSequenceClassification.from_pretrained("{HERE}", dtype=torch.float32)']
        const = " + rm.config.lmprefs_score_bias" if "lmprefs_score_bias" in config else ""
    frame = "the chat template's turn, " if task.get("chat_template") else ""
    code += ["", "",
             "def reward(query: str, response: str) -> float:",
             f"    # the frame it was trained with ({frame}query_prefix, query_suffix: lmprefs.json's task),",
             "    # each piece tokenized on its own as lmprefs does; without it the scores are not lmprefs'",
             f"    pieces = [{pieces}]",
             "    ids = [i for p in pieces if p for i in tok(p, add_special_tokens=False).input_ids]",
             "    with torch.no_grad():",
             f"        return rm(input_ids=torch.tensor([ids])).logits[0, 0].item(){const}  # higher: preferred",
             "", "",
             'print(reward("It was a fine morning", " and the sun was out."))']
    return code + ["```", "", "Score texts only in that frame: `rm(**tok(query + response))` leaves it out and gives "
                   "other scores, in another order. With lmprefs: `lmprefs score --reward-model DIR` (one text per "
                   "line), or `lmprefs.models.artifacts.load_reward_model(DIR)`. `lmprefs.json` holds the query and "
                   "response format it was trained on and its training figures.", ""]
