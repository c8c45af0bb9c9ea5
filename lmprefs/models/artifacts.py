"""Saved models: the policy and reward-model directories (`save_pretrained` + safetensors, heads and lmprefs.json,
peft adapters), written atomically, verified on load, exported as TRL-loadable sequence classifiers."""

from __future__ import annotations

from pathlib import Path
from typing import overload

import torch
from torch import Tensor

from lmprefs.assets.models import resolve_model
from lmprefs.assets.tokenizers import load_tokenizer, save_tokenizer
from lmprefs.io.publish import MANIFEST, publish_dir, verify
from lmprefs.models import parallel
from lmprefs.models.loading import MODEL_NAMES, _trunk_names, base_of, load_lm
from lmprefs.models.lora import merged_copy, save_peft_adapter
from lmprefs.models.model_card import CardInfo, write_card
from lmprefs.models.policy import Policy
from lmprefs.models.reward_model import RewardModel
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.quiet import quiet_transformers


@overload
def whole_for_saving(module: Policy) -> Policy | None: ...
@overload
def whole_for_saving(module: RewardModel) -> RewardModel | None: ...
def whole_for_saving(module: Policy | RewardModel) -> Policy | RewardModel | None:
    """`module` whole, to save on rank 0: itself where it is not sharded; under FSDP its shards gathered on rank 0
    into a plain_copy (a collective every rank must join), and None on the other ranks."""
    if not parallel.is_sharded(module):
        return module
    state = parallel.full_state_dict(module)
    if not dist.is_main():
        return None
    assert state is not None  # rank 0 holds the gathered state
    return plain_copy(module, state)


@overload
def plain_copy(module: Policy, state: dict) -> Policy: ...
@overload
def plain_copy(module: RewardModel, state: dict) -> RewardModel: ...
def plain_copy(module: Policy | RewardModel, state: dict) -> Policy | RewardModel:
    """An unsharded Policy or RewardModel shaped like `module` (e.g. one sharded by FSDP) holding `state`, a whole
    state dict of it (as lmprefs.models.parallel.full_state_dict gathers on rank 0), for saving with the usual writers.
    Built on the meta device and filled with `state`'s own tensors: no second copy of the weights."""

    def empty(lm):
        if lm is None:
            return None
        with torch.device("meta"):
            twin = type(lm)(lm.config)
        twin.generation_config = lm.generation_config
        twin.lmprefs_base, twin.lmprefs_base_path = base_of(lm)  # what its adapters and card name as the base
        return twin

    twin: Policy | RewardModel
    if isinstance(module, Policy):
        twin = Policy(empty(module.lm), module.tokenizer, module.temperature, value_lm=empty(module.value_lm))
    else:
        twin = RewardModel(empty(module.lm), module.tokenizer)
    twin.load_state_dict(state, assign=True)
    for lm in (twin.lm, getattr(twin, "value_lm", None)):
        if lm is not None and getattr(lm.config, "tie_word_embeddings", False):
            lm.tie_weights()
    return twin.eval()


def atomic_dir(out: Path, meta: dict | None = None, keep: int = 0):
    """Yield a temporary sibling to write into; on success it becomes `out` with a manifest, so readers never see
    half a model nor no model (lmprefs.io.publish.publish_dir: `out` is a symlink to a versioned directory)."""

    return publish_dir(out, meta, keep)


def verified(path: Path) -> Path:
    """`path` after checking its manifest (directories written before manifests existed load unchecked)."""

    path = Path(path)
    if (path / MANIFEST).is_file():
        verify(path)
    return path


def save_policy(policy: Policy, out: Path, merged: bool = True, card: CardInfo | None = None) -> None:
    """A policy directory (_save_policy) with its model card (README.md), published at once."""
    with atomic_dir(out) as tmp:
        _save_policy(policy, tmp, merged)
        write_card(tmp, policy.lm, card or CardInfo("rlhf"))


