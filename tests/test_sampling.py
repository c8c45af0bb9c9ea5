from types import SimpleNamespace

import torch
from torch import nn

from lmprefs.models.lm import PAD, logprobs_and_entropy, response_logits_hidden
from lmprefs.sampling import sample


class NextTokenModel(nn.Module):
    """A fake LM whose next token is always previous + 1 (language/test_sample.py): hidden = one-hot of the input,
    head = a huge logit on (token + 1) mod V. It follows the HF interface the sampler uses."""

    def __init__(self, V: int):
        super().__init__()
        self.V = V
        self.head = nn.Linear(V, V, bias=False)
        with torch.no_grad():
            self.head.weight.copy_(100.0 * torch.roll(torch.eye(V), 1, dims=0))

    @property
    def base_model(self):
        return self

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False):
        h = nn.functional.one_hot(input_ids, self.V).float()
        return SimpleNamespace(last_hidden_state=h, past_key_values=None)


def test_fake_next_token_model_gives_exact_tokens():
    m = NextTokenModel(10)
    q = torch.tensor([[1, 2, 3], [7, PAD, PAD], [PAD, 4, 5]])
    r, lp = sample(m, q, 5, temperature=1.0, vocab=10, generator=torch.Generator().manual_seed(0))
    assert r.tolist() == [[4, 5, 6, 7, 8], [8, 9, 0, 1, 2], [6, 7, 8, 9, 0]]
    assert torch.allclose(lp, torch.zeros_like(lp), atol=1e-6)


def test_logits_beyond_the_real_vocabulary_are_never_sampled():
    m = NextTokenModel(10)
    r, _ = sample(m, torch.tensor([[7]]), 6, temperature=1.0, vocab=9, generator=torch.Generator().manual_seed(0))
    # token 8 -> 9 is outside a 9-token vocabulary, so the sampler must not produce 9
    assert (r < 9).all()


def test_sampler_logprobs_equal_a_full_forward_pass(tiny_lm):
    model, tok = tiny_lm
    a, b = tok(" The house was quiet").input_ids, tok(" Mr. Darcy said that he would").input_ids
    q = torch.tensor([a + [PAD] * (len(b) - len(a)), b])
    gen = torch.Generator().manual_seed(0)
    r, lp = sample(model, q, 8, temperature=0.7, vocab=len(tok), generator=gen)
    assert r.shape == (2, 8) and (r >= 0).all() and (r < len(tok)).all()
    with torch.no_grad():
        _, logits = response_logits_hidden(model, q, r)
        full, _ = logprobs_and_entropy(logits, r, 0.7, len(tok))
    assert torch.allclose(lp, full, atol=1e-5), (lp - full).abs().max()


def test_left_and_right_padded_batches_sample_the_same_tokens(tiny_lm):
    model, tok = tiny_lm
    a, b = tok("It was a truth").input_ids, tok("She smiled at him and").input_ids
    n = max(len(a), len(b))
    right = torch.tensor([a + [PAD] * (n - len(a)), b + [PAD] * (n - len(b))])
    left = torch.tensor([[PAD] * (n - len(a)) + a, [PAD] * (n - len(b)) + b])
    r1, lp1 = sample(model, right, 10, 0.7, len(tok), torch.Generator().manual_seed(3))
    r2, lp2 = sample(model, left, 10, 0.7, len(tok), torch.Generator().manual_seed(3))
    assert r1.equal(r2)
    assert torch.allclose(lp1, lp2, atol=1e-5)
