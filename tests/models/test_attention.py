"""lmprefs' attention (`lmprefs.models.attention`): the eager form it runs on the CPU for short rows equals PyTorch's
SDPA in fp32, values and gradients, with grouped-query heads, padding and a row with every key masked; long rows and
other devices go to transformers' SDPA; a model saved with it loads in plain transformers."""

import json

import pytest
import torch
import torch.nn.functional as F

from lmprefs.models import attention
from lmprefs.models.loading import load_lm
from lmprefs.models.trunk import trunk_hidden


def sdpa_reference(q, k, v, mask, scale):
    """PyTorch's SDPA on the key-value heads repeated per query head, [B, Lq, H, D]."""
    G = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1), attn_mask=mask,
                                         scale=scale)  # fmt: skip
    return out.transpose(1, 2)


@pytest.mark.parametrize("lq", [1, 6])
@pytest.mark.parametrize("heads", [(4, 2), (3, 3)])
def test_grouped_attention_equals_sdpa_values_and_gradients(lq, heads):
    H, Hkv = heads
    B, L, D = 3, 9, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, n, D, generator=g, requires_grad=True) for h, n in ((H, lq), (Hkv, L), (Hkv, L)))
    mask = torch.ones(L, L, dtype=torch.bool).tril()[L - lq :].expand(B, 1, lq, L).clone()
    mask[1, :, :, 2:4] = False  # padding inside a row
    want = sdpa_reference(q, k, v, mask, 0.3)
    got = attention.grouped_attention(q, k, v, mask, 0.3)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    w = torch.randn(want.shape, generator=g)
    want_grads = torch.autograd.grad((want * w).sum(), (q, k, v))
    got_grads = torch.autograd.grad((got * w).sum(), (q, k, v))
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_row_with_every_key_masked_gives_no_nan():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    mask = torch.zeros(1, 1, 3, 3, dtype=torch.bool)
    assert torch.isfinite(attention.grouped_attention(q, k, v, mask, 0.5)).all()


def test_only_short_rows_on_the_cpu_take_the_eager_form():
    q, k = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 200, 4)
    mask = torch.ones(1, 1, 1, 200, dtype=torch.bool)
    assert attention.eager_on_cpu(q, k, mask)
    assert not attention.eager_on_cpu(q, k, mask, dropout=0.1)
    assert not attention.eager_on_cpu(q, k, None)  # transformers' causal shortcut: SDPA's is_causal
    assert not attention.eager_on_cpu(q, k, mask.float())
    assert not attention.eager_on_cpu(q, k, mask, softcap=30.0)
    many_keys = torch.zeros(1, 2, 1024, 4)  # a decode step over a long cache
    assert not attention.eager_on_cpu(q, many_keys, torch.ones(1, 1, 1, 1024, dtype=torch.bool))
    long_q, long_k = torch.zeros(1, 2, 200, 4), torch.zeros(1, 2, 200, 4)
    assert not attention.eager_on_cpu(long_q, long_k, torch.ones(1, 1, 200, 200, dtype=torch.bool))
    assert not attention.eager_on_cpu(q.to("meta"), k.to("meta"), mask.to("meta"))  # another device


@pytest.mark.parametrize("heads", [(4, 2), (3, 3)])
@pytest.mark.parametrize("per_head_mask", [False, True])
def test_decode_attention_equals_sdpa_for_one_query_position(heads, per_head_mask):
    H, Hkv = heads
    B, L, D = 3, 9, 8
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(B, H, 1, D, generator=g), torch.randn(B, Hkv, L, D, generator=g), torch.randn(B, Hkv, L, D)
    mask = torch.ones(B, H if per_head_mask else 1, 1, L, dtype=torch.bool)
    mask[..., 6:] = False  # static-cache slots not written yet
    mask[1, 0, 0, 2:4] = False  # padding inside a row
    torch.testing.assert_close(attention.decode_attention(q, k, v, mask, 0.3), sdpa_reference(q, k, v, mask, 0.3),
                               atol=1e-6, rtol=1e-5)  # fmt: skip


def test_the_fused_decode_form_is_taken_only_inside_a_compile_on_a_gpu():
    q, k = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 9, 4)
    mask = torch.ones(1, 1, 1, 9, dtype=torch.bool)
    assert not attention.fused_decode(q, k, mask)  # the CPU: the short-row eager form or SDPA
    assert not attention.fused_decode(q.to("meta"), k.to("meta"), mask.to("meta"))  # no GPU, not compiling


def test_a_loaded_model_runs_it_and_matches_sdpa(tmp_path):
    from transformers import AutoModelForCausalLM

    lm, _ = load_lm("tiny-gpt2")
    assert lm.config._attn_implementation == attention.NAME
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(0))
    tokens[0, -3:] = -1  # padding
    ours = trunk_hidden(lm, tokens)
    lm.set_attn_implementation("sdpa")
    torch.testing.assert_close(ours, trunk_hidden(lm, tokens), atol=1e-5, rtol=1e-5)
    lm.set_attn_implementation(attention.NAME)
    lm.save_pretrained(tmp_path)
    assert attention.NAME not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert plain.config._attn_implementation != attention.NAME