def _save_policy(policy: Policy, out: Path, merged: bool = False) -> None:
    """A policy directory. Full fine-tuning: a Hugging Face model directory (AutoModelForCausalLM loads it).
    LoRA: the adapters in peft's format under adapter/ (and value_adapter/), which PeftModel.from_pretrained(base,
    DIR/adapter) loads onto the initial model; with `merged`, also the merged model at the top (written once, for
    the final policy: checkpoints hold adapters only). Both: value_head.safetensors, generation_config.json (the
    training temperature, do_sample=True, top_k=0: the distribution PPO trained), lmprefs.json."""
    import json

    from safetensors.torch import save_file

    if policy.adapter:
        save_peft_adapter(policy.lm, policy.adapter, out / "adapter")
        if policy.value_adapter is not None:
            save_peft_adapter(policy.lm, policy.value_adapter, out / "value_adapter")
        if merged:  # in the base model's published dtype: an export to sample from, not training state
            _save_lm(merged_copy(policy.lm, policy.adapter).to(export_dtype(policy.lm)), out, policy.temperature)
    else:
        _save_lm(policy.lm, out, policy.temperature)
        if policy.value_lm is not None:
            policy.value_lm.save_pretrained(out / "value_model")
    save_tokenizer(policy.tokenizer, out)
    save_file({k: v.detach().cpu().contiguous() for k, v in policy.value_head.state_dict().items()},
              out / "value_head.safetensors")  # fmt: skip
    meta = {"kind": "policy", "temperature": policy.temperature, **base_meta(policy.lm)}
    (out / "lmprefs.json").write_text(json.dumps(meta))


def base_meta(lm) -> dict:
    """lmprefs.json's record of the base: its portable name, and a local directory's path on this machine (which
    adapter_base loads from here; elsewhere the name is all there is)."""
    name, path = base_of(lm)
    return {"base": name, **({"base_path": path} if path else {})}


def adapter_base(adapter_dir: Path, meta_dir: Path) -> str:
    """The base an adapter directory was trained on, as load_lm takes it: the name its adapter_config.json gives
    (an asset or hub name; an absolute path from earlier versions), or the local directory meta_dir/lmprefs.json
    recorded for it where that exists on this machine."""
    import json

    name = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())["base_model_name_or_path"]
    meta = Path(meta_dir) / "lmprefs.json"
    path = json.loads(meta.read_text()).get("base_path") if meta.is_file() else None
    if name not in MODEL_NAMES and path and Path(path).is_dir():
        return path
    return name


def _save_lm(lm, out: Path, temperature: float) -> None:
    from transformers import GenerationConfig

    saved = lm.generation_config
    # top_k=0: transformers samples from the top 50 by default; PPO trained (and lmprefs samples) the whole
    # distribution at this temperature. Responses have a fixed length in training: no EOS stop there.
    lm.generation_config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                            bos_token_id=saved.bos_token_id, eos_token_id=saved.eos_token_id,
                                            pad_token_id=saved.pad_token_id)  # fmt: skip
    try:
        lm.save_pretrained(out)
    finally:
        lm.generation_config = saved


def load_policy(path: Path, device: torch.device | str = "cpu", temperature: float | None = None) -> Policy:
    """A saved policy: its merged model, or (adapter-only directories, e.g. a checkpoint's) the initial model with
    its peft adapters merged in."""
    import json

    from safetensors.torch import load_file

    path = verified(path)
    meta = json.loads((path / "lmprefs.json").read_text())
    if (path / "config.json").is_file():
        lm, tok = load_lm(str(path), device)
    else:
        lm, tok = _load_merged_adapter(path / "adapter", adapter_base(path / "adapter", path), device)
    value_lm = None
    if (path / "value_model").exists():
        value_lm = load_lm(str(path / "value_model"), device)[0]
    elif (path / "value_adapter").exists():
        value_lm = _load_merged_adapter(path / "value_adapter", adapter_base(path / "value_adapter", path),
                                        device)[0]  # fmt: skip
    p = Policy(lm, tok, temperature if temperature is not None else meta["temperature"], value_lm=value_lm)
    p.value_head.load_state_dict(load_file(path / "value_head.safetensors"))
    return p.to(device)


