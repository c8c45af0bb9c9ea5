"""Loading a causal LM (asset name, local directory) with dropout off, and the facts of a loaded model the rest
needs: vocabulary, context length, width, the list of blocks."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from lmprefs.assets.cache import AssetError, cache_dir
from lmprefs.assets.models import MODEL_ASSETS as MODEL_NAMES
from lmprefs.assets.models import resolve_model
from lmprefs.assets.tokenizers import load_tokenizer
from lmprefs.models import attention, cpu_linear
from lmprefs.runtime.quiet import quiet_transformers


def load_lm(name: str, device: torch.device | str = "cpu"):
    """(model, tokenizer) for an asset name, a local HF directory or a hub name; dropout off, eval mode, fp32.

    Dropout is switched off in the config (the original builds every forward with do_dropout=False), not by
    remembering .eval(): HF GPT-2 defaults to 0.1.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    quiet_transformers()  # "Loading weights" bars on every load drown the run's own progress
    path = resolve_model(name)
    try:
        cfg = AutoConfig.from_pretrained(path)
    except OSError as e:  # a hub name with no hub, or a typo
        raise AssetError(f"model {name!r} is not an asset ({', '.join(MODEL_NAMES)}), a local directory, or a "
                         f"reachable hub model ({str(e).splitlines()[0][:120]})") from None
    for key in list(cfg.to_dict()):
        if ("dropout" in key or "pdrop" in key) and isinstance(getattr(cfg, key, None), float):
            setattr(cfg, key, 0.0)
    if getattr(cfg, "activation_function", None) == "gelu_new":
        # GPT-2's GELU is the tanh approximation (the original's model.py:gelu); HF's "gelu_new" spells it as five
        # elementwise ops in Python, "gelu_pytorch_tanh" as one kernel: the same function (|dlogprob| ~1e-6), ~5%
        # faster PPO steps on the benchmark's GPT-2
        cfg.activation_function = "gelu_pytorch_tanh"
    source_dtype = getattr(cfg, "dtype", None)  # as published, before loading in fp32 rewrites the config
    if isinstance(source_dtype, str):
        source_dtype = getattr(torch, source_dtype, None)
    # transformers types PreTrainedModel.to as functools.wraps(nn.Module.to), which typeshed does not bind as a method
    model = AutoModelForCausalLM.from_pretrained(path, config=cfg, dtype=torch.float32)
    model = model.to(device).eval()  # type: ignore[arg-type]
    attention.use(model)
    cpu_linear.use(model)  # fp32 frozen linears on the CPU through oneDNN
    # exports of merged models go back to it (export_dtype)
    model.source_dtype = source_dtype if isinstance(source_dtype, torch.dtype) else torch.float32
    model.lmprefs_base, model.lmprefs_base_path = portable_base(name, path)
    return model, load_tokenizer(path)


def portable_base(name: str, path: str) -> tuple[str, str | None]:
    """(what a saved adapter and model card name as the base, the local directory it was loaded from or None).
    The name is an asset or hub name as given (lmprefs resolves an asset on any machine), an asset's cache
    directory by its asset name, any other local directory by its own name: an absolute path names this machine
    only, and would publish its layout with the model. lmprefs.json keeps the path, for loading back here."""
    if not name or name in MODEL_NAMES or not Path(path).is_dir():
        return name, None
    where = Path(path).resolve()
    for asset in MODEL_NAMES:
        if (cache_dir() / asset).resolve() == where:
            return asset, None
    return where.name, str(where)


def base_of(model) -> tuple[str, str | None]:
    """portable_base of a model: as load_lm recorded it, else (a model built elsewhere) from its name_or_path."""
    if getattr(model, "lmprefs_base", None):
        return model.lmprefs_base, getattr(model, "lmprefs_base_path", None)
    name = str(getattr(model, "name_or_path", "") or getattr(model.config, "name_or_path", "") or "")
    return portable_base(name, name)


def vocab_size(tokenizer) -> int:
    """Real vocabulary size: logits beyond it (embedding padding) are never sampled."""
    return len(tokenizer)


def max_positions(model) -> int:
    c = model.config
    return int(getattr(c, "n_positions", 0) or getattr(c, "max_position_embeddings", 1 << 30))


def hidden_size(model) -> int:
    return int(model.config.hidden_size)


def _trunk_names(model) -> tuple[str, str, str | None]:
    """(blocks, final norm, additive position embedding or None) attribute names of a Llama- or GPT-2-style trunk."""
    trunk = model.base_model
    blocks = "layers" if hasattr(trunk, "layers") else "h"
    norm = "norm" if hasattr(trunk, "norm") else "ln_f"
    return blocks, norm, "wpe" if hasattr(trunk, "wpe") else None


def trunk_blocks(model) -> nn.ModuleList:
    """The transformer blocks of a Llama- or GPT-2-style trunk, bottom first."""
    return getattr(model.base_model, _trunk_names(model)[0])
