"""Language-model plumbing shared by the policy, the value function and the reward model.

Token tensors use PAD = -1 for padding, an id outside every vocabulary, as the original uses 50259 for GPT-2
(language/encodings.py:56): a sampled token can never be mistaken for padding. Before a forward pass pads become
token 0 and are masked out of attention, and position ids are the exclusive cumsum of the mask
(language/model.py:positions_for, l.265-269), so right-padded queries followed by responses act as contiguous text.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import Tensor, nn

PAD = -1


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"run.device={name!r} but CUDA is not available here; use cpu or auto")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype: bf16 where it is fast by default (CUDA with bf16), float32 elsewhere unless asked."""
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for forward passes; a no-op for float32. Parameters and optimizer state stay fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def load_lm(name: str, device: torch.device | str = "cpu"):
    """(model, tokenizer) for an asset name, a local HF directory or a hub name; dropout off, eval mode, fp32.

    Dropout is switched off in the config (the original builds every forward with do_dropout=False), not by
    remembering .eval(): HF GPT-2 defaults to 0.1.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from lmprefs.assets import MODEL_ASSETS as MODEL_NAMES
    from lmprefs.assets import AssetError, resolve_model

    path = resolve_model(name)
    hf_logging.disable_progress_bar()  # "Loading weights" bars on every load drown the run's own progress
    hf_logging.set_verbosity_error()
    try:
        cfg = AutoConfig.from_pretrained(path)
    except OSError as e:  # a hub name with no hub, or a typo
        raise AssetError(f"model {name!r} is not an asset ({', '.join(MODEL_NAMES)}), a local directory, or a "
                         f"reachable hub model ({str(e).splitlines()[0][:120]})") from None
    for key in list(cfg.to_dict()):
        if ("dropout" in key or "pdrop" in key) and isinstance(getattr(cfg, key, None), float):
            setattr(cfg, key, 0.0)
    model = AutoModelForCausalLM.from_pretrained(path, config=cfg, dtype=torch.float32).to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


def vocab_size(tokenizer) -> int:
    """Real vocabulary size: logits beyond it (embedding padding) are never sampled."""
    return len(tokenizer)


def max_positions(model) -> int:
    c = model.config
    return int(getattr(c, "n_positions", None) or getattr(c, "max_position_embeddings", 1 << 30))


def hidden_size(model) -> int:
    return int(model.config.hidden_size)


def model_inputs(tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[B, L] tokens with PAD -> (input_ids, attention_mask, position_ids), pads masked and skipped in positions."""
    mask = tokens != PAD
    ids = torch.where(mask, tokens, torch.zeros_like(tokens))
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # exclusive cumsum of the mask
    return ids, mask.long(), positions


def trunk_hidden(model, tokens: Tensor) -> Tensor:
    """Last hidden states [B, L, d] of the model's transformer trunk (no LM head: we apply it only where needed)."""
    ids, mask, positions = model_inputs(tokens)
    out = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return out.last_hidden_state


def lm_head(model) -> nn.Module:
    return model.get_output_embeddings()


class ScalarHead(nn.Module):
    """A linear map d -> 1 (language/model.py:fc_layer). Value heads start at 0; reward heads at N(0, 1/sqrt(d+1))."""

    def __init__(self, d: int, init_std: float):
        super().__init__()
        self.linear = nn.Linear(d, 1)
        with torch.no_grad():
            self.linear.weight.normal_(0.0, init_std) if init_std > 0 else self.linear.weight.zero_()
            self.linear.bias.zero_()

    def forward(self, h: Tensor) -> Tensor:  # [..., d] -> [...]
        return self.linear(h.to(self.linear.weight.dtype)).squeeze(-1)


def response_positions(queries: Tensor, T: int) -> Tensor:
    """[B, T] index of the hidden state that predicts each response token in query+response: the last real query
    token for the first, then Q+t-1. The original reads position Q-1 even when it is a pad (policy.py:121, its
    queries are right-padded), so a pad's output leaks into the first token; here padding is invisible."""
    B, Q = queries.shape
    last = (queries != PAD).long().cumsum(-1).argmax(-1)  # [B] index of the last real query token
    idx = torch.arange(Q - 1, Q + T - 1, device=queries.device).expand(B, T).clone()
    idx[:, 0] = last
    return idx


def response_hidden(model, queries: Tensor, responses: Tensor) -> Tensor:
    """The hidden states [B, T, d] that predict each response token (and carry its value)."""
    h = trunk_hidden(model, torch.cat([queries, responses], dim=1))
    idx = response_positions(queries, responses.shape[1])
    return h.gather(1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))