def _load_merged_adapter(adapter_dir: Path, base: str, device):
    from peft import PeftModel

    lm, tok = load_lm(base, device)
    return PeftModel.from_pretrained(lm, str(adapter_dir)).merge_and_unload().eval(), tok


def save_reward_model(rm: RewardModel, out: Path, extra: dict | None = None, merged: bool = True,
                      card: CardInfo | None = None) -> None:  # fmt: skip
    """A reward-model directory (_save_reward_model) with its model card (README.md), published at once."""
    with atomic_dir(out) as tmp:
        write_reward_model(rm, tmp, extra, merged, card)


def write_reward_model(rm: RewardModel, out: Path, extra: dict | None = None, merged: bool = True,
                       card: CardInfo | None = None) -> None:  # fmt: skip
    """save_reward_model's files written into the existing directory `out` (a directory being published: a reward
    model's own, or an ensemble's member)."""
    _save_reward_model(rm, out, extra, merged)
    write_card(out, rm.lm, card or CardInfo("reward-model"))


def _save_reward_model(rm: RewardModel, out: Path, extra: dict | None, merged: bool = True) -> None:
    """A standard sequence-classification directory: AutoModelForSequenceClassification.from_pretrained(DIR) gives
    lmprefs' rewards (num_labels=1, read at the last non-pad token; see to_sequence_classifier), plus the tokenizer
    and lmprefs.json (the task it was trained for, its training summary). A LoRA reward model with `merged` off is
    saved as its adapter instead, in peft's format for a sequence classifier (the score head and, where it holds the
    folded constant, the final norm as modules_to_save): AutoModelForSequenceClassification.from_pretrained(DIR,
    num_labels=1) loads the base model and the adapter and gives the same rewards, at ~1% of the size."""
    import json

    meta = {"kind": "reward_model", **base_meta(rm.lm), **(extra or {})}
    if rm.adapter and not merged:
        tensors, const = score_head_tensors(rm.lm, rm)
        save_peft_adapter(rm.lm, rm.adapter, out, task_type="SEQ_CLS", extra=tensors)
        if const is not None:
            meta["score_bias"] = const
    else:
        lm = merged_copy(rm.lm, rm.adapter) if rm.adapter else rm.lm
        seq = to_sequence_classifier(lm, rm)
        seq.to(export_dtype(rm.lm)).save_pretrained(out)
    save_tokenizer(rm.tokenizer, out)
    (out / "lmprefs.json").write_text(json.dumps(meta, indent=1))


def export_dtype(lm) -> torch.dtype:
    """The dtype an exported (merged) model is written in: the one the initial model was published in (load_lm
    trains in fp32 and records it), so a bf16 base is not saved as an fp32 copy twice its size."""
    return getattr(lm, "source_dtype", None) or torch.float32


@torch.no_grad()
def score_head_tensors(lm, rm: RewardModel) -> tuple[dict[str, Tensor], float | None]:
    """The sequence classifier's own tensors for rm, named as in XForSequenceClassification, and the constant left
    over (None when folded in). score.weight = gain * w; the constant c = gain * b + bias is folded into the final
    norm's bias along w (w . (h + c w / |w|^2) = w . h + c): exact for trunks whose final norm has a bias (GPT-2).
    Llama-style RMSNorm has none; there c is returned, for lmprefs to add back (other readers see an offset)."""
    w = (rm.gain * rm.head.linear.weight).detach().float().cpu()  # [1, d]; written from the CPU, rm may be on a GPU
    c = float(rm.gain * rm.head.linear.bias + rm.bias)
    out = {"score.weight": w}
    norm_name = _trunk_names(lm)[1]
    name, norm = f"{lm.base_model_prefix}.{norm_name}", getattr(lm.base_model, norm_name)
    if getattr(norm, "bias", None) is None:
        return out, c
    out[f"{name}.weight"] = norm.weight.detach().cpu().clone()
    out[f"{name}.bias"] = norm.bias.detach().cpu() + (c * w[0] / (w[0] @ w[0])).to(norm.bias.dtype)
    return out, None


