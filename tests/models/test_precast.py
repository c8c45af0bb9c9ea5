"""Frozen weights cast once per sampling call (lmprefs.models.precast): bitwise the same draws as autocast casting
them at every step, for GPT-2's Conv1D and Llama's nn.Linear, with and without LoRA, and the modules left as found."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmprefs.models import sampling
from lmprefs.models.precast import _frozen_linears, precast


def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def with_lora(model):
    from lmprefs.config import LoraConfig
    from lmprefs.models.lora import add_adapter

    for p in add_adapter(model, LoraConfig(rank=4), "policy", seed=3):
        torch.nn.init.normal_(p, std=0.1)  # B starts at zero: a nonzero adapter takes part in the draws
    return model


def own_forwards(model) -> list:
    """The forward each module holds in its dict (None: its class's)."""
    return [m.__dict__.get("forward") for m in model.modules()]


def draws(model, vocab, monkeypatch, on: bool):
    from lmprefs.models.lora import lora_modules, using

    monkeypatch.setattr(sampling, "precast", precast if on else (lambda m, d: contextlib.nullcontext()))
    q = torch.randint(0, vocab, (4, 6), generator=torch.Generator().manual_seed(1))
    adapter = "policy" if lora_modules(model) else None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), using(model, adapter):
        return sampling.sample(model, q, 5, 0.7, vocab, torch.Generator().manual_seed(2))


@pytest.mark.parametrize("kind", ["gpt2", "llama", "llama-lora"])
def test_precast_draws_bitwise_what_autocast_draws(kind, tiny_lm, monkeypatch):
    model, vocab = (copy.deepcopy(tiny_lm[0]), len(tiny_lm[1])) if kind == "gpt2" else (tiny_llama(), 300)
    if kind == "llama-lora":
        model = with_lora(model)
    else:
        model.requires_grad_(False)
    frozen = list(_frozen_linears(model))
    assert frozen and all(not w.requires_grad for _, w in frozen)
    before = own_forwards(model)
    a, b = draws(model, vocab, monkeypatch, False), draws(model, vocab, monkeypatch, True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert own_forwards(model) == before  # every module's forward as it was (cpu_linear's, where loaded with it)


def test_precast_leaves_trained_weights_and_fp32_alone(monkeypatch):
    model = tiny_llama()  # every weight trains: autocast caches those casts itself
    assert list(_frozen_linears(model)) == []
    model.requires_grad_(False)
    with precast(model, "cpu"):  # autocast off: nothing to cast to
        assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_block_norms_return_the_autocast_dtype_only_without_autograd(kind, tiny_lm):
    from lmprefs.models.precast import _block_norms

    model = copy.deepcopy(tiny_lm[0]) if kind == "gpt2" else tiny_llama()  # the fixture is shared
    model.requires_grad_(False)
    norms = list(_block_norms(model))
    assert len(norms) == 2 * model.config.num_hidden_layers
    before = own_forwards(model)
    x = torch.randn(2, 3, model.config.hidden_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad(), precast(model, "cpu"):
            assert all(n(x).dtype == torch.bfloat16 for n in norms)
        with precast(model, "cpu"):  # with autograd the projections' gradients stay summed in fp32
            assert all(n(x).dtype == torch.float32 for n in norms)
    assert own_forwards(model) == before