def response_logits_hidden(model, queries: Tensor, responses: Tensor) -> tuple[Tensor, Tensor]:
    """Run query+response once; (hidden [B, T, d], logits [B, T, V]) at the positions predicting the response.
    The LM head runs only there: most of a sequence is query, and the head is the largest matmul."""
    h = response_hidden(model, queries, responses)
    return h, lm_head(model)(h)


def logprobs_and_entropy(logits: Tensor, tokens: Tensor, temperature: float, vocab: int) -> tuple[Tensor, Tensor]:
    """log pi(token) and the entropy of pi at the sampling temperature, over the real vocabulary; [B, T] each."""
    logp = torch.log_softmax(logits[..., :vocab].float() / temperature, dim=-1)
    lp = logp.gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return lp, entropy


class Policy(nn.Module):
    """The policy LM and its value function (policy.py): a zero-init value head on the same trunk (the original),
    or, with value_model='separate', a second trunk with its own head (the later summarization work).
    With LoRA, `lm` is the shared frozen base and `adapter` / `value_adapter` name this policy's adapters on it.
    """

    def __init__(self, lm, tokenizer, temperature: float, value_lm=None, adapter: str | None = None,
                 value_adapter: str | None = None):  # fmt: skip
        super().__init__()
        self.lm, self.tokenizer, self.temperature = lm, tokenizer, temperature
        self.value_lm, self.adapter, self.value_adapter = value_lm, adapter, value_adapter
        self.value_head = ScalarHead(hidden_size(lm), init_std=0.0)
        self.vocab = vocab_size(tokenizer)

    def forward(self, queries: Tensor, responses: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(logprobs, values, entropy), each [B, T], for responses given queries."""
        from lmprefs.models.lora import using

        with using(self.lm, self.adapter):
            h, logits = response_logits_hidden(self.lm, queries, responses)
        logprobs, entropy = logprobs_and_entropy(logits, responses, self.temperature, self.vocab)
        if self.value_adapter is not None:
            with using(self.lm, self.value_adapter):
                h = response_hidden(self.lm, queries, responses)
        elif self.value_lm is not None:
            h = response_hidden(self.value_lm, queries, responses)
        return logprobs, self.value_head(h), entropy

    def values_from(self, queries: Tensor, responses: Tensor, hidden: Tensor) -> Tensor:
        """Values [B, T] given the policy trunk's hidden states at the response positions (from the sampler);
        a separate value trunk runs its own forward."""
        from lmprefs.models.lora import using

        if self.value_adapter is not None:
            with using(self.lm, self.value_adapter):
                hidden = response_hidden(self.lm, queries, responses)
        elif self.value_lm is not None:
            hidden = response_hidden(self.value_lm, queries, responses)
        return self.value_head(hidden)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The value head and the trunk, or only this policy's adapters when the trunk is a shared LoRA base."""
        from lmprefs.models.lora import lora_modules

        if self.adapter is None:
            return [p for p in self.parameters() if p.requires_grad]
        names = {self.adapter, self.value_adapter} - {None}
        adapters = [m[n] for mod in lora_modules(self.lm) for m in (mod.A, mod.B) for n in names]
        return adapters + list(self.value_head.parameters())


class RewardModel(nn.Module):
    """A trunk plus a scalar head read at the last real token, then reward = gain * r + bias (rewards.py:47-57)."""

    def __init__(self, lm, tokenizer, adapter: str | None = None):
        super().__init__()
        self.lm, self.tokenizer, self.adapter = lm, tokenizer, adapter
        d = hidden_size(lm)
        self.head = ScalarHead(d, init_std=1.0 / (d + 1) ** 0.5)
        self.gain = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, queries: Tensor, responses: Tensor) -> Tensor:
        """Rewards [B] of query+response; responses may end in PAD after truncation."""
        from lmprefs.models.lora import using

        tokens = torch.cat([queries, responses], dim=1)
        with using(self.lm, self.adapter):
            h = trunk_hidden(self.lm, tokens)  # [B, L, d]
        last = (tokens != PAD).long().cumsum(-1).argmax(-1)  # index of the last real token
        r = self.head(h[torch.arange(h.shape[0], device=h.device), last])
        return self.gain * r + self.bias

    def trainable_parameters(self) -> list[nn.Parameter]:
        from lmprefs.models.lora import lora_modules

        extra = [self.gain, self.bias, *self.head.parameters()]
        if self.adapter is None:
            return [p for p in self.lm.parameters() if p.requires_grad] + extra
        return [m[self.adapter] for mod in lora_modules(self.lm) for m in (mod.A, mod.B)] + extra

    def freeze(self) -> RewardModel:
        """Stop training this reward model's own parameters; with LoRA the policy's adapters on the same base
        are left alone."""
        for p in self.trainable_parameters():
            p.requires_grad_(False)
        return self

    @torch.no_grad()
    def set_norm(self, mean: float, std: float, target_mean: float = 0.0, target_std: float = 1.0) -> None:
        """Given the current rewards' mean and std, set gain and bias so they become (target_mean, target_std)
        (rewards.py:set_reward_norm). `mean`/`std` are of rewards computed with the current gain/bias."""
        # raw r has mean (mean - bias)/gain and std std/gain; solve for the new gain/bias
        g, b = float(self.gain), float(self.bias)
        raw_mean, raw_std = (mean - b) / g, std / abs(g)
        new_gain = target_std / raw_std
        self.gain.fill_(new_gain)
        self.bias.fill_(target_mean - new_gain * raw_mean)


