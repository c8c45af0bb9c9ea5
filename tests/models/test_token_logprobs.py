"""The chunked log-probabilities and entropy equal the unfused torch ops, values and gradients."""

import pytest
import torch

from lmprefs.models.token_logprobs import CHUNK_ROWS, token_logprobs


def unfused(logits, tokens, temperature, vocab):
    logp = torch.log_softmax(logits[..., :vocab].float() / temperature, dim=-1)
    lp = logp.gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return lp, -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("entropy_in_loss", [False, True])
def test_values_and_gradients_equal_the_unfused_ops(dtype, entropy_in_loss):
    g = torch.Generator().manual_seed(0)
    B, T, vocab, padded = 3, CHUNK_ROWS // 2 + 3, 500, 512  # rows not a multiple of the chunk; padded head columns
    base = (torch.randn(B, T, padded, generator=g) * 4).to(dtype)
    tokens = torch.randint(0, vocab, (B, T), generator=g)
    tokens[1, -2:] = -1  # pads read token 0
    w_lp, w_ent = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    out = []
    for f in (unfused, token_logprobs):
        x = base.clone().requires_grad_(True)
        lp, ent = f(x, tokens, 0.7, vocab)
        loss = (lp * w_lp).sum() + ((ent * w_ent).sum() if entropy_in_loss else 0)
        loss.backward()
        out.append((lp.detach(), ent.detach(), x.grad.float()))
    (lp0, ent0, g0), (lp1, ent1, g1) = out
    assert lp1.dtype == ent1.dtype == torch.float32 and lp1.shape == ent1.shape == (B, T)
    assert torch.equal(lp1, lp0) and torch.equal(ent1, ent0)  # per row the same ops: bitwise the same values
    # the gradients by other formulas (softmax for exp(log_softmax), the temperature inside the product): equal within
    # float32 rounding, and in bf16 within one rounding of the gradient to bf16
    tol = (1e-6 if not entropy_in_loss else 1e-4) if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(g1, g0, rtol=tol, atol=tol)
    assert g1[..., vocab:].abs().max() == 0  # the head's padding columns get no gradient
    assert g1.abs().max() > 0


def test_without_gradients_it_builds_no_graph():
    logits = torch.randn(2, 5, 40)
    with torch.no_grad():
        lp, ent = token_logprobs(logits, torch.zeros(2, 5, dtype=torch.long), 1.0, 40)
    assert not lp.requires_grad and bool((ent > 0).all()) and bool((lp < 0).all())