@torch.no_grad()
def to_sequence_classifier(lm, rm: RewardModel):
    """`lm`'s trunk with rm's head as a transformers XForSequenceClassification (num_labels=1) computing
    gain * (w . h + b) + bias at the last real token (score_head_tensors: the constant folded into the final norm
    where it has a bias, else kept in the config as `lmprefs_score_bias`, which lmprefs adds back)."""
    import copy

    from transformers import AutoModelForSequenceClassification

    cfg = copy.deepcopy(lm.config)
    cfg.num_labels, cfg.problem_type = 1, "regression"
    cfg.architectures = None
    if cfg.pad_token_id is None:  # the HF classifier finds the last real token as the rightmost non-pad id
        cfg.pad_token_id = rm.tokenizer.pad_token_id if rm.tokenizer.pad_token_id is not None else cfg.eos_token_id
    seq = AutoModelForSequenceClassification.from_config(cfg, dtype=next(lm.parameters()).dtype)
    seq.base_model.load_state_dict(lm.base_model.state_dict())
    tensors, const = score_head_tensors(lm, rm)
    missed = seq.load_state_dict(tensors, strict=False).unexpected_keys
    assert not missed, missed
    if const is not None:
        seq.config.lmprefs_score_bias = const
    return seq.eval()


def is_reward_model_dir(path: Path) -> bool:
    """A directory holding a scalar sequence classifier (lmprefs' own, or e.g. one trained with TRL), or an
    lmprefs reward model of the earlier format (a causal LM + reward_head.safetensors)."""
    import json

    path = Path(path)
    if (path / "reward_head.safetensors").is_file():
        return True
    try:  # a LoRA adapter for a sequence classifier (lmprefs' own, or TRL's with peft)
        return json.loads((path / "adapter_config.json").read_text()).get("task_type") == "SEQ_CLS"
    except (OSError, ValueError, AttributeError):
        pass
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    archs = cfg.get("architectures") or []
    labels = cfg.get("num_labels", len(cfg.get("id2label") or {}) or 2)
    return any(a.endswith("ForSequenceClassification") for a in archs) and labels == 1


def load_reward_model(path: Path, device: torch.device | str = "cpu") -> RewardModel:
    """A reward model from a sequence-classification directory (num_labels=1), e.g. lmprefs' or TRL's, or a LoRA
    adapter for one (lmprefs' or TRL's with peft); rewards are its score at the last real token (plus the constant
    lmprefs kept as `lmprefs_score_bias` in the config, or `score_bias` in lmprefs.json beside an adapter)."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    path = Path(path)
    if not is_reward_model_dir(path):
        raise FileNotFoundError(f"{path} is not a reward-model directory (no sequence classifier with num_labels=1)")
    verified(path)
    quiet_transformers()  # its loading bar came before `lmprefs score`'s scores; the base's missing head is no news
    if (path / "reward_head.safetensors").is_file():  # the earlier format
        lm, tok = load_lm(str(path), device)
        rm = RewardModel(lm, tok)
        t = load_file(path / "reward_head.safetensors")
        rm.head.load_state_dict({k[5:]: v for k, v in t.items() if k.startswith("head.")})
        with torch.no_grad():
            rm.gain.copy_(t["gain"])
            rm.bias.copy_(t["bias"])
        return rm.to(device)
    if (path / "adapter_config.json").is_file():
        seq = _load_classifier_adapter(path)
        meta = json.loads((path / "lmprefs.json").read_text()) if (path / "lmprefs.json").is_file() else {}
        const = meta.get("score_bias", 0.0)
    else:
        seq = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32)
        const = getattr(seq.config, "lmprefs_score_bias", 0.0)
    seq = seq.to(device).eval()
    rm = RewardModel(seq, load_tokenizer(path))
    with torch.no_grad():
        rm.head.linear.weight.copy_(seq.score.weight)
        rm.head.linear.bias.zero_()
        rm.bias.fill_(float(const))
    return rm.to(device)


def _load_classifier_adapter(path: Path):
    """The base model of a sequence-classifier LoRA adapter directory as a classifier (num_labels=1), with the
    adapter and its saved head merged in."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    base = resolve_model(adapter_base(path, path))
    seq = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    return PeftModel.from_pretrained(seq, str(path)).merge_and_unload()