# --------------------------------------------------------------------------------------------------------------
# Saving and loading: a standard HF directory plus the head as safetensors and a small JSON


@contextlib.contextmanager
def atomic_dir(out: Path):
    """Yield a temporary sibling to write into; on success it replaces `out`, so readers never see half a model."""
    import os
    import shutil
    import tempfile

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        yield tmp
        old = out.with_name(out.name + ".old")
        if out.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_policy(policy: Policy, out: Path) -> None:
    with atomic_dir(out) as tmp:
        _save_policy(policy, tmp)


def _save_policy(policy: Policy, out: Path) -> None:
    import json

    from safetensors.torch import save_file

    from lmprefs.models.lora import merged_copy

    lm = merged_copy(policy.lm, policy.adapter) if policy.adapter else policy.lm
    lm.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    save_file({k: v.detach().cpu().contiguous() for k, v in policy.value_head.state_dict().items()},
              out / "value_head.safetensors")  # fmt: skip
    if policy.value_adapter is not None:
        merged_copy(policy.lm, policy.value_adapter).save_pretrained(out / "value_model")
    elif policy.value_lm is not None:
        policy.value_lm.save_pretrained(out / "value_model")
    (out / "lmprefs.json").write_text(json.dumps({"kind": "policy", "temperature": policy.temperature}))


def load_policy(path: Path, device: torch.device | str = "cpu", temperature: float | None = None) -> Policy:
    import json

    from safetensors.torch import load_file

    path = Path(path)
    meta = json.loads((path / "lmprefs.json").read_text())
    lm, tok = load_lm(str(path), device)
    value_lm = load_lm(str(path / "value_model"), device)[0] if (path / "value_model").exists() else None
    p = Policy(lm, tok, temperature if temperature is not None else meta["temperature"], value_lm=value_lm)
    p.value_head.load_state_dict(load_file(path / "value_head.safetensors"))
    return p.to(device)


def save_reward_model(rm: RewardModel, out: Path, extra: dict | None = None) -> None:
    with atomic_dir(out) as tmp:
        _save_reward_model(rm, tmp, extra)


def _save_reward_model(rm: RewardModel, out: Path, extra: dict | None) -> None:
    import json

    from safetensors.torch import save_file

    from lmprefs.models.lora import merged_copy

    (merged_copy(rm.lm, rm.adapter) if rm.adapter else rm.lm).save_pretrained(out)
    rm.tokenizer.save_pretrained(out)
    tensors = {f"head.{k}": v for k, v in rm.head.state_dict().items()}
    tensors |= {"gain": rm.gain.detach(), "bias": rm.bias.detach()}
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, out / "reward_head.safetensors")
    (out / "lmprefs.json").write_text(json.dumps({"kind": "reward_model", **(extra or {})}, indent=1))


def load_reward_model(path: Path, device: torch.device | str = "cpu") -> RewardModel:
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "reward_head.safetensors").exists():
        raise FileNotFoundError(f"{path} is not a reward-model directory (no reward_head.safetensors)")
    lm, tok = load_lm(str(path), device)
    rm = RewardModel(lm, tok)
    t = load_file(path / "reward_head.safetensors")
    rm.head.load_state_dict({k[5:]: v for k, v in t.items() if k.startswith("head.")})
    with torch.no_grad():
        rm.gain.copy_(t["gain"])
        rm.bias.copy_(t["bias"])
    return rm.to(device)
