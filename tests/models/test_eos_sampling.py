"""Sampling that stops at EOS (task.stop_at_eos): rows end at their first stop token, PAD fills the rest, decoding
ends when every row has ended; and the models read padded responses at their real tokens."""

from __future__ import annotations

import copy

import pytest
import torch
from test_sampling import NextTokenModel

from lmprefs.data.tasks import PAD
from lmprefs.models import sampling
from lmprefs.models.policy import Policy
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.sampling import sample

EOS = 50256  # GPT-2's <|endoftext|>


class Counting(NextTokenModel):
    """test_sampling's fake LM (the next token is always previous + 1), counting its forward passes: one prefill,
    then one per decode step."""

    def __init__(self, V: int):
        super().__init__(V)
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return super().forward(*args, **kwargs)


def _padded_queries(tok):
    rows = [tok(t).input_ids for t in ("It was a truth", "She smiled at him and said", "The rain")]
    n = max(map(len, rows)) + 1
    return torch.tensor([r + [PAD] * (n - len(r)) for r in rows[:2]] + [[PAD] * (n - len(rows[2])) + rows[2]])


def test_rows_end_at_their_stop_token_and_decoding_ends_when_all_have():
    m = Counting(10)
    q = torch.tensor([[3], [6], [0]])  # next tokens are previous + 1: row 0 reaches 7 at t=3, row 1 at t=0
    r, lp = sample(m, q, 8, 1.0, 10, torch.Generator().manual_seed(0), cache="dynamic", stop_tokens=(7, 2))
    assert r.tolist() == [[4, 5, 6, 7] + [PAD] * 4, [7] + [PAD] * 7, [1, 2] + [PAD] * 6]
    assert m.calls == 1 + 3  # the prefill, then steps t=1..3; t=4..7 never run
    assert (lp[r == PAD] == 0).all()
    m.calls = 0
    full, _ = sample(m, q, 8, 1.0, 10, torch.Generator().manual_seed(0), cache="dynamic")
    assert m.calls == 8 and (full != PAD).all()  # without stop tokens: the original's fixed length


@pytest.fixture
def forced_eos(monkeypatch):
    """The sampler's LM head with EOS forced for row i at its call i (call 0 draws the first token): row 0 ends at
    its first token, row 1 at its second, row 2 at its third; rows 3 and beyond never end."""
    calls = []
    real = sampling.lm_logits

    def head(model, h):
        logits = real(model, h).clone()
        i = len(calls)
        calls.append(i)
        if i < logits.shape[0]:
            logits[i, EOS] = 1e4
        return logits

    monkeypatch.setattr(sampling, "lm_logits", head)
    return calls


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_tiny_gpt2_stops_at_eos_with_either_cache(tiny_lm, forced_eos, cache):
    model, tok = tiny_lm
    q = _padded_queries(tok)  # 3 rows
    kw = dict(return_hidden=True, cache=cache)
    r, lp, h = sample(model, q, 10, 0.7, len(tok), torch.Generator().manual_seed(1), stop_tokens=(EOS,), **kw)
    assert len(forced_eos) == 3  # the first draw, then two decode steps: every row had ended
    forced_eos.clear()
    r0, lp0, h0 = sample(model, q, 10, 0.7, len(tok), torch.Generator().manual_seed(1), **kw)
    assert len(forced_eos) == 10
    assert r.shape == r0.shape == (3, 10) and lp.shape == (3, 10) and h.shape == h0.shape
    for i in range(3):  # row i keeps what the fixed-length sampler drew up to its EOS at index i, then PAD
        assert r[i, i] == EOS and r[i, : i + 1].equal(r0[i, : i + 1]) and (r[i, i + 1 :] == PAD).all()
        assert lp[i, : i + 1].equal(lp0[i, : i + 1]) and (lp[i, i + 1 :] == 0).all()
        assert lp[i, i] > -1e-3  # the forced EOS has probability ~1
    assert h[:, :3].equal(h0[:, :3]) and (h[:, 3:] == 0).all()  # steps 3.. never ran


def test_stop_tokens_that_never_come_change_nothing(tiny_lm):
    """With stop tokens on and no row drawing one, the sampler's output is bitwise the fixed-length sampler's."""
    model, tok = tiny_lm
    q = _padded_queries(tok)
    off = sample(model, q, 12, 0.7, len(tok), torch.Generator().manual_seed(5), True)
    assert not (off[0] == EOS).any()
    on = sample(model, q, 12, 0.7, len(tok), torch.Generator().manual_seed(5), True, stop_tokens=(EOS,))
    for a, b in zip(on, off, strict=True):
        assert a.equal(b)


def test_the_reward_model_and_the_policy_read_the_real_tokens_of_a_padded_response(tiny_lm):
    lm, tok = tiny_lm
    rm = RewardModel(copy.deepcopy(lm), tok, seed=1).eval()
    q = _padded_queries(tok)[:2]
    short = torch.tensor([[11, 22, EOS], [33, 44, EOS]])
    padded = torch.cat([short, torch.full((2, 4), PAD)], dim=1)  # [2, 7]: a response that stopped at EOS
    with torch.no_grad():
        want, got = rm(q, short), rm(q, padded)
        at_the_end = rm(q, torch.cat([short, torch.full((2, 4), 0)], dim=1))  # what reading index T-1 would see
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, at_the_end, atol=1e-3)
    policy = Policy(copy.deepcopy(lm), tok, 0.7).eval()
    with torch.no_grad():
        lp_short, v_short, _ = policy(q, short)
        lp_padded, v_padded, ent = policy(q, padded)
    torch.testing.assert_close(lp_padded[:, :3], lp_short, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_padded[:, :3], v_short, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(lp_padded).all() and torch.isfinite(ent).all()
